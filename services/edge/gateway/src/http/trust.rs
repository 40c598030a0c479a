//! `GET /v1/trust`: every backend the gateway knows and where it stands — verified, refused
//! (its evidence or identity failed the policy; `reason_code` is the verifier's reason) or
//! unavailable (unreachable, too slow, not serving, not tried yet) — with what its latest
//! fresh evidence proved, and the digest of the backend policy it is checked against. Read
//! only: it reports the routing state, it changes nothing.
//!
//! ```json
//! {"backend_policy_sha256": "…", "backends": [{"role": "embedder", "endpoint": "127.0.0.1:40123",
//!   "status": "verified", "reason_code": null, "reason": null, "measurement": "…",
//!   "tcb": {"bootloader": 3, "tee": 0, "snp": 8, "microcode": 115}, "chip_id": "…",
//!   "model_identity": "…", "expected_model_identity": "…", "scheme": {"role": "embedder", …},
//!   "issuer": "mock", "tls_spki_sha256": "…", "evidence_age_seconds": 4.2,
//!   "policy_sha256": "…", "requests": 12}]}
//! ```

use std::time::Instant;

use axum::{Json, extract::State};
use serde_json::{Value, json};
use tonic::Code;

use super::St;
use crate::backends::BackendStatus;

pub(crate) async fn report(State(s): St) -> Json<Value> {
    let t = Instant::now();
    let pool = &s.pipeline.pool;
    let backends: Vec<Value> = pool.status().iter().map(backend).collect();
    let body = json!({
        "backend_policy_sha256": pool.policy_sha256().map(hex::encode),
        "backends": backends,
    });
    s.metrics.observe("http.Trust", Code::Ok, t.elapsed().as_secs_f64());
    Json(body)
}

fn backend(b: &BackendStatus) -> Value {
    let text = |s: &str| if s.is_empty() { Value::Null } else { Value::String(s.to_string()) };
    // The scheme as the backend signed it; kept as a string if it is somehow not JSON.
    let scheme = match b.scheme_json.as_str() {
        "" => Value::Null,
        raw => serde_json::from_str(raw).unwrap_or_else(|_| Value::String(raw.to_string())),
    };
    json!({
        "role": b.role.as_str(),
        "endpoint": b.endpoint,
        "status": b.trust.as_str(),
        "reason_code": text(b.reason_code),
        "reason": text(&b.reason),
        "measurement": text(&b.measurement),
        "tcb": b.tcb,
        "chip_id": text(&b.chip_id),
        "model_identity": text(&b.model_identity),
        "expected_model_identity": text(&b.expected_model_identity),
        "scheme": scheme,
        "issuer": text(&b.issuer),
        "tls_spki_sha256": text(&b.tls_spki_sha256),
        "evidence_age_seconds": b.verified_age.map(|d| (d.as_secs_f64() * 10.0).round() / 10.0),
        "policy_sha256": text(&b.policy_sha256),
        "requests": b.requests,
    })
}
