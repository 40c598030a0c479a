//! gRPC contracts of GELO, generated from `proto/gelo/v1`.
//!
//! Kept free of model and engine code so the operator and external clients can depend on
//! it cheaply.

#[allow(clippy::all, clippy::too_many_lines)] // generated code
pub mod v1 {
    tonic::include_proto!("gelo.v1");
}

/// Encoded `FileDescriptorSet` of every GELO proto, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("gelo_descriptor");
