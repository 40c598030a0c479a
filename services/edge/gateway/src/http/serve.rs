//! The HTTP port's connections. HTTP/1.1 only (what browsers and the OpenAI clients speak on
//! plain HTTP), each request's head read within a time limit: from the connection's start
//! for the first request, from the end of the previous response for the next one. A client
//! that sends its headers a byte at a time (slowloris), opens a connection and sends
//! nothing, or leaves a keep-alive connection idle, loses the connection when the limit
//! passes, instead of holding a socket for as long as it likes. Bodies have their own limit
//! (`admission::DEFAULT_BODY_TIMEOUT`).
//!
//! The rest of [`ConnectionLimits`] ([`crate::connections`]): at most `max_connections`
//! open at once (one more is answered `503` with `Retry-After` and closed, at once), heads
//! of at most [`MAX_HEAD_BYTES`] (`431` beyond), and a write that makes no progress for
//! `write_timeout` (a client that stopped reading) closes the connection.

use std::{future::Future, pin::pin, time::Duration};

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::{
    rt::{TokioIo, TokioTimer},
    service::TowerToHyperService,
};
use tokio::{
    io::AsyncWriteExt,
    net::{TcpListener, TcpStream},
    sync::{Semaphore, watch},
    task::JoinSet,
};

use crate::{
    admission::RETRY_AFTER_SECONDS,
    connections::{ConnectionLimits, Limited, MAX_HEAD_BYTES, Slots},
};

/// Refused connections being answered at once; beyond, a refused connection is just closed.
const REFUSALS_AT_ONCE: usize = 64;

/// Serves `app` on `listener` under `limits` until `shutdown` resolves, then lets the open
/// connections finish their current request (each is told to close) and returns once all
/// have. The head timeout: far above what any client that means to send a request needs (its
/// head is one write), short enough that a socket held by a stalled client is freed quickly;
/// hyper's own default is 30 s, but only once a timer is given, which `axum::serve` does not do.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let slots = Slots::new(limits.max_connections);
    let refusals = std::sync::Arc::new(Semaphore::new(REFUSALS_AT_ONCE));
    let (stop, stopped) = watch::channel(false);
    let mut shutdown = pin!(shutdown);
    let mut connections = JoinSet::new();
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of descriptors or a connection reset before it was accepted:
                    // pause rather than spin, as `axum::serve` does.
                    tracing::warn!(error = %e, "HTTP accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Some(slot) = slots.try_take() else {
            tracing::warn!(limit = limits.max_connections, "HTTP connection refused: the port is full");
            if let Ok(turn) = refusals.clone().try_acquire_owned() {
                tokio::spawn(async move {
                    refuse(stream, limits.max_connections).await;
                    drop(turn);
                });
            }
            continue;
        };
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(app.clone());
        let mut stopped = stopped.clone();
        connections.spawn(async move {
            let mut builder = http1::Builder::new();
            builder.timer(TokioTimer::new()).header_read_timeout(limits.header_timeout).max_buf_size(MAX_HEAD_BYTES);
            let io = TokioIo::new(Limited::new(stream, slot, limits));
            let mut conn = pin!(builder.serve_connection(io, service));
            tokio::select! {
                done = conn.as_mut() => {
                    if let Err(e) = done {
                        tracing::debug!(error = %e, "HTTP connection ended");
                    }
                    return;
                }
                _ = stopped.changed() => conn.as_mut().graceful_shutdown(),
            }
            let _ = conn.await;
        });
        // Finished connections leave the set now, not at shutdown.
        while connections.try_join_next().is_some() {}
    }
    let _ = stop.send(true);
    while connections.join_next().await.is_some() {}
}

/// Answers a connection over the limit `503` with `Retry-After` and closes it, within a
/// second whatever the client does: what it sent is read and dropped so that the close does
/// not reset the connection before the client has read the answer.
async fn refuse(mut stream: TcpStream, limit: usize) {
    let body = serde_json::json!({ "error": {
        "message": format!("the gateway has its limit of {limit} connections open (--max-connections); retry in {RETRY_AFTER_SECONDS} s"),
        "type": "server_error", "param": null, "code": "too_many_connections",
    }})
    .to_string();
    let reply = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: {RETRY_AFTER_SECONDS}\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let answer = async {
        stream.write_all(reply.as_bytes()).await?;
        stream.shutdown().await?;
        let mut sink = [0u8; 4096];
        while tokio::io::AsyncReadExt::read(&mut stream, &mut sink).await? > 0 {}
        Ok::<_, std::io::Error>(())
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), answer).await;
}
