//! Prometheus metrics of a service. Labels carry method names and status codes only —
//! never request content.

use std::sync::{Arc, atomic::AtomicU64};

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub method: String,
    pub code: String,
}

/// Everything a service exports.
#[derive(Clone)]
pub struct Metrics {
    registry: Arc<std::sync::Mutex<Registry>>,
    pub requests: Family<RequestLabels, Counter>,
    /// By method and status code; a streaming call's latency covers its whole stream.
    pub latency: Family<RequestLabels, Histogram>,
    pub batch_items: Histogram,
    pub queue_depth: Gauge,
    pub tokens_in: Counter,
    pub tokens_out: Counter,
    pub integrity_failures: Counter,
    pub engine_seconds: Counter<f64, AtomicU64>,
    pub tee_seconds: Counter<f64, AtomicU64>,
    pub active_sequences: Gauge,
}

impl Metrics {
    pub fn new(role: &str) -> Self {
        let mut registry = Registry::with_prefix("gelo");
        let requests = Family::<RequestLabels, Counter>::default();
        let latency = Family::<RequestLabels, Histogram>::new_with_constructor(|| {
            Histogram::new([0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0])
        });
        let batch_items = Histogram::new([1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0]);
        let m = Metrics {
            registry: Arc::default(),
            requests,
            latency,
            batch_items,
            queue_depth: Gauge::default(),
            tokens_in: Counter::default(),
            tokens_out: Counter::default(),
            integrity_failures: Counter::default(),
            engine_seconds: Counter::default(),
            tee_seconds: Counter::default(),
            active_sequences: Gauge::default(),
        };
        let sub = registry.sub_registry_with_label(("role".into(), role.to_string().into()));
        sub.register("requests", "gRPC requests by method and status code", m.requests.clone());
        sub.register(
            "request_seconds",
            "gRPC request latency by method and status code (streams: until the last message)",
            m.latency.clone(),
        );
        sub.register("batch_items", "Items (texts, pairs or sequences) per forward pass", m.batch_items.clone());
        sub.register("queue_depth", "Requests waiting for the model", m.queue_depth.clone());
        sub.register("input_tokens", "Tokens processed from requests", m.tokens_in.clone());
        sub.register("output_tokens", "Tokens generated", m.tokens_out.clone());
        sub.register("integrity_failures", "Engine products that failed U-Verify", m.integrity_failures.clone());
        sub.register("engine_seconds", "Time spent in the untrusted engine", m.engine_seconds.clone());
        sub.register(
            "tee_seconds",
            "Time spent in the TEE around engine calls (masking, attention, norms)",
            m.tee_seconds.clone(),
        );
        sub.register("active_sequences", "Sequences in the generator's decode batch", m.active_sequences.clone());
        *m.registry.lock().expect("registry") = registry;
        m
    }

    /// Records one finished request (a stream: once it has ended).
    pub fn observe(&self, method: &str, code: tonic::Code, seconds: f64) {
        let labels = RequestLabels { method: method.into(), code: format!("{code:?}") };
        self.latency.get_or_create(&labels).observe(seconds);
        self.requests.get_or_create(&labels).inc();
    }

    /// Splits a forward pass's wall time into engine and TEE time, given the engine's
    /// cumulative seconds before and after.
    pub fn account(&self, wall: f64, engine_before: f64, engine_after: f64) {
        let engine = (engine_after - engine_before).max(0.0);
        self.engine_seconds.inc_by(engine);
        self.tee_seconds.inc_by((wall - engine).max(0.0));
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry.lock().expect("registry"))
            .expect("writing to a String");
        out
    }
}
