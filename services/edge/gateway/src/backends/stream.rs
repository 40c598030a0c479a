//! A backend's server stream once it has started (a generation after its first token). Each
//! next message must come within the call timeout, as the first one had to: a generator
//! stopped mid-answer (SIGSTOP, a hung host, a link that never resets) would otherwise keep
//! its caller, and the caller's admission place, until the client gave up.

use std::time::Duration;

use tonic::Status;

/// The rest of a started stream: [`BackendStream::message`] waits at most `stall` for each
/// message. Dropping it cancels the call on the backend.
pub struct BackendStream<T> {
    inner: tonic::Streaming<T>,
    stall: Duration,
}

/// Why a started stream ended early; [`super::Routed::broken`] makes it the caller's error.
#[derive(Debug)]
pub enum StreamError {
    /// The backend failed the call or the connection broke.
    Status(Status),
    /// No message came within this long: the backend stalled mid-stream.
    Stalled(Duration),
}

impl From<Status> for StreamError {
    fn from(s: Status) -> Self {
        StreamError::Status(s)
    }
}

impl<T> BackendStream<T> {
    pub(super) fn new(inner: tonic::Streaming<T>, stall: Duration) -> Self {
        BackendStream { inner, stall }
    }

    /// The next message, `None` at the stream's end.
    pub async fn message(&mut self) -> Result<Option<T>, StreamError> {
        match tokio::time::timeout(self.stall, self.inner.message()).await {
            Ok(next) => Ok(next?),
            Err(_) => Err(StreamError::Stalled(self.stall)),
        }
    }
}
