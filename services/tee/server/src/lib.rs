//! The model services: embedder, reranker and generator over gRPC.
//!
//! Each service is a full GELO executor with its own engine, serving only after its model
//! is loaded (and its identity checked) and its weights are provisioned. Requests are
//! validated against [`limits::Limits`] before they reach a model; errors become gRPC
//! statuses in one place ([`status`]); no prompt, document or token text is ever logged.
//!
//! * [`config`]: a service's configuration ([`ServiceConfig`]) and how every role's is read
//!   from defaults, file, environment and flags.
//! * [`run()`]: a service from its configuration, engine to port (what `gelo embedder` runs).
//! * [`serve`]: listener, RA-TLS (on by default), health, reflection, attestation, metrics.
//! * [`batcher`]: dynamic batching for the embedder and reranker.
//! * [`generator`]: continuous batching of decode steps.
//! * [`health`]: serving state; an engine that can no longer serve turns it NOT_SERVING.
//! * [`rpc`]: each RPC's span and request metrics (method, status code, counts; never text).

pub mod batcher;
pub mod config;
pub mod embedder;
pub mod generator;
pub mod health;
pub mod limits;
pub mod metrics;
pub mod remap;
pub mod reranker;
pub mod rpc;
pub mod run;
pub mod serve;
pub mod status;

pub use config::{Role, ServiceConfig};
pub use health::Health;
pub use limits::Limits;
pub use metrics::Metrics;
pub use run::{ServiceEngine, run};
pub use serve::{ServeOptions, Transport, serve};

/// Work that must not block the async runtime runs on its own OS thread; this is how long
/// a handler waits for a batch slot before it reports the service as overloaded.
pub const QUEUE_WAIT: std::time::Duration = std::time::Duration::from_secs(30);
