//! The HTTP port's connections. HTTP/1.1 only (what browsers and the OpenAI clients speak on
//! plain HTTP), each request's head read within a time limit: from the connection's start
//! for the first request, from the end of the previous response for the next one. A client
//! that sends its headers a byte at a time (slowloris), opens a connection and sends
//! nothing, or leaves a keep-alive connection idle, loses the connection when the limit
//! passes, instead of holding a socket for as long as it likes. Bodies have their own limit
//! (`admission::DEFAULT_BODY_TIMEOUT`); a response being streamed is not limited here.

use std::{future::Future, pin::pin, time::Duration};

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::{
    rt::{TokioIo, TokioTimer},
    service::TowerToHyperService,
};
use tokio::{net::TcpListener, sync::watch, task::JoinSet};

/// How long a client may take to send a request's head, and how long a kept-alive connection
/// may stay idle. Far above what any client that means to send a request needs (its head is
/// one write), short enough that a socket held by a stalled client is freed quickly; hyper's
/// own default is 30 s, but only once a timer is given, which `axum::serve` does not do.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves `app` on `listener` until `shutdown` resolves, then lets the open connections finish
/// their current request (each is told to close) and returns once all have.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    header_read_timeout: Duration,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
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
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(app.clone());
        let mut stopped = stopped.clone();
        connections.spawn(async move {
            let mut builder = http1::Builder::new();
            builder.timer(TokioTimer::new()).header_read_timeout(header_read_timeout);
            let mut conn = pin!(builder.serve_connection(TokioIo::new(stream), service));
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
