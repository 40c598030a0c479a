//! Carrying tonic over RA-TLS: an accept stream for `Server::serve_with_incoming` and a
//! connector for `Endpoint::connect_with_connector`.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use rustls::ServerConfig;
use rustls::pki_types::ServerName;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{TlsAcceptor, TlsConnector};
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Channel, Endpoint};

use super::ServerIdentity;
use super::verifier::{AttestedServerVerifier, ExpectedPeer};
use crate::error::{AttestError, Result};
use crate::policy::Policy;
use crate::verify::{ExpectedBinding, Verified, VerifyError};

/// A handshake that does not finish in this time is dropped, so a slow client cannot hold
/// a task forever.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Accepts TCP connections and completes RA-TLS handshakes concurrently; yields only
/// connections whose handshake (and, in mutual mode, client evidence) succeeded. Failed
/// handshakes are logged and dropped. Stops accepting when the stream is dropped.
pub fn serve_incoming(
    listener: TcpListener,
    config: Arc<ServerConfig>,
) -> impl Stream<Item = std::result::Result<tokio_rustls::server::TlsStream<TcpStream>, std::io::Error>> + Send + 'static
{
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let acceptor = TlsAcceptor::from(config);
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                _ = tx.closed() => break,
                accepted = listener.accept() => accepted,
            };
            let (tcp, peer) = match accepted {
                Ok(conn) => conn,
                Err(e) => {
                    // E.g. out of file descriptors: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let _ = tcp.set_nodelay(true);
            let (acceptor, tx) = (acceptor.clone(), tx.clone());
            tokio::spawn(async move {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(tls)) => {
                        let _ = tx.send(Ok(tls)).await;
                    }
                    Ok(Err(e)) => tracing::warn!(%peer, error = %e, "RA-TLS handshake failed"),
                    Err(_) => tracing::warn!(%peer, "RA-TLS handshake timed out"),
                }
            });
        }
    });
    ReceiverStream::new(rx)
}

type Outcome = Arc<Mutex<Option<std::result::Result<Verified, VerifyError>>>>;

/// A tower connector (`Service<Uri>`) doing TCP + RA-TLS, for tonic's
/// `Endpoint::connect_with_connector`. Every connection is verified against the policy and
/// `expected`. The first verified connection pins the peer's TLS key; a reconnect (tonic
/// opens one whenever the connection drops) must present that key and then answer a
/// fresh-nonce challenge, on a second connection to the same key, before the connection is
/// handed to tonic: a restarted peer (new key) or a replayed certificate (stale evidence)
/// receives no request. The latest verdict is kept for [`AttestedChannel`].
#[derive(Clone)]
pub struct RaTlsConnector {
    policy: Arc<Policy>,
    expected: ExpectedPeer,
    identity: Option<Arc<ServerIdentity>>,
    latest: Outcome,
    /// The TLS key of the first verified connection.
    session: Arc<Mutex<Option<[u8; 32]>>>,
    /// Off only for the probe connection that carries a reconnect's challenge.
    challenge_reconnects: bool,
}

impl RaTlsConnector {
    /// `identity`: present it as a client certificate (mutual RA-TLS), e.g. from a gateway.
    pub fn new(policy: Arc<Policy>, expected: ExpectedPeer, identity: Option<Arc<ServerIdentity>>) -> Self {
        Self {
            policy,
            expected,
            identity,
            latest: Arc::new(Mutex::new(None)),
            session: Arc::new(Mutex::new(None)),
            challenge_reconnects: true,
        }
    }

    /// The verdict of the most recent handshake (for a reconnect: of its challenge).
    pub fn latest(&self) -> Option<std::result::Result<Verified, VerifyError>> {
        self.latest.lock().ok()?.clone()
    }

    fn record(&self, outcome: std::result::Result<Verified, VerifyError>) {
        if let Ok(mut latest) = self.latest.lock() {
            *latest = Some(outcome);
        }
    }

    async fn connect(self, uri: http::Uri) -> Result<TokioIo<tokio_rustls::client::TlsStream<TcpStream>>> {
        let host = uri.host().ok_or_else(|| AttestError::Transport(format!("{uri}: no host")))?;
        let host = host.trim_start_matches('[').trim_end_matches(']').to_owned();
        let port = uri.port_u16().unwrap_or(443);
        let tcp = TcpStream::connect((host.as_str(), port))
            .await
            .map_err(|e| AttestError::Transport(format!("connect {host}:{port}: {e}")))?;
        let _ = tcp.set_nodelay(true);

        let session =
            self.session.lock().map_err(|_| AttestError::Transport("connector state poisoned".into()))?.to_owned();
        let mut expected = self.expected.clone();
        expected.tls_spki_sha256 = expected.tls_spki_sha256.or(session);
        // One verifier per connection, so its outcome is this handshake's.
        let verifier = Arc::new(AttestedServerVerifier::new(self.policy.clone(), expected));
        let config = match &self.identity {
            Some(identity) => identity.client_config(verifier.clone())?,
            None => super::client_builder(verifier.clone())?.with_no_client_auth(),
        };
        let connector = TlsConnector::from(super::finish_client(config));
        let name = ServerName::try_from(host.clone()).map_err(|e| AttestError::Transport(format!("{host}: {e}")))?;
        let handshake = connector.connect(name, tcp).await;
        let peer = match (handshake, verifier.outcome()) {
            (Ok(tls), Some(Ok(peer))) => (tls, peer),
            (_, Some(Err(rejection))) => {
                self.record(Err(rejection.clone()));
                return Err(AttestError::PeerRejected(rejection));
            }
            (Err(e), _) => return Err(AttestError::Tls(format!("handshake with {host}:{port}: {e}"))),
            (Ok(_), None) => {
                return Err(AttestError::Tls("handshake finished without certificate verification".into()));
            }
        };
        let (tls, peer) = peer;
        if session.is_none() {
            // The first connection: its caller challenges it before relying on it.
            if let Ok(mut pinned) = self.session.lock() {
                *pinned = Some(*peer.tls_spki_sha256());
            }
            self.record(Ok(peer));
        } else if self.challenge_reconnects {
            let fresh = self.challenge_reconnect(&uri, &peer).await;
            match &fresh {
                Ok(v) => self.record(Ok(v.clone())),
                Err(AttestError::PeerRejected(rejection)) => self.record(Err(rejection.clone())),
                Err(_) => {}
            }
            fresh?;
        }
        Ok(TokioIo::new(tls))
    }

    /// Evidence from now for the reconnected key, asked over a second connection that must
    /// present the same key (so the answer comes from the holder of the handshake's key).
    async fn challenge_reconnect(&self, uri: &http::Uri, peer: &Verified) -> Result<Verified> {
        let authority = uri.authority().ok_or_else(|| AttestError::Transport(format!("{uri}: no authority")))?;
        let probe = RaTlsConnector { latest: Arc::new(Mutex::new(None)), challenge_reconnects: false, ..self.clone() };
        let asking = async {
            let channel = Endpoint::from_shared(format!("http://{authority}"))
                .map_err(|e| AttestError::Transport(format!("{authority}: {e}")))?
                .connect_with_connector(probe)
                .await
                .map_err(|e| AttestError::Transport(error_chain(&e)))?;
            challenge_same_peer(channel, peer, &self.policy).await
        };
        tokio::time::timeout(HANDSHAKE_TIMEOUT, asking).await.map_err(|_| {
            AttestError::Transport(format!("{authority}: no fresh evidence within {HANDSHAKE_TIMEOUT:?}"))
        })?
    }
}

impl tower::Service<http::Uri> for RaTlsConnector {
    type Response = TokioIo<tokio_rustls::client::TlsStream<TcpStream>>;
    type Error = AttestError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        Box::pin(self.clone().connect(uri))
    }
}

/// A tonic channel to an attested peer, with what the peer proved.
#[derive(Clone)]
pub struct AttestedChannel {
    channel: Channel,
    peer: Verified,
    connector: RaTlsConnector,
}

impl AttestedChannel {
    pub fn channel(&self) -> Channel {
        self.channel.clone()
    }

    /// What the peer proved in the first handshake.
    pub fn peer(&self) -> &Verified {
        &self.peer
    }

    /// What the peer proved in the latest connection (the channel reconnects on failure;
    /// every reconnect must present the first connection's key and answer a fresh challenge).
    pub fn current_peer(&self) -> Option<Verified> {
        self.connector.latest()?.ok()
    }

    /// The verdict of the latest connection attempt, refused ones included: why a reconnect
    /// was not used.
    pub fn latest_verdict(&self) -> Option<std::result::Result<Verified, VerifyError>> {
        self.connector.latest()
    }

    /// Freshness: asks the peer for evidence bound to a new random nonce and checks it is
    /// bound to the TLS key of the current connection and to the same identities.
    pub async fn challenge(&self) -> Result<Verified> {
        let peer = self.current_peer().unwrap_or_else(|| self.peer.clone());
        challenge_same_peer(self.channel.clone(), &peer, &self.connector.policy).await
    }
}

/// Evidence for a new random nonce over `channel`, bound to the same TLS key and identities
/// as `peer` proved.
async fn challenge_same_peer(channel: Channel, peer: &Verified, policy: &Policy) -> Result<Verified> {
    let nonce = crate::challenge::random_nonce();
    let expected = ExpectedBinding {
        model_identity: Some(*peer.model_identity()),
        scheme_identity: Some(*peer.scheme_identity()),
        tls_spki_sha256: Some(*peer.tls_spki_sha256()),
        nonce: nonce.to_vec(),
    };
    crate::challenge::challenge(channel, &nonce, &expected, policy).await
}

/// Connects a tonic channel to `target` (`host:port`) over RA-TLS. Fails before any request
/// is sent if the peer's evidence does not satisfy `policy` and `expected`
/// ([`AttestError::PeerRejected`] carries the reason). `identity` turns on mutual mode.
pub async fn connect(
    target: &str,
    policy: Arc<Policy>,
    expected: ExpectedPeer,
    identity: Option<Arc<ServerIdentity>>,
) -> Result<AttestedChannel> {
    // The scheme is plain http for tonic: TLS is done by the connector.
    let endpoint = Endpoint::from_shared(format!("http://{target}"))
        .map_err(|e| AttestError::Transport(format!("{target}: {e}")))?
        .connect_timeout(Duration::from_secs(10));
    let connector = RaTlsConnector::new(policy, expected, identity);
    let connected = endpoint.connect_with_connector(connector.clone()).await;
    match (connected, connector.latest()) {
        (Ok(channel), Some(Ok(peer))) => Ok(AttestedChannel { channel, peer, connector }),
        (_, Some(Err(rejection))) => Err(AttestError::PeerRejected(rejection)),
        (Err(e), _) => Err(AttestError::Transport(error_chain(&e))),
        (Ok(_), None) => Err(AttestError::Transport("connected without a verified handshake".into())),
    }
}

/// An error and its sources, `outer: inner: …`, for a transport failure's message.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}
