//! Where the process's diagnostics go: logs to stderr (`RUST_LOG`, default `info`) and, only
//! when a service is given an OTLP endpoint, traces over OTLP/gRPC.
//!
//! The exporter sends the RPC spans of `server::rpc` and the events inside them — method,
//! status code, counts; never request text — under `service.name` `gelo-<role>` (unless
//! `OTEL_SERVICE_NAME` says otherwise). It runs on a one-thread runtime of its own, so
//! exporting never competes with the service's runtime, and is flushed when the process
//! ends normally. The collector is reached over plaintext gRPC (`http://`): meant for a
//! collector beside the service (a sidecar, a node agent).

use anyhow::{Context, Result};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{SpanExporter, WithExportConfig};
use opentelemetry_sdk::{Resource, trace::SdkTracerProvider};
use tracing::Level;
use tracing_subscriber::{EnvFilter, Layer, filter::Targets, layer::SubscriberExt, util::SubscriberInitExt};

/// Where and as what to export traces.
#[derive(Clone, Debug)]
pub struct Otlp {
    /// `http://host:4317`.
    pub endpoint: String,
    pub service_name: String,
}

/// Keeps the exporter alive; dropping it flushes the spans still queued.
#[derive(Default)]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(p) = self.provider.take()
            && let Err(e) = p.shutdown()
        {
            eprintln!("flushing traces: {e}");
        }
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

/// Installs the global subscriber: the log layer and, with `otlp`, the trace exporter.
pub fn init(otlp: Option<Otlp>) -> Result<Telemetry> {
    // Colours only on a terminal: logs redirected to a file or a pipe stay plain text.
    let logs = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()));
    let Some(otlp) = otlp else {
        tracing_subscriber::registry().with(logs).init();
        return Ok(Telemetry::default());
    };
    // tonic's channel needs a runtime to live on; the SDK's batch thread drives exports.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("gelo-otlp")
        .enable_all()
        .build()
        .context("starting the OTLP exporter's runtime")?;
    let exporter = runtime
        .block_on(async { SpanExporter::builder().with_tonic().with_endpoint(otlp.endpoint.clone()).build() })
        .with_context(|| format!("OTLP exporter for {}", otlp.endpoint))?;
    let mut resource = Resource::builder();
    if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
        resource = resource.with_service_name(otlp.service_name.clone());
    }
    let provider = SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource.build()).build();
    // Only our RPC spans and our events inside them: never the transport's own spans
    // (h2, hyper, tonic — the exporter's included, which would trace itself).
    let ours = Targets::new().with_target(server::rpc::TARGET, Level::INFO).with_target("server", Level::INFO);
    let traces = tracing_opentelemetry::layer().with_tracer(provider.tracer("gelo")).with_filter(ours);
    tracing_subscriber::registry().with(logs).with(traces).init();
    tracing::info!(endpoint = %otlp.endpoint, service = %otlp.service_name, "exporting traces over OTLP/gRPC");
    Ok(Telemetry { provider: Some(provider), runtime: Some(runtime) })
}
