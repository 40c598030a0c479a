//! Model and protocol errors as gRPC statuses: the one place they are mapped.

use models::ModelError;
use protocol::EngineError;
use protocol::ProtocolError;
use tonic::Status;

/// The status for a model error: a refused or malformed request is `INVALID_ARGUMENT` with
/// the model's message (a count over a limit reads as `crate::limits::too_large` words it),
/// an engine failure its own code ([`from_protocol`]), anything else `INTERNAL`.
pub fn from_model(e: &ModelError) -> Status {
    match e {
        ModelError::Refused(_)
        | ModelError::InvalidRequest(_)
        | ModelError::ContextTooLong { .. }
        | ModelError::Tokenizer(_)
        | ModelError::Template(_) => Status::invalid_argument(e.to_string()),
        ModelError::Cancelled => Status::cancelled(e.to_string()),
        ModelError::Protocol(p) => from_protocol(p),
        _ => Status::internal(e.to_string()),
    }
}

pub fn from_protocol(e: &ProtocolError) -> Status {
    match e {
        // Never a wrong answer: the request fails, the reason says why.
        ProtocolError::Integrity(v) => Status::data_loss(format!("GPU integrity check failed, request aborted: {v}")),
        ProtocolError::Engine(EngineError::DeviceLost(m)) => Status::unavailable(format!("engine device lost: {m}")),
        ProtocolError::Engine(EngineError::OutOfMemory(m)) => {
            Status::resource_exhausted(format!("engine out of memory: {m}"))
        }
        ProtocolError::Engine(EngineError::NoAdapter(m)) => Status::unavailable(format!("no engine adapter: {m}")),
        ProtocolError::Engine(EngineError::Unsupported(what)) => Status::failed_precondition(format!(
            "the engine does not compute {what}: choose another protection or engine"
        )),
        ProtocolError::NonFinite { .. } => Status::internal(format!("numerical failure: {e}")),
        _ => Status::internal(e.to_string()),
    }
}

/// Whether a status means the engine can no longer be trusted or used.
pub fn is_engine_failure(s: &Status) -> bool {
    matches!(s.code(), tonic::Code::DataLoss | tonic::Code::Unavailable)
}

#[cfg(test)]
mod tests {
    use models::{Limit, ModelError, Refusal};
    use tonic::Code;

    use super::from_model;
    use crate::limits::too_large;

    #[test]
    fn a_refused_request_is_invalid_argument_with_the_models_message() {
        let over = ModelError::from(Refusal::TooLarge { what: Limit::StopStrings, got: 17, limit: 16 });
        let (s, want) = (from_model(&over), too_large("stop strings", 17, 16));
        assert_eq!((s.code(), s.message()), (want.code(), want.message()));
        let s = from_model(&ModelError::from(Refusal::UnknownRole { index: 1 }));
        assert_eq!(
            (s.code(), s.message()),
            (Code::InvalidArgument, "messages[1].role must be system, user or assistant")
        );
        let s = from_model(&ModelError::Config("bad".into()));
        assert_eq!(s.code(), Code::Internal);
        assert_eq!(from_model(&ModelError::Cancelled).code(), Code::Cancelled);
        let unsupported =
            ModelError::Protocol(protocol::ProtocolError::Engine(protocol::EngineError::Unsupported("ring products")));
        assert_eq!(from_model(&unsupported).code(), Code::FailedPrecondition);
    }
}
