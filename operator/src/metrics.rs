//! Prometheus metrics of the operator, served on `/metrics`. Label values come from closed
//! sets (error variants, components, attestation reasons), never from object names, so the
//! series count stays bounded however many pipelines exist.

use std::sync::Arc;
use std::time::Instant;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::Error;

type Labels = Vec<(&'static str, String)>;

pub struct Metrics {
    registry: Registry,
    pub reconciliations: Counter,
    pub failures: Family<Labels, Counter>,
    pub duration: Histogram,
    pub attestations: Family<Labels, Counter>,
    pub invalid_specs: Counter,
    pub leader: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("gelo_operator");
        let reconciliations = Counter::default();
        let failures = Family::<Labels, Counter>::default();
        // 10 ms .. ~40 s: a reconcile includes one attestation round over every ready pod.
        let duration = Histogram::new(exponential_buckets(0.01, 2.0, 12));
        let attestations = Family::<Labels, Counter>::default();
        let invalid_specs = Counter::default();
        let leader = Gauge::default();
        registry.register("reconciliations", "Reconciliations started", reconciliations.clone());
        registry.register("reconcile_failures", "Reconciliations that failed, by error variant", failures.clone());
        registry.register("reconcile_duration_seconds", "Time spent in one reconciliation", duration.clone());
        registry.register(
            "attestations",
            "Pod attestation results by component, result and reason",
            attestations.clone(),
        );
        registry.register("invalid_specs", "Reconciliations that found an invalid spec", invalid_specs.clone());
        registry.register("leader", "1 while this replica holds the leader lease", leader.clone());
        Self { registry, reconciliations, failures, duration, attestations, invalid_specs, leader }
    }
}

impl Metrics {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    pub fn reconcile_started(&self) -> ReconcileTimer {
        self.reconciliations.inc();
        ReconcileTimer { start: Instant::now(), histogram: self.duration.clone() }
    }

    pub fn reconcile_failed(&self, error: &Error) {
        self.failures.get_or_create(&vec![("error", error.metric_label().to_string())]).inc();
    }

    pub fn attestation(&self, component: &str, result: &'static str, reason: &str) {
        self.attestations
            .get_or_create(&vec![
                ("component", component.to_string()),
                ("result", result.to_string()),
                ("reason", reason.to_string()),
            ])
            .inc();
    }

    /// The count recorded so far for one label combination (for tests and diagnostics).
    pub fn attestation_count(&self, component: &str, result: &'static str, reason: &str) -> u64 {
        self.attestations
            .get(&vec![
                ("component", component.to_string()),
                ("result", result.to_string()),
                ("reason", reason.to_string()),
            ])
            .map(|c| c.get())
            .unwrap_or(0)
    }

    /// OpenMetrics text.
    pub fn render(&self) -> Result<String, Error> {
        let mut out = String::new();
        encode(&mut out, &self.registry).map_err(|_| Error::Metrics)?;
        Ok(out)
    }
}

/// Observes the reconcile duration when dropped, whatever way the reconcile ends.
pub struct ReconcileTimer {
    start: Instant,
    histogram: Histogram,
}

impl Drop for ReconcileTimer {
    fn drop(&mut self) {
        self.histogram.observe(self.start.elapsed().as_secs_f64());
    }
}
