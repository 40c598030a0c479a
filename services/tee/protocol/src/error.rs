use tensor::WeightId;

use crate::EngineError;

use crate::verify::IntegrityViolation;

/// Everything the TEE side of the protocol can refuse or detect.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProtocolError {
    #[error("engine: {0}")]
    Engine(#[from] EngineError),
    #[error("unknown weight `{0}`")]
    UnknownWeight(WeightId),
    #[error("weight `{0}` is already provisioned")]
    DuplicateWeight(WeightId),
    #[error("shape mismatch in {op}: {detail}")]
    Shape { op: &'static str, detail: String },
    #[error("{op} got a NaN or infinite input")]
    NonFinite { op: &'static str },
    #[error("a forward pass needs at least one sequence with at least one row")]
    EmptyPass,
    #[error("integrity check failed: {0}")]
    Integrity(IntegrityViolation),
    #[error("invalid configuration: {0}")]
    Config(String),
}

pub type Result<T, E = ProtocolError> = std::result::Result<T, E>;
