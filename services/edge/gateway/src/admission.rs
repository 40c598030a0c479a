//! Admission: how many model requests (ingest, search, query; embeddings, chat, rerank,
//! documents over HTTP) the gateway serves at once, both front doors together. One more is
//! refused at once — gRPC `RESOURCE_EXHAUSTED` with a `retry-after` metadata entry, HTTP 429
//! with `Retry-After` — instead of queueing behind the others until the client's deadline
//! passes: a full gateway answers in microseconds, and what it admitted still finishes in
//! the time it would have alone.
//!
//! A permit lives as long as its request: a streamed answer holds it until its last event
//! is sent (or its client goes away). Over HTTP the request's body is read first, within
//! [`Admission::body_timeout`], so a client that sends slowly holds no place. A gRPC
//! `Ingest` stream holds its place while its documents keep coming; one that waits on its
//! client longer than [`Admission::stream_hold`] gives the place back and takes one again
//! when the next document arrives (refused at once if the gateway is full by then), and one
//! whose client sends nothing for [`Admission::message_timeout`] ends.
//!
//! A streamed answer whose client stops reading gives its place back too: its events go
//! out through a bounded [`crate::outbox`], and once the client has taken none of them for
//! [`Admission::send_timeout`] the answer is cancelled (the generation with it) and its
//! [`Place`] released, instead of waiting on the socket for as long as the client likes.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::sync::{OwnedSemaphorePermit, Semaphore, TryAcquireError};

/// Requests served at once by default: what two cores serve without a query waiting long
/// for its first token behind the others (docs/RELIABILITY.md measures it).
pub const DEFAULT_MAX_CONCURRENT: usize = 32;

/// Seconds a refused client is told to wait: about one short answer's time.
pub const RETRY_AFTER_SECONDS: u64 = 1;

/// How long an HTTP client may take to send a model request's body (16 MiB at most).
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a client stream (gRPC `Ingest`) keeps its place while the gateway waits for its
/// next message: a client that streams its documents back to back never waits this long.
pub const DEFAULT_STREAM_HOLD: Duration = Duration::from_secs(1);

/// How long a client stream may go without sending its next message, as long as an HTTP
/// body may take to arrive.
pub const DEFAULT_MESSAGE_TIMEOUT: Duration = DEFAULT_BODY_TIMEOUT;

/// How long a streamed answer waits for its client to take an event before it is cancelled:
/// a client that reads at all takes one far sooner (an event is a token or two), and one
/// that has stopped reading is let go within this much of its buffers filling.
pub const DEFAULT_SEND_TIMEOUT: Duration = DEFAULT_BODY_TIMEOUT;

/// The gateway's admission limit. Cheap to clone; both front doors share one.
#[derive(Clone, Debug)]
pub struct Admission {
    permits: Arc<Semaphore>,
    limit: usize,
    body_timeout: Duration,
    stream_hold: Duration,
    message_timeout: Duration,
    send_timeout: Duration,
}

/// Admitted: the request counts against the limit while this lives.
#[derive(Debug)]
pub struct Admitted(#[allow(dead_code)] OwnedSemaphorePermit);

/// An admitted request's place, shared by whoever may end the request first: the response
/// body (its end or its drop) and a streamed answer's sender (a client that stopped
/// reading). [`Place::release`] gives the place back once, whoever calls it first.
#[derive(Clone, Debug)]
pub struct Place {
    held: Arc<Mutex<Option<Admitted>>>,
    send_timeout: Duration,
}

/// Releases its [`Place`] when dropped (a response body's end).
#[derive(Debug)]
pub struct ReleaseOnDrop(pub Place);

impl Drop for ReleaseOnDrop {
    fn drop(&mut self) {
        self.0.release();
    }
}

impl Place {
    /// `admitted`, whose streamed answer may wait `send_timeout` for its client to read.
    pub fn new(admitted: Admitted, send_timeout: Duration) -> Self {
        Place { held: Arc::new(Mutex::new(Some(admitted))), send_timeout }
    }

    pub fn send_timeout(&self) -> Duration {
        self.send_timeout
    }

    /// Gives the place back (again: nothing).
    pub fn release(&self) {
        let held = self.held.lock().map(|mut p| p.take());
        drop(held);
    }

    pub fn is_held(&self) -> bool {
        self.held.lock().is_ok_and(|p| p.is_some())
    }
}

/// Refused: the gateway already serves `limit` requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Full {
    pub limit: usize,
}

impl Full {
    pub fn message(&self) -> String {
        format!(
            "the gateway is serving its limit of {} requests at once (--max-concurrent-requests); retry in {RETRY_AFTER_SECONDS} s",
            self.limit
        )
    }

    /// The gRPC refusal: `RESOURCE_EXHAUSTED`, with `retry-after` (seconds) in its metadata.
    pub fn status(&self) -> tonic::Status {
        let mut s = tonic::Status::resource_exhausted(self.message());
        s.metadata_mut().insert("retry-after", tonic::metadata::MetadataValue::from(RETRY_AFTER_SECONDS));
        s
    }
}

impl Admission {
    /// At most `limit` requests at once (at least 1).
    pub fn new(limit: usize) -> Self {
        let limit = limit.max(1);
        Admission {
            permits: Arc::new(Semaphore::new(limit)),
            limit,
            body_timeout: DEFAULT_BODY_TIMEOUT,
            stream_hold: DEFAULT_STREAM_HOLD,
            message_timeout: DEFAULT_MESSAGE_TIMEOUT,
            send_timeout: DEFAULT_SEND_TIMEOUT,
        }
    }

    /// How long a streamed answer waits for its client to take its next event; then the
    /// answer is cancelled and its place given back.
    pub fn with_send_timeout(mut self, t: Duration) -> Self {
        self.send_timeout = t;
        self
    }

    pub fn send_timeout(&self) -> Duration {
        self.send_timeout
    }

    /// How long an HTTP client may take to send its request's body; then 408.
    pub fn with_body_timeout(mut self, t: Duration) -> Self {
        self.body_timeout = t;
        self
    }

    pub fn body_timeout(&self) -> Duration {
        self.body_timeout
    }

    /// How long a client stream keeps its place while waiting for its next message, and how
    /// long it may wait in all before it ends (`hold` at most `message`).
    pub fn with_stream_timeouts(mut self, hold: Duration, message: Duration) -> Self {
        self.stream_hold = hold.min(message);
        self.message_timeout = message;
        self
    }

    pub fn stream_hold(&self) -> Duration {
        self.stream_hold
    }

    pub fn message_timeout(&self) -> Duration {
        self.message_timeout
    }

    /// Admits a request now, or refuses it now: never waits.
    pub fn try_admit(&self) -> Result<Admitted, Full> {
        match self.permits.clone().try_acquire_owned() {
            Ok(p) => Ok(Admitted(p)),
            Err(TryAcquireError::NoPermits | TryAcquireError::Closed) => Err(Full { limit: self.limit }),
        }
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Requests being served now.
    pub fn in_flight(&self) -> usize {
        self.limit - self.permits.available_permits()
    }
}

impl Default for Admission {
    fn default() -> Self {
        Admission::new(DEFAULT_MAX_CONCURRENT)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_over_the_limit_is_refused_at_once_and_a_finished_one_frees_its_place() {
        let a = Admission::new(2);
        let first = a.try_admit().unwrap();
        let _second = a.try_admit().unwrap();
        assert_eq!(a.in_flight(), 2);
        let full = a.try_admit().unwrap_err();
        assert_eq!(full, Full { limit: 2 });
        let status = full.status();
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        assert_eq!(status.metadata().get("retry-after").unwrap(), "1");
        assert!(status.message().contains("--max-concurrent-requests"), "{}", status.message());
        drop(first);
        assert!(a.try_admit().is_ok());
        assert_eq!(Admission::new(0).limit(), 1);
    }

    #[test]
    fn a_shared_place_is_given_back_once_by_whoever_releases_it_first() {
        let a = Admission::new(1);
        let place = Place::new(a.try_admit().unwrap(), DEFAULT_SEND_TIMEOUT);
        let other = ReleaseOnDrop(place.clone());
        assert!(a.try_admit().is_err());
        drop(other);
        assert!(!place.is_held());
        assert_eq!(a.in_flight(), 0);
        place.release();
        assert_eq!(a.in_flight(), 0);
    }
}
