//! The operator's routing table as backend specs, and the two ways the gateway follows it.
//!
//! The table is ConfigMap `<pipeline>-routes`, key `routes.json` (format version 1,
//! docs/KUBERNETES.md), next to `policy.json`, the pipeline's attestation policy. The gateway
//! reads it either from a file — the ConfigMap mounted as a volume, polled and re-read when
//! its bytes change (`--routes-file`) — or through the Kubernetes API with a watch
//! (`--routes-configmap`, feature `kubernetes`). Either way every listed endpoint is verified
//! by the gateway itself, pinned to the TLS key the operator saw; the table only says where
//! to look. A table that does not parse is refused as a whole and the previous one stays.
//!
//! The table's `policy.json` is read once, at start, when the gateway has no `--policy`: the
//! policy is then fixed and its digest is part of the gateway's attested scheme. A
//! `policy.json` that changes later is refused (`policy_not_attested`, logged) and the
//! attested policy stays: the operator delivers routes, never trust. A new policy takes a
//! new gateway, whose evidence clients check against the policy they expect.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    time::Duration,
};

use attest::{Policy, Role};
use serde::Deserialize;

use super::{BackendSpec, Pool};

use crate::error::{GatewayError, Result};

/// The format version this gateway reads.
pub const ROUTES_VERSION: u32 = 1;

// Unknown fields are ignored on purpose: the operator may add some without a version bump.
#[derive(Deserialize)]
struct Table {
    version: u32,
    #[serde(default)]
    components: BTreeMap<String, Vec<Route>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Route {
    ip: String,
    port: u16,
    tls_spki_sha256: String,
    model_identity: String,
    #[serde(default)]
    scheme_identity: Option<String>,
}

fn hex32(what: &str, component: &str, i: usize, s: &str) -> Result<[u8; 32]> {
    let mut out = [0u8; 32];
    hex::decode_to_slice(s.trim(), &mut out)
        .map_err(|_| GatewayError::Routes(format!("components.{component}[{i}].{what} is not 64 hex digits")))?;
    Ok(out)
}

/// Parses `routes.json` into the specs of the roles the gateway routes to (`gateway` entries
/// and unknown components are skipped).
pub fn parse(json: &str) -> Result<Vec<BackendSpec>> {
    let table: Table = serde_json::from_str(json).map_err(|e| GatewayError::Routes(format!("routes.json: {e}")))?;
    if table.version != ROUTES_VERSION {
        return Err(GatewayError::Routes(format!(
            "routes.json format version {} is not supported (this gateway reads version {ROUTES_VERSION})",
            table.version
        )));
    }
    let mut specs = Vec::new();
    for (component, routes) in &table.components {
        let Ok(role) = component.parse::<Role>() else { continue };
        for (i, r) in routes.iter().enumerate() {
            let ip: std::net::IpAddr = r
                .ip
                .parse()
                .map_err(|_| GatewayError::Routes(format!("components.{component}[{i}].ip is not an IP address")))?;
            if r.port == 0 {
                return Err(GatewayError::Routes(format!("components.{component}[{i}].port is 0")));
            }
            specs.push(BackendSpec {
                role,
                endpoint: std::net::SocketAddr::new(ip, r.port).to_string(),
                model_identity: Some(hex32("modelIdentity", component, i, &r.model_identity)?),
                scheme_identity: match &r.scheme_identity {
                    Some(s) if !s.is_empty() => Some(hex32("schemeIdentity", component, i, s)?),
                    _ => None,
                },
                tls_spki_sha256: Some(hex32("tlsSpkiSha256", component, i, &r.tls_spki_sha256)?),
            });
        }
    }
    Ok(specs)
}

/// Parses the ConfigMap's `policy.json`.
pub fn parse_policy(json: &str) -> Result<Policy> {
    Policy::from_json(json).map_err(|e| GatewayError::Routes(format!("policy.json: {e}")))
}

/// Where the routing table comes from.
#[derive(Clone, Debug)]
pub enum RoutesSource {
    /// `routes.json` in a file (a mounted ConfigMap); `policy`, when set, is its `policy.json`.
    File { routes: PathBuf, policy: Option<PathBuf>, poll: Duration },
    /// The ConfigMap itself, through the Kubernetes API.
    ConfigMap { name: String, namespace: String },
}

/// The sibling `policy.json` of a mounted routes file, if there is one.
pub fn sibling_policy(routes: &Path) -> Option<PathBuf> {
    let p = routes.with_file_name("policy.json");
    p.exists().then_some(p)
}

/// Reads the routes file (and its policy) once; what `follow_file` applies on each change.
pub fn read_file(routes: &Path, policy: Option<&Path>) -> Result<(Vec<BackendSpec>, Option<Policy>, Vec<u8>)> {
    let bytes = std::fs::read(routes).map_err(GatewayError::file(routes))?;
    let mut fingerprint = bytes.clone();
    let text =
        std::str::from_utf8(&bytes).map_err(|_| GatewayError::Routes(format!("{} is not UTF-8", routes.display())))?;
    let specs = parse(text)?;
    let policy = match policy {
        Some(p) => {
            let text = std::fs::read_to_string(p).map_err(GatewayError::file(p))?;
            fingerprint.extend_from_slice(text.as_bytes());
            Some(parse_policy(&text)?)
        }
        None => None,
    };
    Ok((specs, policy, fingerprint))
}

/// Compares a policy the routing table offers with the attested one (its digest): never
/// applied; a difference is logged as `policy_not_attested`. Returns whether it matched.
pub fn check_offered_policy(offered: &Policy, attested: &[u8; 32]) -> bool {
    match offered.digest() {
        Ok(d) if d == *attested => true,
        Ok(d) => {
            tracing::warn!(
                reason = "policy_not_attested",
                attested = %hex::encode(attested),
                offered = %hex::encode(d),
                "the routing table offers another backend policy than the one this gateway attests: kept the attested \
                 policy (a new policy takes a new gateway)"
            );
            false
        }
        Err(e) => {
            tracing::warn!(reason = "policy_not_attested", error = %e, "the routing table offers a policy that does not load");
            false
        }
    }
}

/// Polls the routes file and applies every change of its routes to `pool`; a change of its
/// `policy` file is only checked against `attested`. Runs until the pool's owner drops the
/// returned task.
pub fn follow_file(
    pool: Pool,
    routes: PathBuf,
    policy: Option<PathBuf>,
    attested: [u8; 32],
    poll: Duration,
    mut last: Vec<u8>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(poll).await;
            let (r, p) = (routes.clone(), policy.clone());
            let read = tokio::task::spawn_blocking(move || read_file(&r, p.as_deref())).await;
            match read {
                Ok(Ok((specs, offered, fingerprint))) => {
                    if fingerprint == last {
                        continue;
                    }
                    last = fingerprint;
                    tracing::info!(backends = specs.len(), "routing table changed");
                    if let Some(offered) = offered {
                        check_offered_policy(&offered, &attested);
                    }
                    pool.set_backends(&specs);
                }
                Ok(Err(e)) => tracing::warn!(error = %e, "routing table refused; keeping the previous one"),
                Err(e) => tracing::warn!(error = %e, "reading the routing table failed"),
            }
        }
    })
}

/// Reads the `policy.json` of ConfigMap `name` once, at start, waiting (and saying so)
/// until the operator has written a policy there (it writes `{}` until the spec is valid).
#[cfg(feature = "kubernetes")]
pub async fn configmap_policy(name: &str, namespace: &str) -> Result<Policy> {
    use k8s_openapi::api::core::v1::ConfigMap;

    let client =
        kube::Client::try_default().await.map_err(|e| GatewayError::Routes(format!("Kubernetes client: {e}")))?;
    let api: kube::Api<ConfigMap> = kube::Api::namespaced(client, namespace);
    let mut said = None::<String>;
    loop {
        let why = match api.get_opt(name).await {
            Ok(Some(cm)) => match cm.data.unwrap_or_default().get("policy.json").map(|s| s.trim().to_owned()) {
                Some(text) if !text.is_empty() && text != "{}" => return parse_policy(&text),
                _ => "no policy.json yet".to_owned(),
            },
            Ok(None) => "no such ConfigMap yet".to_owned(),
            Err(e) => format!("reading it failed: {e}"),
        };
        if said.as_ref() != Some(&why) {
            tracing::info!(configmap = %name, namespace = %namespace, state = %why, "waiting for the operator's backend policy");
            said = Some(why);
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// Watches ConfigMap `name` in `namespace` and applies its `routes.json` to `pool`; its
/// `policy.json` is only checked against `attested` (when the gateway took its policy from
/// there). A deleted ConfigMap routes nowhere.
#[cfg(feature = "kubernetes")]
pub async fn follow_configmap(
    pool: Pool,
    name: String,
    namespace: String,
    attested: Option<[u8; 32]>,
) -> Result<tokio::task::JoinHandle<()>> {
    use futures::StreamExt;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::runtime::{WatchStreamExt, watcher};

    let client =
        kube::Client::try_default().await.map_err(|e| GatewayError::Routes(format!("Kubernetes client: {e}")))?;
    let api: kube::Api<ConfigMap> = kube::Api::namespaced(client, &namespace);
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    Ok(tokio::spawn(async move {
        let mut events = watcher(api, config).default_backoff().boxed();
        let mut last: Option<(String, String)> = None;
        while let Some(event) = events.next().await {
            let cm = match event {
                Ok(watcher::Event::Apply(cm) | watcher::Event::InitApply(cm)) => cm,
                Ok(watcher::Event::Delete(_)) => {
                    tracing::warn!(configmap = %name, "routing table deleted: routing nowhere");
                    pool.set_backends(&[]);
                    last = None;
                    continue;
                }
                Ok(_) => continue,
                Err(e) => {
                    tracing::warn!(configmap = %name, error = %e, "watching the routing table");
                    continue;
                }
            };
            let data = cm.data.unwrap_or_default();
            let routes = data.get("routes.json").cloned().unwrap_or_default();
            let policy =
                if attested.is_some() { data.get("policy.json").cloned().unwrap_or_default() } else { String::new() };
            if last.as_ref() == Some(&(routes.clone(), policy.clone())) {
                continue;
            }
            let applied = (|| -> Result<()> {
                let specs = parse(&routes)?;
                if let Some(attested) = &attested
                    && last.as_ref().is_none_or(|(_, p)| *p != policy)
                {
                    match parse_policy(&policy) {
                        Ok(offered) => {
                            check_offered_policy(&offered, attested);
                        }
                        Err(e) => {
                            tracing::warn!(configmap = %name, reason = "policy_not_attested", error = %e, "policy.json refused")
                        }
                    }
                }
                tracing::info!(configmap = %name, backends = specs.len(), "routing table applied");
                pool.set_backends(&specs);
                Ok(())
            })();
            match applied {
                Ok(()) => last = Some((routes, policy)),
                Err(e) => {
                    tracing::warn!(configmap = %name, error = %e, "routing table refused; keeping the previous one")
                }
            }
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPKI: &str = "aa00000000000000000000000000000000000000000000000000000000000000";
    const MODEL: &str = "bb00000000000000000000000000000000000000000000000000000000000000";

    fn table(version: u32, extra: &str) -> String {
        format!(
            r#"{{"version":{version},"pipeline":"demo","namespace":"rag","generation":3,"newField":{{"x":1}},
            "components":{{
              "embedder":[{{"pod":"e-1","ip":"10.0.0.1","port":50051,"tlsSpkiSha256":"{SPKI}","modelIdentity":"{MODEL}","schemeIdentity":"{MODEL}","measurement":"00","future":true}}],
              "gateway":[{{"pod":"g","ip":"10.0.0.9","port":50051,"tlsSpkiSha256":"{SPKI}","modelIdentity":"{MODEL}","schemeIdentity":"{MODEL}","measurement":"00"}}],
              "generator":[{{"pod":"g-1","ip":"fd00::1","port":50051,"tlsSpkiSha256":"{SPKI}","modelIdentity":"{MODEL}","schemeIdentity":"","measurement":"00"}}],
              "reranker":[]{extra}
            }}}}"#
        )
    }

    #[test]
    fn the_operator_format_becomes_pinned_specs() {
        let specs = parse(&table(1, "")).unwrap();
        assert_eq!(specs.len(), 2, "gateway entries are not backends: {specs:?}");
        let e = specs.iter().find(|s| s.role == Role::Embedder).unwrap();
        assert_eq!(e.endpoint, "10.0.0.1:50051");
        assert_eq!(e.tls_spki_sha256.unwrap()[0], 0xaa);
        assert_eq!(e.model_identity.unwrap()[0], 0xbb);
        assert!(e.scheme_identity.is_some());
        let g = specs.iter().find(|s| s.role == Role::Generator).unwrap();
        assert_eq!(g.endpoint, "[fd00::1]:50051", "IPv6 endpoints are bracketed");
        assert_eq!(g.scheme_identity, None);
    }

    #[test]
    fn other_versions_and_bad_entries_are_refused() {
        let e = parse(&table(2, "")).unwrap_err().to_string();
        assert!(e.contains("version 2"), "{e}");
        let bad = table(1, "").replace(SPKI, "xyz");
        assert!(parse(&bad).unwrap_err().to_string().contains("tlsSpkiSha256"));
        let bad_ip = table(1, "").replace("10.0.0.1", "embedder.local");
        assert!(parse(&bad_ip).unwrap_err().to_string().contains(".ip"));
        assert!(parse("{").is_err());
        // Components this gateway does not know are skipped, not refused.
        let future =
            table(1, r#","summarizer":[{"ip":"10.0.0.3","port":1,"tlsSpkiSha256":"00","modelIdentity":"00"}]"#);
        assert_eq!(parse(&future).unwrap().len(), 2);
    }
}
