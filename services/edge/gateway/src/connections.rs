//! Limits on the connections of the gateway's two front doors, the plain-HTTP port
//! ([`crate::http::serve`]) and the RA-TLS port (gRPC and the HTTP API beside it,
//! [`serve_attested`]):
//!
//! - **how many at once** ([`ConnectionLimits::max_connections`], `--max-connections`, per
//!   port): one more is refused at once, answered `503` with `Retry-After` on the plain port,
//!   closed before its TLS handshake on the RA-TLS port (nothing can be written to it there
//!   before a handshake the gateway would have to spend its CPU on);
//! - **the request head's time**: each request's head must arrive within the head timeout of
//!   the connection's start (its TLS handshake included) or of the end of the requests before
//!   it, so a connection that sends nothing, trickles its head or idles is closed;
//! - **the request head's size** ([`MAX_HEAD_BYTES`]): a larger head is refused (HTTP/1.1
//!   `431`, HTTP/2 a stream or connection error);
//! - **writes that make no progress** (the plain port; [`ConnectionLimits::write_timeout`]):
//!   a client whose socket takes nothing for that long loses the connection, whatever the
//!   gateway was sending. A streamed answer's own send timeout ([`crate::outbox`]) frees its
//!   generation and admission place on both ports.

use std::{
    collections::HashMap,
    future::Future,
    io,
    net::SocketAddr,
    pin::Pin,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    task::{Context, Poll, Waker},
    time::Duration,
};

use axum::{
    extract::{Request, State},
    middleware::{Next, from_fn_with_state},
    response::Response,
};
use hyper::body::{Frame, SizeHint};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::{TcpListener, TcpStream},
    sync::{OwnedSemaphorePermit, Semaphore},
    time::{Instant, Sleep},
};
use tonic::{
    service::Routes,
    transport::server::{Connected, TcpConnectInfo, TlsConnectInfo},
};

/// Connections open at once on each port by default: far more than the requests the gateway
/// admits at once (32) and a browser opens (6 per origin), few enough that a flood of them is
/// refused long before the process runs out of descriptors (1,024 by default).
pub const DEFAULT_MAX_CONNECTIONS: usize = 256;

/// The largest request head (request line or pseudo-headers, and headers), both ports.
pub const MAX_HEAD_BYTES: usize = 64 << 10;

/// How long a request's head may take, both ports.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a write may wait for the client to take anything (the plain port).
pub const WRITE_TIMEOUT: Duration = crate::admission::DEFAULT_SEND_TIMEOUT;

/// A port's connection limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Connections open at once (at least 1).
    pub max_connections: usize,
    /// How long each request's head may take to arrive (see the module's text).
    pub header_timeout: Duration,
    /// How long a write may make no progress before the connection is closed.
    pub write_timeout: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            header_timeout: HEADER_READ_TIMEOUT,
            write_timeout: WRITE_TIMEOUT,
        }
    }
}

/// The places of a port's connections.
#[derive(Clone, Debug)]
pub(crate) struct Slots(Arc<Semaphore>);

impl Slots {
    pub(crate) fn new(max: usize) -> Self {
        Slots(Arc::new(Semaphore::new(max.max(1))))
    }

    /// A place now, or `None` when the port is full.
    pub(crate) fn try_take(&self) -> Option<OwnedSemaphorePermit> {
        self.0.clone().try_acquire_owned().ok()
    }
}

/// What the connection's requests tell its reader: how many are being served, and since
/// when none has been.
#[derive(Debug)]
struct Activity {
    active: AtomicUsize,
    idle_since: Mutex<Instant>,
    reader: Mutex<Option<Waker>>,
}

impl Activity {
    /// A connection accepted at `accepted`: its first head is due a head timeout later.
    fn new(accepted: Instant) -> Self {
        Activity { active: AtomicUsize::new(0), idle_since: Mutex::new(accepted), reader: Mutex::new(None) }
    }

    /// When the connection must have sent its next request head; `None` while one is served.
    fn deadline(&self, timeout: Duration) -> Option<Instant> {
        if self.active.load(Ordering::Acquire) > 0 {
            return None;
        }
        self.idle_since.lock().ok().map(|t| *t + timeout)
    }

    fn started(self: &Arc<Self>) -> Busy {
        self.active.fetch_add(1, Ordering::AcqRel);
        Busy(self.clone())
    }
}

/// A request being served on a connection; its drop (the response's end) may leave the
/// connection idle, which restarts its head timer.
struct Busy(Arc<Activity>);

impl Drop for Busy {
    fn drop(&mut self) {
        if self.0.active.fetch_sub(1, Ordering::AcqRel) == 1 {
            if let Ok(mut t) = self.0.idle_since.lock() {
                *t = Instant::now();
            }
            // The reader arms its timer at the next poll.
            if let Some(w) = self.0.reader.lock().ok().and_then(|mut w| w.take()) {
                w.wake();
            }
        }
    }
}

/// A connection under the port's limits: it holds its place while open, and fails its
/// reads once no request head came within the head timeout (with `activity`) and its
/// writes once the client took nothing for the write timeout.
pub struct Limited<IO> {
    io: IO,
    _slot: OwnedSemaphorePermit,
    limits: ConnectionLimits,
    write_stall: Option<Pin<Box<Sleep>>>,
    activity: Option<(Arc<Activity>, Pin<Box<Sleep>>)>,
    /// Where the RA-TLS port's requests find `activity`, and this connection's key in it.
    registry: Option<(Registry, SocketAddr)>,
}

impl<IO> Limited<IO> {
    /// `io` holding `slot`, its writes time-limited (its request heads are the HTTP
    /// server's to time).
    pub(crate) fn new(io: IO, slot: OwnedSemaphorePermit, limits: ConnectionLimits) -> Self {
        Limited { io, _slot: slot, limits, write_stall: None, activity: None, registry: None }
    }
}

impl<IO> Drop for Limited<IO> {
    fn drop(&mut self) {
        if let Some((registry, addr)) = &self.registry
            && let Ok(mut map) = registry.0.lock()
        {
            map.remove(addr);
        }
    }
}

fn timed_out(what: &str, after: Duration) -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, format!("{what} within {after:?}"))
}

impl<IO: AsyncRead + Unpin> AsyncRead for Limited<IO> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let read = Pin::new(&mut this.io).poll_read(cx, buf);
        if read.is_ready() {
            return read;
        }
        let Some((activity, timer)) = &mut this.activity else {
            return read;
        };
        if let Ok(mut w) = activity.reader.lock() {
            *w = Some(cx.waker().clone());
        }
        if let Some(deadline) = activity.deadline(this.limits.header_timeout) {
            if timer.deadline() != deadline {
                timer.as_mut().reset(deadline);
            }
            if timer.as_mut().poll(cx).is_ready() && activity.deadline(this.limits.header_timeout).is_some() {
                return Poll::Ready(Err(timed_out("no request head", this.limits.header_timeout)));
            }
        }
        Poll::Pending
    }
}

impl<IO: AsyncWrite + Unpin> Limited<IO> {
    /// `Pending` from a write: fails once the write has waited the write timeout.
    fn stalled<T>(&mut self, cx: &mut Context<'_>, outcome: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        if outcome.is_ready() {
            self.write_stall = None;
            return outcome;
        }
        let limit = self.limits.write_timeout;
        let timer = self.write_stall.get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        if timer.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Err(timed_out("the client took nothing written to it", limit)));
        }
        Poll::Pending
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Limited<IO> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let outcome = Pin::new(&mut this.io).poll_write(cx, buf);
        this.stalled(cx, outcome)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let outcome = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.stalled(cx, outcome)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let outcome = Pin::new(&mut this.io).poll_flush(cx);
        this.stalled(cx, outcome)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// A connection of the RA-TLS port.
pub type AttestedConnection = Limited<tokio_rustls::server::TlsStream<TcpStream>>;

/// The RA-TLS port's connections, so their requests are what they say: tonic hands each
/// request the peer's TLS details, as for a bare TLS stream (client certificates included).
impl Connected for AttestedConnection {
    type ConnectInfo = TlsConnectInfo<TcpConnectInfo>;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

/// The RA-TLS port's open connections by the client's address, for their requests to mark
/// them busy.
#[derive(Clone, Debug, Default)]
pub(crate) struct Registry(Arc<Mutex<HashMap<SocketAddr, Arc<Activity>>>>);

impl Registry {
    fn find(&self, addr: SocketAddr) -> Option<Arc<Activity>> {
        self.0.lock().ok()?.get(&addr).cloned()
    }
}

/// The RA-TLS port's connections under `limits`: each takes a place before its handshake
/// (no place: closed at once), its handshake and every request head within the head
/// timeout. Failed and timed-out handshakes are logged and dropped.
fn attested_connections(
    listener: TcpListener,
    config: Arc<rustls::ServerConfig>,
    limits: ConnectionLimits,
    registry: Registry,
) -> impl tokio_stream::Stream<Item = io::Result<AttestedConnection>> + Send + 'static {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    let slots = Slots::new(limits.max_connections);
    tokio::spawn(async move {
        loop {
            let (tcp, peer) = tokio::select! {
                () = tx.closed() => break,
                accepted = listener.accept() => match accepted {
                    Ok(conn) => conn,
                    Err(e) => {
                        tracing::warn!(error = %e, "RA-TLS accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
            };
            let Some(slot) = slots.try_take() else {
                tracing::warn!(%peer, limit = limits.max_connections, "RA-TLS connection refused: the port is full");
                drop(tcp);
                continue;
            };
            let accepted = Instant::now();
            let _ = tcp.set_nodelay(true);
            let (acceptor, tx, registry) = (acceptor.clone(), tx.clone(), registry.clone());
            tokio::spawn(async move {
                let due = accepted + limits.header_timeout;
                let tls = match tokio::time::timeout_at(due, acceptor.accept(tcp)).await {
                    Ok(Ok(tls)) => tls,
                    Ok(Err(e)) => return tracing::warn!(%peer, error = %e, "RA-TLS handshake failed"),
                    Err(_) => return tracing::warn!(%peer, "RA-TLS handshake timed out"),
                };
                let activity = Arc::new(Activity::new(accepted));
                let timer = Box::pin(tokio::time::sleep_until(due));
                if let Ok(mut map) = registry.0.lock() {
                    map.insert(peer, activity.clone());
                }
                let conn = Limited {
                    io: tls,
                    _slot: slot,
                    limits,
                    write_stall: None,
                    activity: Some((activity, timer)),
                    registry: Some((registry, peer)),
                };
                let _ = tx.send(Ok(conn)).await;
            });
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

/// Marks the request's connection busy until its response's last frame (a streamed answer's
/// trailers included).
async fn track(State(registry): State<Registry>, req: Request, next: Next) -> Response {
    let peer = req.extensions().get::<TlsConnectInfo<TcpConnectInfo>>().and_then(|i| i.get_ref().remote_addr());
    let Some(activity) = peer.and_then(|p| registry.find(p)) else {
        return next.run(req).await;
    };
    let busy = activity.started();
    let (parts, body) = next.run(req).await.into_parts();
    Response::from_parts(parts, axum::body::Body::new(Tracked { body, _busy: busy }))
}

/// A response body that keeps its connection busy while it lives.
struct Tracked {
    body: axum::body::Body,
    _busy: Busy,
}

impl hyper::body::Body for Tracked {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// The RA-TLS port under `limits`: its connections from `listener` (TLS with `config`), and
/// `routes` marking each request's connection busy, for [`server::serve::serve_incoming`]
/// (which adds health, reflection and `Attestation.GetEvidence` for `identity`).
pub fn attested(
    listener: TcpListener,
    config: Arc<rustls::ServerConfig>,
    limits: ConnectionLimits,
    routes: Routes,
    identity: Arc<attest::ServerIdentity>,
) -> (Routes, server::serve::Incoming<impl tokio_stream::Stream<Item = io::Result<AttestedConnection>> + Send + 'static>)
{
    let registry = Registry::default();
    let routes = Routes::from(routes.into_axum_router().layer(from_fn_with_state(registry.clone(), track)));
    let incoming = server::serve::Incoming {
        connections: attested_connections(listener, config, limits, registry),
        identity: Some(identity),
        max_header_list_size: Some(MAX_HEAD_BYTES as u32),
    };
    (routes, incoming)
}
