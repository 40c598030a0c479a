//! Model and protocol errors as gRPC statuses: the one place they are mapped.

use models::ModelError;
use protocol::EngineError;
use protocol::ProtocolError;
use tonic::Status;

pub fn from_model(e: &ModelError) -> Status {
    match e {
        ModelError::InvalidRequest(_)
        | ModelError::ContextTooLong { .. }
        | ModelError::Tokenizer(_)
        | ModelError::Template(_) => Status::invalid_argument(e.to_string()),
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
        ProtocolError::NonFinite { .. } => Status::internal(format!("numerical failure: {e}")),
        _ => Status::internal(e.to_string()),
    }
}

/// Whether a status means the engine can no longer be trusted or used.
pub fn is_engine_failure(s: &Status) -> bool {
    matches!(s.code(), tonic::Code::DataLoss | tonic::Code::Unavailable)
}
