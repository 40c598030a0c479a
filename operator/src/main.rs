//! `gelo-operator`: `run` the controller, print the CRD (`crdgen`), or print every object the
//! reconciler would apply for a pipeline (`manifests`, for offline schema validation).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use axum::routing::get;
use clap::{Parser, Subcommand};
use gelo_operator::attestor::RaTlsAttestor;
use gelo_operator::controller::{self, RunConfig};
use gelo_operator::crd::PrivateRAGPipeline;
use gelo_operator::leader::LeaseLock;
use gelo_operator::metrics::Metrics;
use gelo_operator::telemetry::{self, LogFormat};
use gelo_operator::{Error, Result, resources, validate};
use tracing::{error, info, warn};

#[derive(Parser)]
#[command(name = "gelo-operator", version, about = "Kubernetes operator for PrivateRAGPipeline")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the controller (in a cluster, or against the current kubeconfig).
    Run(RunArgs),
    /// Print the CustomResourceDefinition YAML generated from the Rust types.
    Crdgen,
    /// Print, as YAML documents, every object the reconciler applies for a pipeline file
    /// (as if all its models were fetched). For offline schema validation.
    Manifests {
        /// A PrivateRAGPipeline manifest (YAML). Without it: the built-in test pipeline
        /// (hub sources, a GPU, a confidential runtime class).
        pipeline: Option<PathBuf>,
        /// Namespace to assume when the manifest has none.
        #[arg(long, default_value = "default")]
        namespace: String,
    },
}

#[derive(clap::Args)]
struct RunArgs {
    /// Serve /metrics, /healthz and /readyz here.
    #[arg(long, env = "GELO_OPERATOR_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    metrics_addr: SocketAddr,
    /// Watch this namespace only (default: all namespaces).
    #[arg(long, env = "GELO_OPERATOR_NAMESPACE")]
    namespace: Option<String>,
    /// Take a Lease before reconciling, so replicas can stand by.
    #[arg(long, env = "GELO_OPERATOR_LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set)]
    leader_elect: bool,
    #[arg(long, env = "GELO_OPERATOR_LEASE_NAME", default_value = "gelo-operator")]
    lease_name: String,
    /// Namespace of the Lease (default: the pod's namespace, from POD_NAMESPACE).
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    lease_namespace: String,
    #[arg(long, default_value_t = 15)]
    lease_seconds: u64,
    /// This replica's identity (default: the pod name, from POD_NAME, else the hostname).
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// Time allowed for one pod's handshake and challenge.
    #[arg(long, env = "GELO_OPERATOR_ATTEST_TIMEOUT_SECONDS", default_value_t = 10)]
    attest_timeout_seconds: u64,
    #[arg(long, env = "GELO_OPERATOR_LOG_FORMAT", value_enum, default_value = "json")]
    log_format: LogFormat,
    /// Let pipelines trust a mock root from a Secret (development and test clusters only;
    /// mock evidence proves nothing about the host).
    #[arg(long, env = "GELO_OPERATOR_ALLOW_MOCK_ROOTS", default_value_t = false, action = clap::ArgAction::Set)]
    allow_mock_roots: bool,
    /// A Hugging Face hub mirror (same URL layout) the model fetch Jobs download from, e.g.
    /// an air-gapped cluster's; empty: huggingface.co. The pinned commit and model identity
    /// are checked whichever hub answers.
    #[arg(long, env = "GELO_OPERATOR_HUB_ENDPOINT", default_value = "", value_parser = hub_endpoint)]
    hub_endpoint: String,
}

/// An `http(s)://host[:port][/path]` URL without a trailing slash, or empty.
fn hub_endpoint(s: &str) -> std::result::Result<String, String> {
    let s = s.trim_end_matches('/');
    if s.is_empty() {
        return Ok(String::new());
    }
    match s.strip_prefix("https://").or_else(|| s.strip_prefix("http://")) {
        Some(r)
            if !r.is_empty()
                && !r.starts_with('/')
                && !r.contains(|c: char| c.is_whitespace() || c == '?' || c == '#') =>
        {
            Ok(s.to_string())
        }
        _ => Err(format!("`{s}` is not an http(s) URL of a hub (e.g. https://hub.internal)")),
    }
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Crdgen => gelo_operator::crd_yaml().map(|y| print!("{y}")),
        Command::Manifests { pipeline, namespace } => manifests(&pipeline, &namespace),
        Command::Run(args) => match tokio::runtime::Runtime::new() {
            Ok(rt) => rt.block_on(run(args)),
            Err(e) => Err(Error::Io { path: "tokio runtime".into(), source: e }),
        },
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gelo-operator: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn manifests(path: &Option<PathBuf>, namespace: &str) -> Result<()> {
    let mut p: PrivateRAGPipeline = match path {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|source| Error::Io { path: path.display().to_string(), source })?;
            serde_yaml::from_str(&text)?
        }
        None => PrivateRAGPipeline::test(),
    };
    if p.metadata.namespace.is_none() {
        p.metadata.namespace = Some(namespace.into());
    }
    // Owner references need a uid; a stored object would have one.
    p.metadata.uid.get_or_insert_with(|| "00000000-0000-4000-8000-000000000000".into());
    let valid = validate::validate(&p.spec).map_err(|problems| Error::InvalidPipeline(problems.join("; ")))?;
    for obj in resources::all_objects(&p, &valid)? {
        print!("---\n{}", serde_yaml::to_string(&obj)?);
    }
    Ok(())
}

async fn run(args: RunArgs) -> Result<()> {
    telemetry::init(args.log_format);
    let client = kube::Client::try_default().await.map_err(Error::Kube)?;
    let metrics = Metrics::new();
    let identity = args
        .identity
        .clone()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| format!("gelo-operator-{}", std::process::id()));

    let listener = tokio::net::TcpListener::bind(args.metrics_addr)
        .await
        .map_err(|source| Error::Io { path: args.metrics_addr.to_string(), source })?;
    let m = metrics.clone();
    let app = axum::Router::new()
        .route(
            "/metrics",
            get(move || {
                let m = m.clone();
                async move {
                    match m.render() {
                        Ok(text) => (
                            StatusCode::OK,
                            [("content-type", "application/openmetrics-text; version=1.0.0; charset=utf-8")],
                            text,
                        ),
                        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, [("content-type", "text/plain")], e.to_string()),
                    }
                }
            }),
        )
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(|| async { "ok" }));
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            error!(error = %e, "metrics server stopped");
        }
    });

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let lease = if args.leader_elect {
        let lock = Arc::new(LeaseLock::new(
            client.clone(),
            &args.lease_namespace,
            &args.lease_name,
            &identity,
            Duration::from_secs(args.lease_seconds.max(2)),
        ));
        info!(lease = %args.lease_name, holder = %identity, "waiting for leadership");
        loop {
            match lock.try_acquire_or_renew().await {
                Ok(true) => break,
                Ok(false) => {}
                Err(e) => warn!(error = %e, "leader election attempt failed"),
            }
            tokio::select! {
                _ = tokio::time::sleep(lock.duration() / 3) => {}
                _ = tokio::signal::ctrl_c() => return Ok(()),
            }
        }
        metrics.leader.set(1);
        info!(holder = %identity, "leading");
        // Renew at a third of the lease; if no renewal succeeds within the lease duration,
        // another replica may lead: stop reconciling.
        let (renewer, stop) = (lock.clone(), stop_tx.clone());
        tokio::spawn(async move {
            let mut last_ok = std::time::Instant::now();
            loop {
                tokio::time::sleep(renewer.duration() / 3).await;
                match renewer.try_acquire_or_renew().await {
                    Ok(true) => last_ok = std::time::Instant::now(),
                    Ok(false) => warn!("lease renewal lost to another holder"),
                    Err(e) => warn!(error = %e, "lease renewal failed"),
                }
                if last_ok.elapsed() >= renewer.duration() {
                    let _ = stop.send(true);
                    return;
                }
            }
        });
        Some(lock)
    } else {
        None
    };

    let mut lost = stop_rx.clone();
    let shutdown = async move {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = lost.wait_for(|s| *s) => {}
        }
    };
    let attestor = Arc::new(RaTlsAttestor::new(Duration::from_secs(args.attest_timeout_seconds.max(1))));
    if args.allow_mock_roots {
        warn!("mock roots allowed: pipelines may trust evidence from a software test PKI");
    }
    // An empty GELO_OPERATOR_NAMESPACE (the chart's default) means all namespaces.
    let namespace = args.namespace.clone().filter(|n| !n.is_empty());
    let hub_endpoint = Some(args.hub_endpoint.clone()).filter(|e| !e.is_empty());
    if let Some(e) = &hub_endpoint {
        info!(endpoint = %e, "models are fetched from a hub mirror");
    }
    let config =
        RunConfig { namespace, instance: Some(identity), allow_mock_roots: args.allow_mock_roots, hub_endpoint };
    controller::run(client, config, metrics.clone(), attestor, shutdown).await;
    metrics.leader.set(0);

    if *stop_rx.borrow() {
        return Err(Error::LeadershipLost);
    }
    if let Some(lock) = lease {
        lock.release().await;
    }
    info!("stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::hub_endpoint;

    #[test]
    fn a_hub_endpoint_is_an_http_url_or_empty() {
        assert_eq!(hub_endpoint("").unwrap(), "");
        assert_eq!(hub_endpoint("https://hub.internal/").unwrap(), "https://hub.internal");
        assert_eq!(hub_endpoint("http://10.0.0.7:8080/hf").unwrap(), "http://10.0.0.7:8080/hf");
        for bad in ["ftp://hub", "hub.internal", "https://", "https:///x", "https://a b", "https://h?x=1"] {
            assert!(hub_endpoint(bad).is_err(), "{bad} accepted");
        }
    }
}
