//! A streamed answer's way out to its client (gRPC `Query`, an HTTP chat completion's
//! server-sent events): a bounded queue of events with a progress timeout.
//!
//! The transport takes events from the queue only as fast as the client reads them (a full
//! socket on HTTP/1.1, a closed flow-control window on HTTP/2). A client that stops reading
//! would otherwise leave the answer's task waiting on the queue forever, holding its
//! generation on the generator and its admission place. Here the sender waits at most the
//! send timeout for room: then [`Outbox::send`] fails with [`Closed::Stalled`], and the
//! answer's task ends, which cancels the generation and gives the place back. Memory stays
//! bounded meanwhile: [`CAPACITY`] events here, plus the transport's own buffers.
//!
//! The receiving half ([`Inbox`]) ends with the sender's stall error if it is polled again
//! after the stall (the client read again), never as if the answer were whole.

use std::{
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use futures::Stream;
use tokio::sync::mpsc;

/// Events a streamed answer may have queued for its client: each a token or a few, or the
/// passages once; at most a few hundred kilobytes.
pub const CAPACITY: usize = 32;

/// Why an answer can send no more.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Closed {
    /// The client went away (the transport dropped the answer).
    Gone,
    /// The client took nothing from the full queue for this long.
    Stalled(Duration),
}

impl Closed {
    pub fn message(&self) -> String {
        match self {
            Closed::Gone => "the client went away".into(),
            Closed::Stalled(t) => format!("the client read nothing of the streamed answer for {t:?}; it was cancelled"),
        }
    }
}

/// The sending half. Dropping it ends the stream.
pub struct Outbox<T> {
    tx: mpsc::Sender<T>,
    timeout: Duration,
    stalled: Arc<AtomicBool>,
}

/// The receiving half: a stream of the events, then the end, or the stall's item.
pub struct Inbox<T> {
    rx: mpsc::Receiver<T>,
    stalled: Arc<AtomicBool>,
    on_stall: Option<Box<dyn FnOnce() -> T + Send>>,
}

/// A queue of [`CAPACITY`] events whose sender waits at most `timeout` for room. After a
/// stall the receiver yields `on_stall()` once, then ends.
pub fn outbox<T>(timeout: Duration, on_stall: impl FnOnce() -> T + Send + 'static) -> (Outbox<T>, Inbox<T>) {
    let (tx, rx) = mpsc::channel(CAPACITY);
    let stalled = Arc::new(AtomicBool::new(false));
    (Outbox { tx, timeout, stalled: stalled.clone() }, Inbox { rx, stalled, on_stall: Some(Box::new(on_stall)) })
}

impl<T> Outbox<T> {
    /// Queues `item`, waiting at most the timeout for room.
    pub async fn send(&self, item: T) -> Result<(), Closed> {
        match tokio::time::timeout(self.timeout, self.tx.send(item)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(Closed::Gone),
            Err(_) => {
                self.stalled.store(true, Ordering::Release);
                Err(Closed::Stalled(self.timeout))
            }
        }
    }
}

impl<T> Stream for Inbox<T> {
    type Item = T;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        if self.stalled.load(Ordering::Acquire) {
            // What is still queued is of an answer already cancelled: not sent.
            self.rx.close();
            return Poll::Ready(self.on_stall.take().map(|f| f()));
        }
        self.rx.poll_recv(cx)
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;

    use super::*;

    #[tokio::test]
    async fn a_reader_gets_every_event_and_a_stalled_one_gets_the_error_not_the_rest() {
        let (tx, mut rx) = outbox::<Result<u32, &str>>(Duration::from_millis(50), || Err("stalled"));
        for i in 0..3 {
            tx.send(Ok(i)).await.unwrap();
        }
        assert_eq!(rx.next().await, Some(Ok(0)));
        for i in 3..=CAPACITY as u32 {
            tx.send(Ok(i)).await.unwrap();
        }
        // Full, and nobody reads: the send gives up after the timeout.
        let t = std::time::Instant::now();
        assert_eq!(tx.send(Ok(99)).await, Err(Closed::Stalled(Duration::from_millis(50))));
        assert!(t.elapsed() >= Duration::from_millis(50));
        assert_eq!(rx.next().await, Some(Err("stalled")));
        assert_eq!(rx.next().await, None);

        let (tx, rx) = outbox::<u32>(Duration::from_secs(5), || 0);
        drop(rx);
        assert_eq!(tx.send(1).await, Err(Closed::Gone));
    }
}
