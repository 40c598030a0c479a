//! Reconciler scenarios against the fake API server (real HTTP on loopback), in the style
//! of controller-rs: each test drives `reconcile` through one story and checks what the API
//! server ends up holding. The attestor is scripted; the real one is exercised in
//! `operator_binary.rs`.

mod support;

use std::sync::Arc;
use std::time::Duration;

use gelo_operator::attestor::{Rejection, Script, ScriptedAttestor};
use gelo_operator::controller::{Context, FINALIZER, reconcile};
use gelo_operator::crd::{Component, HubSource, PrivateRAGPipeline, TrustedRootSpec};
use gelo_operator::fixtures::{self, MOCK_SECRET, REVISION};
use gelo_operator::metrics::Metrics;
use gelo_operator::resources::{ATTESTED_LABEL, IDENTITY_ANNOTATION, REVISION_ANNOTATION, ROUTES_KEY};
use gelo_operator::routes::RoutingTable;
use kube::runtime::controller::Action;
use serde_json::{Value, json};
use support::*;

const NS: &str = "rag";
const NAME: &str = "demo";

struct World {
    api: FakeApiServer,
    attestor: Arc<ScriptedAttestor>,
    ctx: Arc<Context>,
    metrics: Arc<Metrics>,
}

impl World {
    /// A fake cluster holding `p` and the mock-root Secret.
    async fn new(p: PrivateRAGPipeline) -> Self {
        let api = FakeApiServer::start().await;
        api.insert(mock_root_secret(NS, MOCK_SECRET, &throwaway_root_pem()));
        let mut obj = serde_json::to_value(&p).expect("pipeline serializes");
        // The server assigns uid and resourceVersion.
        obj["metadata"].as_object_mut().map(|m| {
            m.remove("uid");
            m.remove("resourceVersion");
            m.remove("generation")
        });
        api.insert(obj);
        let attestor = Arc::new(ScriptedAttestor::new());
        let metrics = Metrics::new();
        let ctx = Arc::new(
            Context::new(api.client(), metrics.clone(), attestor.clone(), Some("test".into())).with_mock_roots(true),
        );
        Self { api, attestor, ctx, metrics }
    }

    async fn reconcile(&self) -> Action {
        let p = stored_pipeline(&self.api, NS, NAME);
        reconcile(Arc::new(p), self.ctx.clone()).await.expect("reconcile succeeds")
    }

    fn pipeline(&self) -> PrivateRAGPipeline {
        stored_pipeline(&self.api, NS, NAME)
    }

    fn routes(&self) -> RoutingTable {
        let cm = self.api.get(CONFIGMAPS, NS, "demo-routes").expect("routes ConfigMap");
        serde_json::from_str(cm["data"][ROUTES_KEY].as_str().expect("routes.json")).expect("routes decode")
    }

    /// One ready pod per component, each presenting the pinned identity.
    fn honest_pods(&self) {
        for (i, c) in Component::ALL.into_iter().enumerate() {
            let name = format!("demo-{c}-0");
            self.api.insert(ready_pod(NS, NAME, c, &name, &format!("10.0.0.{}", i + 10), 50051));
            self.attestor.set(&name, Script::Presents { model_identity: fixtures::identity_bytes(c) });
        }
    }

    /// Reconciles from a stored, finalized pipeline until every owned object exists and
    /// every fetch Job succeeded.
    async fn deployed(&self) {
        self.reconcile().await;
        complete_all_jobs(&self.api, NS);
        self.reconcile().await;
    }

    fn events(&self) -> Vec<Value> {
        self.api.list(EVENTS)
    }
}

fn owned_by(obj: &Value, uid: &str) -> bool {
    obj.pointer("/metadata/ownerReferences").and_then(Value::as_array).is_some_and(|refs| {
        refs.iter().any(|r| {
            r["uid"] == json!(uid) && r["controller"] == json!(true) && r["kind"] == json!("PrivateRAGPipeline")
        })
    })
}

#[tokio::test]
async fn the_finalizer_is_added_before_anything_is_created() {
    let w = World::new(PrivateRAGPipeline::test()).await;
    let action = w.reconcile().await;
    assert_eq!(action, Action::await_change(), "the finalizer patch itself triggers the next reconcile");
    assert_eq!(w.pipeline().metadata.finalizers, Some(vec![FINALIZER.to_string()]));
    assert!(w.api.list(DEPLOYMENTS).is_empty() && w.api.list(JOBS).is_empty());
    let patch = w.api.requests().into_iter().find(|r| r.method == "PATCH").expect("a patch");
    assert!(patch.content_type.starts_with("application/json-patch"), "{}", patch.content_type);
}

#[tokio::test]
async fn every_owned_object_is_created_with_an_owner_reference() {
    let w = World::new(PrivateRAGPipeline::test().finalized()).await;
    let uid = w.pipeline().metadata.uid.expect("uid");
    w.reconcile().await;

    // Models first: hub sources get a PVC and a fetch Job; nothing serves until fetched,
    // except the gateway, whose files are on an existing volume.
    let mut pvcs = w.api.names(PVCS);
    pvcs.sort();
    assert_eq!(pvcs, ["demo-embedder-models", "demo-generator-models", "demo-reranker-models"]);
    let rev12 = &REVISION[..12];
    let mut jobs = w.api.names(JOBS);
    jobs.sort();
    assert_eq!(
        jobs,
        [
            format!("demo-embedder-fetch-{rev12}"),
            format!("demo-generator-fetch-{rev12}"),
            format!("demo-reranker-fetch-{rev12}")
        ]
    );
    assert_eq!(w.api.names(DEPLOYMENTS), ["demo-gateway"]);
    let fetching = w.pipeline();
    let models = condition(&fetching, "ModelsReady").expect("ModelsReady");
    assert_eq!((models.status.as_str(), models.reason.as_str()), ("False", "Fetching"));

    // The fetch Job runs exactly the command the `gelo` binary implements.
    let job = w.api.get(JOBS, NS, &format!("demo-embedder-fetch-{rev12}")).expect("job");
    let args: Vec<&str> = job
        .pointer("/spec/template/spec/containers/0/args")
        .and_then(Value::as_array)
        .expect("args")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(
        args,
        [
            "model",
            "fetch",
            "--repo",
            "sentence-transformers/all-MiniLM-L6-v2",
            "--revision",
            REVISION,
            "--out",
            "/models/embedder",
            "--expect-identity",
            fixtures::EMBEDDER_IDENTITY
        ]
    );

    complete_all_jobs(&w.api, NS);
    w.reconcile().await;
    let mut deployments = w.api.names(DEPLOYMENTS);
    deployments.sort();
    assert_eq!(deployments, ["demo-embedder", "demo-gateway", "demo-generator", "demo-reranker"]);
    let mut services = w.api.names(SERVICES);
    services.sort();
    assert_eq!(services, ["demo-embedder", "demo-gateway", "demo-generator", "demo-reranker"]);
    assert!(w.api.get(CONFIGMAPS, NS, "demo-routes").is_some());
    for (resource, name) in [
        ("core/v1/serviceaccounts", "demo-gateway"),
        ("rbac.authorization.k8s.io/v1/roles", "demo-gateway"),
        ("rbac.authorization.k8s.io/v1/rolebindings", "demo-gateway"),
    ] {
        assert!(w.api.get(resource, NS, name).is_some(), "{resource} {name}");
    }

    // Every object we created names the pipeline as its controlling owner.
    for resource in
        [PVCS, JOBS, DEPLOYMENTS, SERVICES, CONFIGMAPS, "core/v1/serviceaccounts", "rbac.authorization.k8s.io/v1/roles"]
    {
        for obj in w.api.list(resource) {
            assert!(owned_by(&obj, &uid), "{resource} {} has no owner reference", obj["metadata"]["name"]);
        }
    }

    // The generator runs in the confidential runtime class with its GPU.
    let generator = w.api.get(DEPLOYMENTS, NS, "demo-generator").expect("generator");
    assert_eq!(generator.pointer("/spec/template/spec/runtimeClassName"), Some(&json!("kata-qemu-snp")));
    assert_eq!(generator.pointer("/spec/template/spec/containers/0/resources/limits/amd.com~1gpu"), Some(&json!("1")));
    // ... and asks `gelo` for its GPU engine by the spec `gelo --engine` parses (cpu | vulkan[:N|:name]).
    let args: Vec<&str> = generator
        .pointer("/spec/template/spec/containers/0/args")
        .and_then(Value::as_array)
        .expect("args")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let engine = args.iter().position(|a| *a == "--engine").map(|i| args[i + 1]);
    assert_eq!(engine, Some("vulkan"), "{args:?}");
    // The spec names no protection, so the pod gets the secure default: sealed.
    let protection = args.iter().position(|a| *a == "--protection").map(|i| args[i + 1]);
    assert_eq!(protection, Some("sealed"), "{args:?}");
    // U-Verify at the services' default, explicit in the pod (it matters under masked).
    let probes = args.iter().position(|a| *a == "--verify-probes").map(|i| args[i + 1]);
    assert_eq!(probes, Some("2"), "{args:?}");
    // The probes ask the plain metrics port, never the RA-TLS port (a TCP probe there is a
    // handshake cut short, logged by the service every period).
    let c = generator.pointer("/spec/template/spec/containers/0").expect("container");
    for (probe, path) in [("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")] {
        assert_eq!(c.pointer(&format!("/{probe}/httpGet/path")), Some(&json!(path)), "{probe}");
        assert_eq!(c.pointer(&format!("/{probe}/httpGet/port")), Some(&json!("metrics")), "{probe}");
        assert_eq!(c.pointer(&format!("/{probe}/tcpSocket")), None, "{probe}");
    }
    // Services route only to attested pods.
    let svc = w.api.get(SERVICES, NS, "demo-gateway").expect("gateway service");
    assert_eq!(svc.pointer("/spec/selector/gelo.dev~1attested"), Some(&json!("true")));
    assert_eq!(svc.pointer("/spec/type"), Some(&json!("NodePort")));

    // Every write of an owned object was a server-side apply by our field manager, forced
    // only for the routing table (another manager's field elsewhere is reported, not taken;
    // e2e/apiserver shows it against a real API server).
    let applies: Vec<_> = w
        .api
        .requests()
        .into_iter()
        .filter(|r| r.method == "PATCH" && !r.path.ends_with("/status") && !r.path.contains("/pods/"))
        .collect();
    assert!(!applies.is_empty());
    for r in applies.iter().filter(|r| !r.path.contains("privateragpipelines")) {
        assert!(r.content_type.starts_with("application/apply-patch"), "{} {}", r.path, r.content_type);
        assert!(r.query.contains("fieldManager=gelo-operator"), "{}", r.query);
        let routes = r.path.ends_with("/configmaps/demo-routes");
        assert_eq!(r.query.contains("force=true"), routes, "{} {}", r.path, r.query);
    }
}

#[tokio::test]
async fn status_is_applied_and_reports_ready_when_every_component_is_verified() {
    let w = World::new(PrivateRAGPipeline::test().finalized()).await;
    w.deployed().await;
    w.honest_pods();
    let action = w.reconcile().await;
    assert_eq!(action, Action::requeue(Duration::from_secs(30)), "the attestation period drives the loop");

    let p = w.pipeline();
    let status = p.status.clone().expect("status");
    assert_eq!(status.observed_generation, Some(1));
    for t in ["ModelsReady", "Attested", "Ready"] {
        assert_eq!(condition(&p, t).map(|c| c.status.as_str()), Some("True"), "{t}: {:?}", condition(&p, t));
    }
    assert_eq!(status.verified.as_deref(), Some("4/4"));
    for c in &status.components {
        assert_eq!((c.desired, c.ready, c.verified), (1, 1, 1), "{}", c.name);
        assert_eq!(
            c.model_identity.as_deref(),
            Some(fixtures::identity(Component::parse(&c.name).expect("component")))
        );
    }
    assert_eq!(status.verified_endpoints.len(), 4);
    let status_patch = w.api.requests().into_iter().rfind(|r| r.path.ends_with("/status")).expect("status write");
    assert_eq!(status_patch.method, "PATCH");
    assert!(status_patch.content_type.starts_with("application/apply-patch"));

    let routes = w.routes();
    for c in Component::ALL {
        let r = &routes.components[c.as_str()];
        assert_eq!(r.len(), 1, "{c}");
        assert_eq!(r[0].model_identity, fixtures::identity(c));
    }
    // The attestor was asked for exactly the pinned identity of each component.
    for (pod, expected) in w.attestor.calls() {
        assert!(pod.starts_with(&format!("demo-{}", expected.component)));
        assert_eq!(expected.model_identity, fixtures::identity_bytes(expected.component));
    }
    for pod in w.api.list(PODS) {
        assert_eq!(pod.pointer("/metadata/labels/gelo.dev~1attested"), Some(&json!("true")));
    }

    // A second pass with nothing changed writes no status and no routes.
    w.api.clear_requests();
    w.reconcile().await;
    assert!(!w.api.requests().iter().any(|r| r.path.ends_with("/status")), "unchanged status must not be re-applied");
}

#[tokio::test]
async fn a_pod_whose_evidence_fails_is_excluded_and_an_event_names_why() {
    let w = World::new(PrivateRAGPipeline::test().finalized()).await;
    w.deployed().await;
    w.honest_pods();
    w.api.insert(ready_pod(NS, NAME, Component::Embedder, "demo-embedder-1", "10.0.0.99", 50051));
    w.attestor
        .set("demo-embedder-1", Script::Presents { model_identity: fixtures::identity_bytes(Component::Embedder) });
    w.reconcile().await;
    assert_eq!(w.routes().components["embedder"].len(), 2);

    // The second embedder now presents evidence that fails policy: it leaves the routing
    // table in the next round and loses the label its Service selects on.
    w.attestor.set(
        "demo-embedder-1",
        Script::Rejected(Rejection::new("measurement_not_allowed", "launch measurement 00ff.. is not allowed")),
    );
    w.reconcile().await;
    let routes = w.routes();
    assert_eq!(routes.pods().collect::<Vec<_>>().len(), 4);
    assert!(!routes.pods().any(|p| p == "demo-embedder-1"));
    let pod = w.api.get(PODS, NS, "demo-embedder-1").expect("pod");
    assert!(pod.pointer(&format!("/metadata/labels/{}", ATTESTED_LABEL.replace('/', "~1"))).is_none());

    let event = w
        .events()
        .into_iter()
        .find(|e| e["reason"] == json!("MeasurementNotAllowed"))
        .expect("an Event with the rejection reason");
    assert_eq!(event["type"], json!("Warning"));
    assert_eq!(event.pointer("/regarding/kind"), Some(&json!("PrivateRAGPipeline")));
    assert_eq!(event.pointer("/related/name"), Some(&json!("demo-embedder-1")));
    assert!(event["note"].as_str().expect("note").contains("demo-embedder-1"));

    let p = w.pipeline();
    let attested = condition(&p, "Attested").expect("Attested");
    assert_eq!((attested.status.as_str(), attested.reason.as_str()), ("False", "EvidenceRejected"));
    assert!(attested.message.contains("demo-embedder-1 (measurement_not_allowed)"), "{}", attested.message);
    // Still Ready: every component keeps a verified route; the bad pod is just not one.
    assert_eq!(condition(&p, "Ready").map(|c| c.status.as_str()), Some("True"));
    let embedder =
        p.status.as_ref().expect("status").components.iter().find(|c| c.name == "embedder").cloned().expect("embedder");
    assert_eq!((embedder.ready, embedder.verified), (2, 1));
    assert_eq!(w.metrics.attestation_count("embedder", "rejected", "measurement_not_allowed"), 1);
}

#[tokio::test]
async fn a_model_revision_change_rolls_the_component_once_fetched() {
    let w = World::new(PrivateRAGPipeline::test().finalized()).await;
    w.deployed().await;
    w.honest_pods();
    w.reconcile().await;

    const NEW_REV: &str = "fedcba9876543210fedcba9876543210fedcba98";
    const NEW_ID: &str = "5555555555555555555555555555555555555555555555555555555555555555";
    w.api.update(PIPELINES, NS, NAME, |p| {
        p["spec"]["embedder"]["model"]["hub"]["revision"] = json!(NEW_REV);
        p["spec"]["embedder"]["model"]["modelIdentity"] = json!(NEW_ID);
    });
    assert_eq!(w.pipeline().metadata.generation, Some(2));
    w.reconcile().await;

    // The new revision is being fetched; the Deployment keeps serving the old one, and the
    // old pods are still verified against the old pin.
    let new_job = format!("demo-embedder-fetch-{}", &NEW_REV[..12]);
    assert!(w.api.get(JOBS, NS, &new_job).is_some());
    let d = w.api.get(DEPLOYMENTS, NS, "demo-embedder").expect("deployment");
    assert_eq!(
        d.pointer(&format!("/spec/template/metadata/annotations/{}", REVISION_ANNOTATION.replace('/', "~1"))),
        Some(&json!(REVISION))
    );
    assert_eq!(w.routes().components["embedder"].len(), 1);
    let p = w.pipeline();
    assert_eq!(condition(&p, "ModelsReady").map(|c| c.reason.as_str()), Some("Fetching"));
    assert_eq!(condition(&p, "Ready").map(|c| c.status.as_str()), Some("True"), "service continues during the fetch");

    // Fetched: the pod template changes (a rollout), the superseded Job goes, and pods are
    // now held to the new identity.
    complete_job(&w.api, NS, &new_job);
    w.reconcile().await;
    let d = w.api.get(DEPLOYMENTS, NS, "demo-embedder").expect("deployment");
    let ann = |k: &str| d.pointer(&format!("/spec/template/metadata/annotations/{}", k.replace('/', "~1"))).cloned();
    assert_eq!(ann(REVISION_ANNOTATION), Some(json!(NEW_REV)));
    assert_eq!(ann(IDENTITY_ANNOTATION), Some(json!(NEW_ID)));
    let args = d.pointer("/spec/template/spec/containers/0/args").expect("args").to_string();
    assert!(args.contains(NEW_ID), "{args}");
    assert!(w.api.get(JOBS, NS, &format!("demo-embedder-fetch-{}", &REVISION[..12])).is_none(), "old job pruned");
    // The old pod presents the old identity: excluded until the rollout replaces it.
    assert!(w.routes().components["embedder"].is_empty());
    let last = w.attestor.calls().into_iter().rfind(|(pod, _)| pod == "demo-embedder-0").expect("attested");
    assert_eq!(hex::encode(last.1.model_identity), NEW_ID);
    let status = w.pipeline().status.expect("status");
    let e = status.components.iter().find(|c| c.name == "embedder").expect("embedder");
    assert_eq!(e.model_revision.as_deref(), Some(NEW_REV));
}

#[tokio::test]
async fn a_failed_fetch_is_reported_and_nothing_serves_unchecked_files() {
    let w = World::new(PrivateRAGPipeline::test().finalized()).await;
    w.reconcile().await;
    let job = format!("demo-reranker-fetch-{}", &REVISION[..12]);
    w.api.update(JOBS, NS, &job, |j| {
        j["status"] = json!({ "failed": 4, "conditions": [{
            "type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
            "message": "Job has reached the specified backoff limit",
        }]});
    });
    for other in ["embedder", "generator"] {
        complete_job(&w.api, NS, &format!("demo-{other}-fetch-{}", &REVISION[..12]));
    }
    w.reconcile().await;
    let p = w.pipeline();
    let models = condition(&p, "ModelsReady").expect("ModelsReady");
    assert_eq!((models.status.as_str(), models.reason.as_str()), ("False", "FetchFailed"));
    assert!(models.message.contains(&job) && models.message.contains("backoff limit"), "{}", models.message);
    assert!(w.api.get(DEPLOYMENTS, NS, "demo-reranker").is_none(), "no reranker without checked files");
    assert!(w.api.get(DEPLOYMENTS, NS, "demo-embedder").is_some());
    let ready = condition(&p, "Ready").expect("Ready");
    assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("False", "ModelsNotReady"));
}

#[tokio::test]
async fn an_invalid_spec_reports_a_condition_instead_of_failing() {
    type Break = fn(&mut gelo_operator::crd::PrivateRAGPipelineSpec);
    let cases: [(&str, Break); 3] = [
        ("embedder.model.hub.revision must be a full 40-hex commit id", |s| {
            s.embedder.model.hub = Some(HubSource { repo: "r/m".into(), revision: "main".into() })
        }),
        ("reranker.model.modelIdentity is missing", |s| s.reranker.model.model_identity = None),
        ("attestation.trustedRoots[0] is not a known root", |s| {
            s.attestation.trusted_roots = vec![TrustedRootSpec { amd: None, mock_secret_ref: None }]
        }),
    ];
    for (message, breaks) in cases {
        let w = World::new(PrivateRAGPipeline::test().finalized().with_spec(breaks)).await;
        let action = w.reconcile().await;
        assert_eq!(action, Action::await_change(), "{message}: only a spec change can fix it");
        let p = w.pipeline();
        let ready = condition(&p, "Ready").expect("Ready condition");
        assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("False", "InvalidSpec"));
        assert!(ready.message.contains(message), "{message} not in {}", ready.message);
        assert!(w.api.list(DEPLOYMENTS).is_empty() && w.api.list(JOBS).is_empty(), "{message}: nothing created");
        assert!(w.routes().pods().next().is_none(), "an invalid pipeline routes nowhere");
        assert!(w.events().iter().any(|e| e["reason"] == json!("InvalidSpec")), "{message}: event");
    }
}

#[tokio::test]
async fn an_unreadable_mock_root_rejects_every_pod_with_a_condition() {
    let w = World::new(PrivateRAGPipeline::test().finalized().with_spec(|s| {
        s.attestation.trusted_roots[0].mock_secret_ref.as_mut().map(|r| r.name = "absent".into()).unwrap_or(())
    }))
    .await;
    w.deployed().await;
    w.honest_pods();
    w.reconcile().await;
    let p = w.pipeline();
    let attested = condition(&p, "Attested").expect("Attested");
    assert_eq!(attested.reason, "TrustedRootUnavailable");
    assert!(attested.message.contains("absent"), "{}", attested.message);
    assert_eq!(condition(&p, "Ready").map(|c| c.status.as_str()), Some("False"));
    assert!(w.routes().pods().next().is_none());
    assert!(w.attestor.calls().is_empty(), "no pod is challenged without a usable policy");
}

#[tokio::test]
async fn deletion_removes_the_routing_table_then_the_finalizer() {
    let w = World::new(PrivateRAGPipeline::test().finalized()).await;
    w.deployed().await;
    w.honest_pods();
    w.reconcile().await;
    assert!(w.api.get(CONFIGMAPS, NS, "demo-routes").is_some());

    // kubectl delete: the finalizer holds the object, marked for deletion.
    w.api.delete(PIPELINES, NS, NAME);
    assert!(w.pipeline().metadata.deletion_timestamp.is_some());
    w.api.clear_requests();
    w.reconcile().await;

    let requests = w.api.requests();
    let cm_delete = requests.iter().position(|r| r.method == "DELETE" && r.path.ends_with("/configmaps/demo-routes"));
    let finalizer_patch =
        requests.iter().position(|r| r.method == "PATCH" && r.path.ends_with("/privateragpipelines/demo"));
    let (Some(a), Some(b)) = (cm_delete, finalizer_patch) else { panic!("expected both writes: {requests:?}") };
    assert!(a < b, "routes go before the finalizer is released");
    assert!(w.api.get(PIPELINES, NS, NAME).is_none(), "the pipeline is gone");
    // Garbage collection follows the owner references.
    assert!(w.api.list(DEPLOYMENTS).is_empty() && w.api.list(JOBS).is_empty() && w.api.list(SERVICES).is_empty());
    assert!(w.api.list(CONFIGMAPS).is_empty());
    assert!(w.events().iter().any(|e| e["reason"] == json!("Deleting")));
}

#[tokio::test]
async fn a_mock_root_is_refused_unless_the_operator_allows_it() {
    let mut w = World::new(PrivateRAGPipeline::test().finalized()).await;
    w.ctx = Arc::new(Context::new(w.api.client(), w.metrics.clone(), w.attestor.clone(), None));
    w.reconcile().await;
    let p = w.pipeline();
    let ready = condition(&p, "Ready").expect("Ready");
    assert_eq!(ready.reason, "InvalidSpec");
    assert!(ready.message.contains("does not allow mock roots"), "{}", ready.message);
    assert!(w.api.list(DEPLOYMENTS).is_empty());
}

#[test]
fn errors_back_off_exponentially_up_to_five_minutes() {
    use gelo_operator::controller::backoff;
    let secs: Vec<u64> = (1..=9).map(|n| backoff(n).as_secs()).collect();
    assert_eq!(secs, [5, 10, 20, 40, 80, 160, 300, 300, 300]);
}
