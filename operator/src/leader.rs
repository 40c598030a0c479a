//! Leader election on a `coordination.k8s.io/v1` Lease, so several operator replicas can run
//! while one reconciles. The protocol follows client-go's: the leader renews `renewTime`;
//! a candidate takes over a lease only after it has seen the lease record unchanged for a
//! full `leaseDurationSeconds` on its own clock (so clock skew between replicas does not
//! matter). Every write carries the observed `resourceVersion`: two candidates racing for
//! the same lease cannot both win.
//!
//! Cooperative, without fencing: a paused leader may act for up to one lease duration after
//! losing the lease. Reconciles are idempotent server-side applies, which makes that benign.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, PostParams};
use tokio::sync::Mutex;

use crate::{Error, Result};

pub struct LeaseLock {
    api: Api<Lease>,
    name: String,
    holder: String,
    duration: Duration,
    observed: Mutex<Option<Observed>>,
}

/// The last lease record seen (holder, renewTime) and when this replica first saw it.
type Observed = (Option<String>, Option<MicroTime>, Instant);

impl LeaseLock {
    pub fn new(client: Client, namespace: &str, name: &str, holder: &str, duration: Duration) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            name: name.into(),
            holder: holder.into(),
            duration,
            observed: Mutex::new(None),
        }
    }

    pub fn holder(&self) -> &str {
        &self.holder
    }

    pub fn duration(&self) -> Duration {
        self.duration
    }

    /// Acquires or renews the lease. `Ok(true)`: this replica leads until at least
    /// `duration` from now. `Ok(false)`: another replica leads, or a race was lost.
    pub async fn try_acquire_or_renew(&self) -> Result<bool> {
        let now = MicroTime(Timestamp::now());
        let secs = i32::try_from(self.duration.as_secs()).unwrap_or(i32::MAX).max(1);
        let Some(existing) = self.api.get_opt(&self.name).await.map_err(Error::Kube)? else {
            let lease = Lease {
                metadata: ObjectMeta { name: Some(self.name.clone()), ..Default::default() },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.holder.clone()),
                    lease_duration_seconds: Some(secs),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(s)) if s.is_already_exists() || s.is_conflict() => Ok(false),
                Err(e) => Err(Error::Kube(e)),
            };
        };

        let spec = existing.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
        let ours = holder.as_deref() == Some(self.holder.as_str());
        if !ours && holder.is_some() && !self.expired(&spec).await {
            return Ok(false);
        }
        let mut lease = existing;
        let transitions = spec.lease_transitions.unwrap_or(0);
        lease.spec = Some(LeaseSpec {
            holder_identity: Some(self.holder.clone()),
            lease_duration_seconds: Some(secs),
            acquire_time: if ours { spec.acquire_time } else { Some(now.clone()) },
            renew_time: Some(now),
            lease_transitions: Some(if ours { transitions } else { transitions + 1 }),
            ..spec
        });
        // `replace` sends the resourceVersion we read: a concurrent writer makes this a 409.
        match self.api.replace(&self.name, &PostParams::default(), &lease).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.is_conflict() => Ok(false),
            Err(e) => Err(Error::Kube(e)),
        }
    }

    /// Whether the other holder's record has stayed unchanged for a lease duration, measured
    /// on this replica's monotonic clock from when this replica first saw that record.
    async fn expired(&self, spec: &LeaseSpec) -> bool {
        let record = (spec.holder_identity.clone(), spec.renew_time.clone());
        let duration = spec
            .lease_duration_seconds
            .and_then(|s| u64::try_from(s).ok())
            .map(Duration::from_secs)
            .unwrap_or(self.duration);
        let mut observed = self.observed.lock().await;
        match observed.as_ref() {
            Some((h, r, since)) if (h, r) == (&record.0, &record.1) => since.elapsed() >= duration,
            _ => {
                *observed = Some((record.0, record.1, Instant::now()));
                false
            }
        }
    }

    /// Gives the lease up on shutdown so a standby takes over at once instead of after a
    /// lease duration. Best effort.
    pub async fn release(&self) {
        let Ok(Some(mut lease)) = self.api.get_opt(&self.name).await else { return };
        let Some(spec) = lease.spec.as_mut() else { return };
        if spec.holder_identity.as_deref() != Some(self.holder.as_str()) {
            return;
        }
        spec.holder_identity = None;
        spec.renew_time = None;
        if let Err(e) = self.api.replace(&self.name, &PostParams::default(), &lease).await {
            tracing::warn!(error = %e, "releasing the leader lease failed");
        }
    }
}
