//! The crate's one error type, and the one place it becomes a gRPC status.
//!
//! Messages name roles, endpoints, positions and reasons — never document text, titles,
//! questions or answers: they are logged, and they travel back to clients.

use std::path::PathBuf;

use tonic::{Code, Status};

use attest::Role;

pub type Result<T, E = GatewayError> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// Fail closed: no backend of this role is verified right now.
    #[error("no verified {role} backend: {reason}")]
    NoBackend { role: Role, reason: String },
    /// A verified backend refused or failed a request.
    #[error("{role} {endpoint}: {status}", status = .status.message())]
    Backend { role: Role, endpoint: String, status: Status },
    /// The generator's stream broke after the answer had started; the answer is incomplete.
    #[error("{role} {endpoint} failed during the answer ({reason}); retry the query")]
    BrokenStream { role: Role, endpoint: String, reason: String },
    /// A backend took longer than the call timeout (stalled, or far behind): the call is
    /// abandoned and the backend leaves the rotation until it verifies again.
    #[error("{role} {endpoint} did not answer within {after:?}; it leaves the rotation until it verifies again")]
    Timeout { role: Role, endpoint: String, after: std::time::Duration },
    /// A backend's stream sent nothing for the call timeout after it had started (a
    /// generator stopped mid-answer): the answer is incomplete, the call is abandoned and the
    /// backend leaves the rotation until it verifies again.
    #[error(
        "{role} {endpoint} stopped answering: nothing for {after:?} after the answer had started; it leaves the rotation until it verifies again; retry the query"
    )]
    Stalled { role: Role, endpoint: String, after: std::time::Duration },
    /// The client sent nothing of a request it had started (an ingest stream's next
    /// document) within the time it is given.
    #[error("the client sent no {what} within {after:?}")]
    ClientTimeout { what: &'static str, after: std::time::Duration },
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// A request or document over a configured limit.
    #[error("{what}: {got} exceeds the limit of {limit}")]
    TooLarge { what: String, got: usize, limit: usize },
    #[error("document store: {0}")]
    Store(#[from] store::StoreError),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// The embedder returned vectors of another dimension than the store holds.
    #[error(
        "the embedder returns {got}-dimensional vectors but the store holds {expected}: a different embedding model than the one that built the store"
    )]
    DimensionMismatch { expected: usize, got: usize },
    #[error("routing table: {0}")]
    Routes(String),
    #[error("configuration: {0}")]
    Config(String),
    #[error("{path}: {source}")]
    File { path: PathBuf, source: std::io::Error },
    #[error("attestation: {0}")]
    Attest(#[from] attest::AttestError),
    #[error("serving: {0}")]
    Serve(String),
    #[error("internal: {0}")]
    Internal(String),
}

impl GatewayError {
    pub fn file(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| GatewayError::File { path, source }
    }

    pub fn invalid(msg: impl Into<String>) -> Self {
        GatewayError::InvalidRequest(msg.into())
    }

    /// The gRPC code clients see.
    pub fn code(&self) -> Code {
        match self {
            GatewayError::NoBackend { .. } | GatewayError::BrokenStream { .. } => Code::Unavailable,
            // A backend's verdict on the request itself (too long, bad parameters, busy)
            // reaches the client as is; anything else from a backend is the backend's fault.
            GatewayError::Backend { status, .. } => match status.code() {
                c @ (Code::InvalidArgument | Code::ResourceExhausted | Code::DeadlineExceeded | Code::Cancelled) => c,
                Code::DataLoss => Code::DataLoss,
                _ => Code::Unavailable,
            },
            GatewayError::Timeout { .. } | GatewayError::Stalled { .. } | GatewayError::ClientTimeout { .. } => {
                Code::DeadlineExceeded
            }
            GatewayError::InvalidRequest(_) | GatewayError::TooLarge { .. } => Code::InvalidArgument,
            GatewayError::Store(e) => match e {
                store::StoreError::InvalidInput(_) => Code::InvalidArgument,
                store::StoreError::DimensionMismatch { .. } => Code::FailedPrecondition,
                store::StoreError::Corrupt { .. } | store::StoreError::WrongKey => Code::DataLoss,
                // gRPC's own meaning of the code: "the entire file system is out of space".
                store::StoreError::DiskFull(_) => Code::ResourceExhausted,
                _ => Code::Internal,
            },
            GatewayError::DimensionMismatch { .. } => Code::FailedPrecondition,
            GatewayError::Tokenizer(_) => Code::InvalidArgument,
            GatewayError::Routes(_)
            | GatewayError::Config(_)
            | GatewayError::File { .. }
            | GatewayError::Attest(_)
            | GatewayError::Serve(_)
            | GatewayError::Internal(_) => Code::Internal,
        }
    }

    /// A stable machine name, for log fields and metric labels.
    pub fn kind(&self) -> &'static str {
        match self {
            GatewayError::NoBackend { .. } => "no_backend",
            GatewayError::Backend { .. } => "backend",
            GatewayError::BrokenStream { .. } => "broken_stream",
            GatewayError::Timeout { .. } => "timeout",
            GatewayError::Stalled { .. } => "stalled",
            GatewayError::ClientTimeout { .. } => "client_timeout",
            GatewayError::InvalidRequest(_) => "invalid_request",
            GatewayError::TooLarge { .. } => "too_large",
            GatewayError::Store(_) => "store",
            GatewayError::Tokenizer(_) => "tokenizer",
            GatewayError::DimensionMismatch { .. } => "dimension_mismatch",
            GatewayError::Routes(_) => "routes",
            GatewayError::Config(_) => "config",
            GatewayError::File { .. } => "file",
            GatewayError::Attest(_) => "attest",
            GatewayError::Serve(_) => "serve",
            GatewayError::Internal(_) => "internal",
        }
    }
}

impl From<GatewayError> for Status {
    fn from(e: GatewayError) -> Status {
        Status::new(e.code(), e.to_string())
    }
}

impl From<tokio::task::JoinError> for GatewayError {
    fn from(e: tokio::task::JoinError) -> Self {
        GatewayError::Internal(format!("worker task failed: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fail_closed_is_unavailable_and_names_the_role_and_reason() {
        let s: Status =
            GatewayError::NoBackend { role: Role::Generator, reason: "127.0.0.1:1: measurement_not_allowed".into() }
                .into();
        assert_eq!(s.code(), Code::Unavailable);
        assert!(s.message().contains("generator"), "{}", s.message());
        assert!(s.message().contains("measurement_not_allowed"), "{}", s.message());
    }

    #[test]
    fn backend_request_errors_pass_through_and_faults_become_unavailable() {
        let e = |status| GatewayError::Backend { role: Role::Embedder, endpoint: "e:1".into(), status };
        assert_eq!(e(Status::invalid_argument("too long")).code(), Code::InvalidArgument);
        assert_eq!(e(Status::resource_exhausted("queue full")).code(), Code::ResourceExhausted);
        assert_eq!(e(Status::internal("boom")).code(), Code::Unavailable);
        assert_eq!(e(Status::data_loss("integrity")).code(), Code::DataLoss);
        let s: Status = e(Status::invalid_argument("texts[0] tokens: 600 exceeds the limit of 512")).into();
        assert!(s.message().starts_with("embedder e:1: texts[0]"), "{}", s.message());
    }
}
