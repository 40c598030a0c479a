//! The crate's one error type.
//!
//! Messages never carry document text, titles, metadata or ids: the gateway logs these errors
//! and maps them to gRPC statuses, and both may leave the confidential VM. Inputs are named
//! by their position in the call instead ("document 3, chunk 7").

use std::fmt;
use std::path::PathBuf;

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// Which kind of stored record failed to authenticate or decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordKind {
    /// The store's encrypted configuration (dimension), also the key check.
    Config,
    /// A document record: id, title, metadata, where its chunks are.
    Document,
    /// A chunk's embedding.
    ChunkVector,
    /// A chunk's text.
    ChunkText,
    /// The database file itself (a redb page checksum or structure check failed).
    File,
}

impl fmt::Display for RecordKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RecordKind::Config => "config",
            RecordKind::Document => "document",
            RecordKind::ChunkVector => "chunk vector",
            RecordKind::ChunkText => "chunk text",
            RecordKind::File => "database file",
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("store I/O: {0}")]
    Io(#[from] std::io::Error),
    /// The file system is out of space (or the file at its size limit): the write that
    /// failed stored nothing; what was committed before it is intact.
    #[error("the store's disk is full; nothing of this write was stored: {0}")]
    DiskFull(std::io::Error),
    /// redb failed for a reason other than corruption (file locked by another process,
    /// transaction errors, ...).
    #[error("store database: {0}")]
    Db(redb::Error),
    /// The sealing key is not the one this store was created with.
    #[error("the sealing key does not open this store (it was created under a different key)")]
    WrongKey,
    /// A record failed authentication (tampered, swapped, truncated) or does not decode; or
    /// the database file failed redb's integrity check.
    #[error("corrupt {kind} record: {reason}")]
    Corrupt { kind: RecordKind, reason: String },
    #[error("vector dimension {got} does not match the store's dimension {expected}")]
    DimensionMismatch { expected: usize, got: usize },
    #[error("invalid input: {0}")]
    InvalidInput(String),
    #[error("sealing key file {path}: {reason}")]
    KeyFile { path: PathBuf, reason: String },
    /// The file was written by a newer (or unknown) version of this crate.
    #[error("unsupported store format version {0}")]
    UnsupportedFormat(u32),
    /// An earlier panic while the in-memory index was being updated left it unusable;
    /// reopen the store to rebuild it from disk.
    #[error("in-memory index poisoned by an earlier panic; reopen the store")]
    Poisoned,
}

impl StoreError {
    pub(crate) fn corrupt(kind: RecordKind, reason: impl Into<String>) -> Self {
        StoreError::Corrupt { kind, reason: reason.into() }
    }

    pub(crate) fn invalid(reason: impl Into<String>) -> Self {
        StoreError::InvalidInput(reason.into())
    }
}

/// Every redb error funnels through `redb::Error`, so that a file that fails redb's own
/// checks is reported as `Corrupt` like a record that fails ours, and I/O stays `Io`.
impl From<redb::Error> for StoreError {
    fn from(err: redb::Error) -> Self {
        match err {
            redb::Error::Corrupted(reason) => StoreError::corrupt(RecordKind::File, reason),
            // redb reports a file that is not a redb database (bad magic, impossible header
            // fields) as I/O "invalid data": to us that is a corrupt file, not a disk failure.
            redb::Error::Io(io) if io.kind() == std::io::ErrorKind::InvalidData => {
                StoreError::corrupt(RecordKind::File, io.to_string())
            }
            // A read past the file's end: the file is shorter than its own pages say (cut).
            redb::Error::Io(io) if io.kind() == std::io::ErrorKind::UnexpectedEof => {
                StoreError::corrupt(RecordKind::File, format!("truncated: {io}"))
            }
            redb::Error::Io(io) if is_disk_full(&io) => StoreError::DiskFull(io),
            redb::Error::Io(io) => StoreError::Io(io),
            other => StoreError::Db(other),
        }
    }
}

/// ENOSPC, or EFBIG past a file-size limit (`RLIMIT_FSIZE`, a quota): no room to write.
fn is_disk_full(io: &std::io::Error) -> bool {
    matches!(io.kind(), std::io::ErrorKind::StorageFull | std::io::ErrorKind::FileTooLarge)
        || matches!(io.raw_os_error(), Some(28 | 27))
}

macro_rules! from_redb {
    ($($t:ty),*) => {$(
        impl From<$t> for StoreError {
            fn from(err: $t) -> Self {
                StoreError::from(redb::Error::from(err))
            }
        }
    )*};
}

from_redb!(redb::DatabaseError, redb::TransactionError, redb::TableError, redb::StorageError, redb::CommitError);
