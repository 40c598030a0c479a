//! Attested routing: the set of backends per role, which of them are verified right now, and
//! how a request picks one.
//!
//! Every backend gets its own verifier task (`verify`): RA-TLS handshake against the
//! gateway's policy (restricted to the backend's role) and the expected model identity, the
//! pinned TLS key when the routing table names one, a fresh-nonce challenge over the same
//! connection, and a health check; then the same challenge and health check again every
//! interval. Only a backend whose latest verification passed is ever handed a request: there
//! is no code path from a request to an unverified channel, because the channel lives inside
//! the `Verified` state and nowhere else.
//!
//! Requests spread round-robin over the verified backends of their role. A transport failure
//! (connection refused or reset, the server gone mid-call) drops the backend at once; unary
//! calls then move on to the next verified replica, and the verifier retries the dropped one
//! every `retry` until it verifies again. When no verified backend is left the call fails
//! closed with `UNAVAILABLE`, naming the role and the last reason.

pub mod routes;
mod stream;
mod verify;

pub use stream::{BackendStream, StreamError};

use std::{
    collections::HashMap,
    future::Future,
    sync::{
        Arc, Mutex, RwLock, Weak,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use attest::{Policy, Role, ServerIdentity, ratls::AttestedChannel};
use tokio::{
    sync::{Notify, Semaphore},
    task::JoinHandle,
};
use tonic::{Code, Status, transport::Channel};

use crate::error::{GatewayError, Result};

/// One backend as configured: where it is and what it must prove.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct BackendSpec {
    pub role: Role,
    /// `host:port`.
    pub endpoint: String,
    /// The model identity its evidence must carry; `None` leaves it to the policy's allowlist.
    pub model_identity: Option<[u8; 32]>,
    pub scheme_identity: Option<[u8; 32]>,
    /// The TLS key the operator saw bound to fresh evidence (routing table); when set, a
    /// connection to any other key is refused.
    pub tls_spki_sha256: Option<[u8; 32]>,
}

/// How often backends are verified.
#[derive(Clone, Copy, Debug)]
pub struct VerifyTiming {
    /// Re-verification of a verified backend (fresh nonce, health).
    pub interval: Duration,
    /// Retry of a backend that failed or is unreachable.
    pub retry: Duration,
    /// One handshake, challenge or health check.
    pub timeout: Duration,
}

impl Default for VerifyTiming {
    fn default() -> Self {
        VerifyTiming {
            interval: Duration::from_secs(30),
            retry: Duration::from_secs(5),
            timeout: Duration::from_secs(10),
        }
    }
}

/// What one backend looks like now, for `Stats`, the trust report (`GET /v1/trust`) and logs.
/// The attested facts are empty unless the backend is verified: a backend out of rotation
/// proves nothing now.
#[derive(Clone, Debug, PartialEq)]
pub struct BackendStatus {
    pub role: Role,
    pub endpoint: String,
    pub trust: Trust,
    /// Why it is out of rotation, `<code>: <detail>`; empty when verified.
    pub reason: String,
    /// The stable part of `reason`: the verifier's reason (`measurement_not_allowed`, ...)
    /// when refused, `unreachable`, `timeout`, ... when unavailable; empty when verified.
    pub reason_code: &'static str,
    /// The model identity it must prove (hex), when the configuration names one.
    pub expected_model_identity: String,
    /// SHA-256 of the gateway's backend policy ([`Policy::digest`]) this backend is checked
    /// against (narrowed to its role); what the gateway attests as `backend_policy_sha256`.
    pub policy_sha256: String,
    pub model_identity: String,
    pub tls_spki_sha256: String,
    pub measurement: String,
    pub chip_id: String,
    pub tcb: Option<attest::Tcb>,
    /// `mock` or `sev-snp`, as proven by the root its chain ends at.
    pub issuer: String,
    /// The protection scheme it attested, as the JSON it signed.
    pub scheme_json: String,
    /// Age of its latest fresh-nonce evidence.
    pub verified_age: Option<Duration>,
    pub requests: u64,
}

impl BackendStatus {
    /// In rotation: its latest fresh evidence satisfied the policy.
    pub fn verified(&self) -> bool {
        self.trust == Trust::Verified
    }
}

/// Where a backend stands with the gateway.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trust {
    /// Its latest fresh evidence satisfied the policy and it is healthy: it gets requests.
    Verified,
    /// Its evidence or identity did not satisfy the policy: a verdict, not an outage.
    Refused,
    /// Not reachable, too slow, not serving, broke during a request, or not tried yet.
    Unavailable,
}

impl Trust {
    pub fn as_str(self) -> &'static str {
        match self {
            Trust::Verified => "verified",
            Trust::Refused => "refused",
            Trust::Unavailable => "unavailable",
        }
    }
}

/// Why a backend is out of rotation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Failure {
    trust: Trust,
    code: &'static str,
    reason: String,
}

impl Failure {
    /// A verdict: `code` is the verifier's reason or a check of the gateway's own.
    pub(crate) fn refused(code: &'static str, reason: String) -> Self {
        Failure { trust: Trust::Refused, code, reason }
    }

    pub(crate) fn unavailable(code: &'static str, reason: String) -> Self {
        Failure { trust: Trust::Unavailable, code, reason }
    }

    fn pending() -> Self {
        Self::unavailable("not_verified_yet", "not verified yet".into())
    }
}

pub(crate) enum State {
    Pending,
    Verified { channel: Box<AttestedChannel>, facts: Box<Facts>, at: Instant },
    Failed(Failure),
}

/// What the latest verification proved, kept for `Stats` and the trust report.
#[derive(Clone, Debug)]
pub(crate) struct Facts {
    summary: attest::VerifiedSummary,
    scheme_json: String,
}

impl Facts {
    fn of(v: &attest::Verified) -> Self {
        Facts { summary: v.summary(), scheme_json: v.scheme_json().to_string() }
    }
}

pub(crate) struct Backend {
    spec: BackendSpec,
    /// The gateway's policy, restricted to this backend's role: every handshake, reconnects
    /// included, must prove the role as well as the policy and the model.
    policy: Arc<Policy>,
    /// The digest of the gateway's policy `policy` was narrowed from.
    policy_sha256: Option<[u8; 32]>,
    identity: Option<Arc<ServerIdentity>>,
    timing: VerifyTiming,
    state: Mutex<State>,
    wake: Notify,
    requests: AtomicU64,
    /// Unary calls in flight to this backend at most: the rest wait here, in the gateway,
    /// rather than in the service's batch queue, which gives up after 30 s.
    permits: Arc<Semaphore>,
    /// Calls and streams in flight (waiting for a slot included): what `pick` balances.
    load: AtomicUsize,
    task: Mutex<Option<JoinHandle<()>>>,
}

/// Counts one call or stream in `Backend::load` while it lives.
struct Load(Arc<Backend>);

impl Load {
    fn new(b: &Arc<Backend>) -> Load {
        b.load.fetch_add(1, Ordering::Relaxed);
        Load(b.clone())
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.0.load.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Backend {
    fn channel(&self) -> Option<Channel> {
        match &*self.state.lock().expect("backend state") {
            State::Verified { channel, .. } => Some(channel.channel()),
            _ => None,
        }
    }

    fn is_verified(&self) -> bool {
        matches!(&*self.state.lock().expect("backend state"), State::Verified { .. })
    }

    /// Drops the backend after a failed request; the verifier retries it.
    fn fail(&self, code: &'static str, reason: String) {
        let mut state = self.state.lock().expect("backend state");
        if matches!(*state, State::Verified { .. }) {
            tracing::warn!(role = %self.spec.role, endpoint = %self.spec.endpoint, reason = %reason, "backend dropped");
        }
        *state = State::Failed(Failure::unavailable(code, reason));
        drop(state);
        self.wake.notify_one();
    }

    /// A call that took longer than `after`: the backend leaves the rotation (its verifier,
    /// woken now, puts it back once it answers a fresh challenge and a health check in time).
    fn timed_out(&self, after: Duration) -> GatewayError {
        self.fail("timeout", format!("timeout: a request got no answer within {after:?}"));
        GatewayError::Timeout { role: self.spec.role, endpoint: self.spec.endpoint.clone(), after }
    }

    fn reason(&self) -> Option<String> {
        match &*self.state.lock().expect("backend state") {
            State::Pending => Some(Failure::pending().reason),
            State::Failed(f) => Some(f.reason.clone()),
            State::Verified { .. } => None,
        }
    }

    fn status(&self) -> BackendStatus {
        let state = self.state.lock().expect("backend state");
        let (failure, facts, age) = match &*state {
            State::Pending => (Some(Failure::pending()), None, None),
            State::Failed(f) => (Some(f.clone()), None, None),
            State::Verified { facts, at, .. } => (None, Some(facts.as_ref().clone()), Some(at.elapsed())),
        };
        drop(state);
        let hex_or_empty = |d: Option<[u8; 32]>| d.map(hex::encode).unwrap_or_default();
        let (trust, reason_code, reason) = match failure {
            Some(f) => (f.trust, f.code, f.reason),
            None => (Trust::Verified, "", String::new()),
        };
        let (summary, scheme_json) = match facts {
            Some(f) => (Some(f.summary), f.scheme_json),
            None => (None, String::new()),
        };
        let fact = |get: fn(&attest::VerifiedSummary) -> String| summary.as_ref().map(get).unwrap_or_default();
        BackendStatus {
            role: self.spec.role,
            endpoint: self.spec.endpoint.clone(),
            trust,
            reason,
            reason_code,
            expected_model_identity: hex_or_empty(self.spec.model_identity),
            policy_sha256: hex_or_empty(self.policy_sha256),
            model_identity: fact(|s| s.model_identity.clone()),
            tls_spki_sha256: fact(|s| s.tls_spki_sha256.clone()),
            measurement: fact(|s| s.measurement.clone()),
            chip_id: fact(|s| s.chip_id.clone()),
            tcb: summary.as_ref().map(|s| s.reported_tcb),
            issuer: fact(|s| s.issuer.as_str().to_string()),
            scheme_json,
            verified_age: age,
            requests: self.requests.load(Ordering::Relaxed),
        }
    }

    fn retire(&self) {
        if let Some(task) = self.task.lock().expect("backend task").take() {
            task.abort();
        }
    }
}

#[derive(Default)]
struct RoleSet {
    backends: RwLock<Vec<Arc<Backend>>>,
    next: AtomicUsize,
}

struct Inner {
    roles: [RoleSet; 3],
    /// The policy and its digest (`None` if it cannot be digested: a root file unreadable).
    policy: RwLock<(Arc<Policy>, Option<[u8; 32]>)>,
    identity: Option<Arc<ServerIdentity>>,
    timing: VerifyTiming,
    unary_in_flight: AtomicUsize,
    /// [`Pool::set_call_timeout`], in milliseconds.
    call_timeout_ms: AtomicU64,
}

/// Unary calls (embed, rerank) in flight per backend by default: two keep a service's batcher
/// busy (one pass running, one queued) without queueing work behind it that could time out.
pub const DEFAULT_UNARY_IN_FLIGHT: usize = 2;

/// How long one backend call, a stream's first message or any next one, may take by
/// default. Far above a loaded service's worst answer (its own batch queue gives up after
/// 30 s), so only a backend that stopped (SIGSTOP, a hung host, a dropped link that never
/// resets) reaches it.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(120);

/// The backends of every role. Cheap to clone.
#[derive(Clone)]
pub struct Pool {
    inner: Arc<Inner>,
}

/// Whether a failed call means the backend itself is gone or broken (drop it, try another),
/// rather than a verdict on the request.
pub fn is_backend_failure(s: &Status) -> bool {
    match s.code() {
        Code::Unavailable | Code::Unknown | Code::DataLoss => true,
        // tonic reports a connection that broke mid-call (the peer died) as INTERNAL or
        // CANCELLED with the transport error as its source; a backend's own INTERNAL has none.
        Code::Internal | Code::Cancelled => std::error::Error::source(s).is_some(),
        _ => false,
    }
}

impl Pool {
    /// `identity`: presented to backends that require an attested client (mutual RA-TLS).
    pub fn new(policy: Policy, identity: Option<Arc<ServerIdentity>>, timing: VerifyTiming) -> Self {
        Pool {
            inner: Arc::new(Inner {
                roles: Default::default(),
                policy: RwLock::new(with_digest(policy)),
                identity,
                timing,
                unary_in_flight: AtomicUsize::new(DEFAULT_UNARY_IN_FLIGHT),
                call_timeout_ms: AtomicU64::new(DEFAULT_CALL_TIMEOUT.as_millis() as u64),
            }),
        }
    }

    /// Unary calls in flight per backend for backends added from now on (at least 1).
    pub fn set_unary_in_flight(&self, n: usize) {
        self.inner.unary_in_flight.store(n.max(1), Ordering::Relaxed);
    }

    /// How long one backend call, a stream's first message or any next one, may take; past
    /// it the call fails with `DEADLINE_EXCEEDED` naming the backend, which leaves the
    /// rotation until its verifier passes again. At least 1 ms.
    pub fn set_call_timeout(&self, t: Duration) {
        self.inner.call_timeout_ms.store((t.as_millis() as u64).max(1), Ordering::Relaxed);
    }

    fn call_timeout(&self) -> Duration {
        Duration::from_millis(self.inner.call_timeout_ms.load(Ordering::Relaxed))
    }

    /// Replaces the backend set. Backends whose spec is unchanged keep their connection and
    /// verification state; removed ones are dropped at once. Must be called within a tokio
    /// runtime (it starts the verifier tasks).
    pub fn set_backends(&self, specs: &[BackendSpec]) {
        let (policy, digest) = self.inner.policy.read().expect("policy").clone();
        for role in Role::ALL {
            let set = &self.inner.roles[role.index()];
            let mut backends = set.backends.write().expect("backends");
            let mut old: HashMap<BackendSpec, Arc<Backend>> = backends.drain(..).map(|b| (b.spec.clone(), b)).collect();
            for spec in specs.iter().filter(|s| s.role == role) {
                if backends.iter().any(|b| b.spec == *spec) {
                    continue; // listed twice
                }
                let backend = old.remove(spec).unwrap_or_else(|| self.spawn(spec.clone(), &policy, digest));
                backends.push(backend);
            }
            for (spec, gone) in old {
                tracing::info!(role = %role, endpoint = %spec.endpoint, "backend left the configuration");
                gone.retire();
            }
        }
    }

    /// Replaces the policy: every backend is verified again from scratch under it.
    pub fn set_policy(&self, policy: Policy) {
        *self.inner.policy.write().expect("policy") = with_digest(policy);
        let specs: Vec<BackendSpec> = self.specs();
        for role in Role::ALL {
            for b in self.inner.roles[role.index()].backends.write().expect("backends").drain(..) {
                b.retire();
            }
        }
        self.set_backends(&specs);
    }

    pub fn specs(&self) -> Vec<BackendSpec> {
        Role::ALL
            .iter()
            .flat_map(|r| {
                self.inner.roles[r.index()]
                    .backends
                    .read()
                    .expect("backends")
                    .iter()
                    .map(|b| b.spec.clone())
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    fn spawn(&self, spec: BackendSpec, policy: &Policy, policy_sha256: Option<[u8; 32]>) -> Arc<Backend> {
        let backend = Arc::new(Backend {
            policy: Arc::new(role_policy(policy, spec.role)),
            policy_sha256,
            spec,
            identity: self.inner.identity.clone(),
            timing: self.inner.timing,
            state: Mutex::new(State::Pending),
            wake: Notify::new(),
            requests: AtomicU64::new(0),
            permits: Arc::new(Semaphore::new(self.inner.unary_in_flight.load(Ordering::Relaxed))),
            load: AtomicUsize::new(0),
            task: Mutex::new(None),
        });
        let task = tokio::spawn(verify::run(Arc::downgrade(&backend)));
        *backend.task.lock().expect("backend task") = Some(task);
        backend
    }

    /// SHA-256 of the policy backends are checked against ([`Policy::digest`]).
    pub fn policy_sha256(&self) -> Option<[u8; 32]> {
        self.inner.policy.read().expect("policy").1
    }

    /// Whether any backend of `role` is configured (verified or not).
    pub fn configured(&self, role: Role) -> bool {
        !self.inner.roles[role.index()].backends.read().expect("backends").is_empty()
    }

    /// Every backend's current state, role by role.
    pub fn status(&self) -> Vec<BackendStatus> {
        Role::ALL
            .iter()
            .flat_map(|r| {
                self.inner.roles[r.index()]
                    .backends
                    .read()
                    .expect("backends")
                    .iter()
                    .map(|b| b.status())
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// Waits until `role` has a verified backend (or the timeout passes).
    pub async fn wait_verified(&self, role: Role, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if self.inner.roles[role.index()].backends.read().expect("backends").iter().any(|b| b.is_verified()) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// A verified backend of `role` not in `tried`: the least loaded one, round-robin among
    /// equals; fails closed.
    fn pick(&self, role: Role, tried: &[usize]) -> Result<(Arc<Backend>, Channel)> {
        let set = &self.inner.roles[role.index()];
        let backends = set.backends.read().expect("backends");
        if backends.is_empty() {
            return Err(GatewayError::NoBackend {
                role,
                reason: format!("none configured (give the gateway a {role} backend)"),
            });
        }
        let n = backends.len();
        let start = set.next.fetch_add(1, Ordering::Relaxed);
        let mut best: Option<(usize, Arc<Backend>, Channel)> = None;
        for i in 0..n {
            let b = &backends[(start + i) % n];
            if tried.contains(&(Arc::as_ptr(b) as usize)) {
                continue;
            }
            if let Some(channel) = b.channel() {
                let load = b.load.load(Ordering::Relaxed);
                if best.as_ref().is_none_or(|(l, _, _)| load < *l) {
                    best = Some((load, b.clone(), channel));
                }
            }
        }
        if let Some((_, b, channel)) = best {
            return Ok((b, channel));
        }
        // Name every backend and why it is out, so the operator sees the whole picture.
        let reasons: Vec<String> = backends
            .iter()
            .map(|b| format!("{}: {}", b.spec.endpoint, b.reason().unwrap_or_else(|| "failed this request".into())))
            .collect();
        Err(GatewayError::NoBackend { role, reason: reasons.join("; ") })
    }

    /// Runs a unary call on a verified backend of `role`, moving on to the next verified
    /// replica when a backend turns out to be gone. Unary model calls are idempotent, so the
    /// retry cannot duplicate an effect.
    pub async fn unary<T, F, Fut>(&self, role: Role, call: F) -> Result<T>
    where
        F: Fn(Channel) -> Fut,
        Fut: Future<Output = std::result::Result<T, Status>>,
    {
        // Backends this call already failed on, by address (a raw pointer is not Send).
        let mut tried: Vec<usize> = Vec::new();
        loop {
            let (backend, channel) = self.pick(role, &tried)?;
            let _load = Load::new(&backend);
            let _slot = backend
                .permits
                .clone()
                .acquire_owned()
                .await
                .map_err(|_| GatewayError::Internal("backend closed".into()))?;
            backend.requests.fetch_add(1, Ordering::Relaxed);
            let after = self.call_timeout();
            let Ok(result) = tokio::time::timeout(after, call(channel)).await else {
                return Err(backend.timed_out(after));
            };
            match result {
                Ok(v) => return Ok(v),
                Err(status) if is_backend_failure(&status) => {
                    backend.fail("request_failed", format!("request failed: {}", status.message()));
                    tried.push(Arc::as_ptr(&backend) as usize);
                }
                Err(status) => {
                    return Err(GatewayError::Backend { role, endpoint: backend.spec.endpoint.clone(), status });
                }
            }
        }
    }

    /// Opens a server stream on a verified backend of `role`. Fails over like [`Self::unary`]
    /// until the stream has produced its first message; after that a broken or stalled
    /// stream is the caller's to report (see [`Routed::broken`]).
    pub async fn stream<T, F, Fut>(&self, role: Role, open: F) -> Result<(Routed, Option<T>, BackendStream<T>)>
    where
        F: Fn(Channel) -> Fut,
        Fut: Future<Output = std::result::Result<tonic::Streaming<T>, Status>>,
    {
        // Backends this call already failed on, by address (a raw pointer is not Send).
        let mut tried: Vec<usize> = Vec::new();
        loop {
            let (backend, channel) = self.pick(role, &tried)?;
            let load = Load::new(&backend);
            backend.requests.fetch_add(1, Ordering::Relaxed);
            let opening = async {
                match open(channel).await {
                    Ok(mut stream) => stream.message().await.map(|first| (first, stream)),
                    Err(status) => Err(status),
                }
            };
            let after = self.call_timeout();
            let Ok(opened) = tokio::time::timeout(after, opening).await else {
                return Err(backend.timed_out(after));
            };
            match opened {
                Ok((first, stream)) => {
                    return Ok((Routed { backend, _load: load }, first, BackendStream::new(stream, after)));
                }
                Err(status) if is_backend_failure(&status) => {
                    backend.fail("request_failed", format!("request failed: {}", status.message()));
                    tried.push(Arc::as_ptr(&backend) as usize);
                }
                Err(status) => {
                    return Err(GatewayError::Backend { role, endpoint: backend.spec.endpoint.clone(), status });
                }
            }
        }
    }
}

/// The backend a stream was routed to; counts in its load while it lives.
pub struct Routed {
    backend: Arc<Backend>,
    _load: Load,
}

impl Routed {
    /// The error for a stream that failed or stalled after it had started; drops the
    /// backend if the failure was the backend's.
    pub fn broken(&self, e: StreamError) -> GatewayError {
        let spec = &self.backend.spec;
        let status = match e {
            StreamError::Status(status) => status,
            StreamError::Stalled(after) => {
                self.backend.fail("timeout", format!("timeout: a started stream sent nothing for {after:?}"));
                return GatewayError::Stalled { role: spec.role, endpoint: spec.endpoint.clone(), after };
            }
        };
        if is_backend_failure(&status) {
            self.backend.fail("stream_broke", format!("stream broke: {}", status.message()));
            GatewayError::BrokenStream {
                role: spec.role,
                endpoint: spec.endpoint.clone(),
                reason: status.message().to_string(),
            }
        } else {
            GatewayError::Backend { role: spec.role, endpoint: spec.endpoint.clone(), status }
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        for set in &self.roles {
            for b in set.backends.read().map(|b| b.clone()).unwrap_or_default() {
                b.retire();
            }
        }
    }
}

fn with_digest(policy: Policy) -> (Arc<Policy>, Option<[u8; 32]>) {
    let digest = policy.digest().inspect_err(|e| tracing::warn!(error = %e, "the backend policy has no digest")).ok();
    (Arc::new(policy), digest)
}

/// The gateway's policy narrowed to one role: a backend proving another role (an embedder
/// answering at the reranker's address, say) fails the handshake itself.
fn role_policy(policy: &Policy, role: Role) -> Policy {
    let mut p = policy.clone();
    let name = role.as_str().to_string();
    p.roles = Some(match &policy.roles {
        Some(allowed) if !allowed.contains(&name) => Vec::new(),
        _ => vec![name],
    });
    p
}

/// What a verifier task holds: it must not keep a removed backend alive.
pub(crate) type BackendRef = Weak<Backend>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_role_policy_admits_only_that_role() {
        let p = role_policy(&Policy::default(), Role::Embedder);
        assert_eq!(p.roles, Some(vec!["embedder".to_string()]));
        // A policy that already excludes the role admits nothing for it.
        let mut only_gen = Policy::default();
        only_gen.roles = Some(vec!["generator".into()]);
        assert_eq!(role_policy(&only_gen, Role::Embedder).roles, Some(vec![]));
        assert_eq!(role_policy(&only_gen, Role::Generator).roles, Some(vec!["generator".to_string()]));
    }

    #[test]
    fn backend_failures_are_told_from_request_verdicts() {
        assert!(is_backend_failure(&Status::unavailable("connection refused")));
        assert!(is_backend_failure(&Status::data_loss("GPU integrity check failed")));
        assert!(!is_backend_failure(&Status::invalid_argument("too long")));
        assert!(!is_backend_failure(&Status::resource_exhausted("queue full")));
        assert!(
            !is_backend_failure(&Status::internal("model failed")),
            "a backend's own INTERNAL has no transport source"
        );
    }

    #[tokio::test]
    async fn an_empty_role_fails_closed_with_unavailable() {
        let pool = Pool::new(Policy::default(), None, VerifyTiming::default());
        let err = pool.unary(Role::Reranker, |_c| async { Ok::<(), Status>(()) }).await.unwrap_err();
        let s: Status = err.into();
        assert_eq!(s.code(), Code::Unavailable);
        assert!(s.message().contains("reranker") && s.message().contains("none configured"), "{}", s.message());
    }
}
