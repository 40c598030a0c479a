//! An in-memory Kubernetes API server over real HTTP on loopback, for the operator's tests.
//!
//! It stores objects as JSON and implements what the operator and kube-runtime use: get,
//! list and watch (with label and `metadata.name` field selectors and resourceVersion
//! resumption), create, replace with resourceVersion conflicts, the four patch types
//! (server-side apply approximated as a JSON merge patch of the applied object, which is
//! exact for a single field manager), the status subresource, delete with finalizers and
//! `deletionTimestamp`, and owner-reference garbage collection. A write that changes
//! nothing keeps the resourceVersion and emits no watch event, as a real API server does;
//! without that a controller that re-applies its objects would wake itself forever.
//!
//! Not implemented: admission, defaulting, schema validation, managedFields conflicts.

#![allow(dead_code)]
// Handlers return a ready HTTP error response as the error value: large, and fine for tests.
#![allow(clippy::result_large_err)]

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::broadcast;

/// (resource key `group/version/plural`, namespace, name)
type Key = (String, String, String);

#[derive(Clone, Debug)]
pub struct Request {
    pub method: String,
    pub path: String,
    pub query: String,
    pub content_type: String,
    pub body: Value,
}

#[derive(Clone, Debug)]
struct Change {
    rv: u64,
    resource: String,
    namespace: String,
    type_: &'static str,
    object: Value,
}

#[derive(Default)]
struct Store {
    rv: u64,
    uid: u64,
    objects: BTreeMap<Key, Value>,
    log: Vec<Change>,
    requests: Vec<Request>,
}

struct Shared {
    store: Mutex<Store>,
    notify: broadcast::Sender<u64>,
}

pub struct FakeApiServer {
    shared: Arc<Shared>,
    pub addr: SocketAddr,
}

/// `(plural key, kind)` of every resource the operator touches.
const KINDS: &[(&str, &str)] = &[
    ("core/v1/pods", "Pod"),
    ("core/v1/services", "Service"),
    ("core/v1/configmaps", "ConfigMap"),
    ("core/v1/secrets", "Secret"),
    ("core/v1/persistentvolumeclaims", "PersistentVolumeClaim"),
    ("core/v1/serviceaccounts", "ServiceAccount"),
    ("events.k8s.io/v1/events", "Event"),
    ("apps/v1/deployments", "Deployment"),
    ("batch/v1/jobs", "Job"),
    ("rbac.authorization.k8s.io/v1/roles", "Role"),
    ("rbac.authorization.k8s.io/v1/rolebindings", "RoleBinding"),
    ("coordination.k8s.io/v1/leases", "Lease"),
    ("gelo.dev/v1alpha1/privateragpipelines", "PrivateRAGPipeline"),
];

fn kind_of(resource: &str) -> Option<&'static str> {
    KINDS.iter().find(|(r, _)| *r == resource).map(|(_, k)| *k)
}

fn api_version_of(resource: &str) -> String {
    let mut parts = resource.split('/');
    let (group, version) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    if group == "core" { version.to_string() } else { format!("{group}/{version}") }
}

/// Resource key for an object's apiVersion and kind.
pub fn resource_for(api_version: &str, kind: &str) -> Option<&'static str> {
    KINDS.iter().find(|(r, k)| *k == kind && api_version_of(r) == api_version).map(|(r, _)| *r)
}

struct Target {
    resource: String,
    namespace: Option<String>,
    name: Option<String>,
    subresource: Option<String>,
}

fn parse_path(path: &str) -> Option<Target> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (gv, rest) = match segs.as_slice() {
        ["api", v, rest @ ..] => (format!("core/{v}"), rest),
        ["apis", g, v, rest @ ..] => (format!("{g}/{v}"), rest),
        _ => return None,
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some(ns.to_string()), rest),
        _ => (None, rest),
    };
    let (resource, name, subresource) = match rest {
        [r] => (r, None, None),
        [r, n] => (r, Some(n.to_string()), None),
        [r, n, s] => (r, Some(n.to_string()), Some(s.to_string())),
        _ => return None,
    };
    Some(Target { resource: format!("{gv}/{resource}"), namespace, name, subresource })
}

fn query_map(q: &str) -> BTreeMap<String, String> {
    q.split('&')
        .filter(|s| !s.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (decode(k), decode(v))
        })
        .collect()
}

fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let h = std::str::from_utf8(&bytes[i + 1..i + 3]).ok().and_then(|h| u8::from_str_radix(h, 16).ok());
                match h {
                    Some(b) => {
                        out.push(b);
                        i += 3;
                    }
                    None => {
                        out.push(b'%');
                        i += 1;
                    }
                }
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Equality-based label selectors (`a=b,c!=d,e`) and the `metadata.name` field selector.
fn matches(obj: &Value, labels: Option<&String>, fields: Option<&String>) -> bool {
    let obj_labels = obj.pointer("/metadata/labels").and_then(Value::as_object);
    let label = |k: &str| obj_labels.and_then(|l| l.get(k)).and_then(Value::as_str);
    if let Some(sel) = labels {
        for term in sel.split(',').filter(|t| !t.is_empty()) {
            let ok = if let Some((k, v)) = term.split_once("!=") {
                label(k) != Some(v)
            } else if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
                label(k) == Some(v)
            } else if let Some(k) = term.strip_prefix('!') {
                label(k).is_none()
            } else {
                label(term).is_some()
            };
            if !ok {
                return false;
            }
        }
    }
    if let Some(sel) = fields {
        for term in sel.split(',').filter(|t| !t.is_empty()) {
            if let Some(name) = term.strip_prefix("metadata.name=")
                && obj.pointer("/metadata/name").and_then(Value::as_str) != Some(name)
            {
                return false;
            }
        }
    }
    true
}

fn status_body(code: u16, reason: &str, message: impl Into<String>) -> Response {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message.into(), "reason": reason, "code": code,
    });
    (StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR), axum::Json(body)).into_response()
}

fn ok(v: Value) -> Response {
    (StatusCode::OK, axum::Json(v)).into_response()
}

fn now() -> String {
    k8s_openapi::jiff::Timestamp::now().to_string()
}

impl Store {
    fn next_rv(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }

    fn record(&mut self, resource: &str, namespace: &str, type_: &'static str, object: Value) -> u64 {
        let rv = self.rv;
        self.log.push(Change { rv, resource: resource.into(), namespace: namespace.into(), type_, object });
        rv
    }

    /// Stores a new object, filling in server-set metadata.
    fn create(&mut self, resource: &str, ns: &str, mut obj: Value) -> Result<Value, Response> {
        let Some(kind) = kind_of(resource) else {
            return Err(status_body(404, "NotFound", format!("resource {resource} not served")));
        };
        let meta = obj.as_object_mut().map(|o| o.entry("metadata").or_insert_with(|| json!({})));
        let Some(meta) = meta.and_then(Value::as_object_mut) else {
            return Err(status_body(400, "BadRequest", "object is not a JSON object"));
        };
        let name = match meta.get("name").and_then(Value::as_str) {
            Some(n) => n.to_string(),
            None => match meta.get("generateName").and_then(Value::as_str) {
                Some(g) => format!("{g}{:05}", self.uid + 1),
                None => return Err(status_body(422, "Invalid", "metadata.name is required")),
            },
        };
        let key = (resource.to_string(), ns.to_string(), name.clone());
        if self.objects.contains_key(&key) {
            return Err(status_body(409, "AlreadyExists", format!("{kind} {name} already exists")));
        }
        self.uid += 1;
        let rv = self.next_rv();
        meta.insert("name".into(), json!(name));
        if !ns.is_empty() {
            meta.insert("namespace".into(), json!(ns));
        }
        meta.insert("uid".into(), json!(format!("00000000-0000-4000-8000-{:012}", self.uid)));
        meta.insert("resourceVersion".into(), json!(rv.to_string()));
        meta.insert("generation".into(), json!(1));
        meta.entry("creationTimestamp").or_insert_with(|| json!(now()));
        obj["apiVersion"] = json!(api_version_of(resource));
        obj["kind"] = json!(kind);
        self.objects.insert(key, obj.clone());
        self.record(resource, ns, "ADDED", obj.clone());
        Ok(obj)
    }

    /// Stores `new` in place of the object at `key` if it differs: bumps resourceVersion
    /// (and generation when the spec changed) and emits MODIFIED. Finishes a pending
    /// deletion once the finalizers are gone.
    fn commit(&mut self, key: &Key, mut new: Value) -> Value {
        let Some(old) = self.objects.get(key).cloned() else { return new };
        // Server-owned metadata cannot be changed by writes.
        for f in ["uid", "creationTimestamp", "deletionTimestamp", "generation"] {
            match old.pointer(&format!("/metadata/{f}")) {
                Some(v) => new["metadata"][f] = v.clone(),
                None => {
                    if let Some(m) = new["metadata"].as_object_mut() {
                        m.remove(f);
                    }
                }
            }
        }
        new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"].clone();
        if let Some(m) = new["metadata"].as_object_mut()
            && m.get("finalizers").is_some_and(|f| f.as_array().is_some_and(Vec::is_empty) || f.is_null())
        {
            m.remove("finalizers");
        }
        if new == old {
            return old;
        }
        let rv = self.next_rv();
        new["metadata"]["resourceVersion"] = json!(rv.to_string());
        if new.get("spec") != old.get("spec") {
            let g = old.pointer("/metadata/generation").and_then(Value::as_i64).unwrap_or(1);
            new["metadata"]["generation"] = json!(g + 1);
        }
        let deleting = new.pointer("/metadata/deletionTimestamp").is_some();
        let finalizers = new.pointer("/metadata/finalizers").and_then(Value::as_array).is_some_and(|f| !f.is_empty());
        if deleting && !finalizers {
            self.objects.remove(key);
            self.record(&key.0, &key.1, "DELETED", new.clone());
            let uid = new.pointer("/metadata/uid").and_then(Value::as_str).unwrap_or("").to_string();
            self.collect_garbage(&uid);
            return new;
        }
        self.objects.insert(key.clone(), new.clone());
        self.record(&key.0, &key.1, "MODIFIED", new.clone());
        new
    }

    fn delete(&mut self, key: &Key) -> Option<Value> {
        let obj = self.objects.get(key).cloned()?;
        let finalizers = obj.pointer("/metadata/finalizers").and_then(Value::as_array).is_some_and(|f| !f.is_empty());
        if finalizers {
            if obj.pointer("/metadata/deletionTimestamp").is_some() {
                return Some(obj);
            }
            let mut new = obj.clone();
            let rv = self.next_rv();
            new["metadata"]["deletionTimestamp"] = json!(now());
            new["metadata"]["resourceVersion"] = json!(rv.to_string());
            let g = obj.pointer("/metadata/generation").and_then(Value::as_i64).unwrap_or(1);
            new["metadata"]["generation"] = json!(g + 1);
            self.objects.insert(key.clone(), new.clone());
            self.record(&key.0, &key.1, "MODIFIED", new.clone());
            return Some(new);
        }
        self.objects.remove(key);
        self.next_rv();
        self.record(&key.0, &key.1, "DELETED", obj.clone());
        let uid = obj.pointer("/metadata/uid").and_then(Value::as_str).unwrap_or("").to_string();
        self.collect_garbage(&uid);
        Some(obj)
    }

    /// Background cascading deletion: whatever names `uid` as an owner goes too.
    fn collect_garbage(&mut self, uid: &str) {
        if uid.is_empty() {
            return;
        }
        let owned: Vec<Key> = self
            .objects
            .iter()
            .filter(|(_, v)| {
                v.pointer("/metadata/ownerReferences")
                    .and_then(Value::as_array)
                    .is_some_and(|refs| refs.iter().any(|r| r["uid"] == json!(uid)))
            })
            .map(|(k, _)| k.clone())
            .collect();
        for k in owned {
            self.delete(&k);
        }
    }
}

async fn handle(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let content_type = headers.get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    let body_json: Value =
        if body.is_empty() { Value::Null } else { serde_json::from_slice(&body).unwrap_or(Value::Null) };
    let query = uri.query().unwrap_or("").to_string();
    {
        let mut store = shared.store.lock().unwrap();
        store.requests.push(Request {
            method: method.to_string(),
            path: uri.path().to_string(),
            query: query.clone(),
            content_type: content_type.clone(),
            body: body_json.clone(),
        });
    }
    let Some(t) = parse_path(uri.path()) else {
        return status_body(404, "NotFound", format!("no route {}", uri.path()));
    };
    let q = query_map(&query);
    if kind_of(&t.resource).is_none() {
        return status_body(404, "NotFound", format!("resource {} not served", t.resource));
    }
    let ns = t.namespace.clone().unwrap_or_default();

    match (&method, &t.name) {
        (&Method::GET, None) if q.get("watch").is_some_and(|w| w == "true" || w == "1") => {
            watch(shared.clone(), t, q).await
        }
        (&Method::GET, None) => list(&shared, &t, &ns, &q),
        (&Method::GET, Some(name)) => {
            let store = shared.store.lock().unwrap();
            match store.objects.get(&(t.resource.clone(), ns, name.clone())) {
                Some(v) => ok(v.clone()),
                None => status_body(404, "NotFound", format!("{} {name} not found", t.resource)),
            }
        }
        (&Method::POST, None) => {
            let mut store = shared.store.lock().unwrap();
            let r = store.create(&t.resource, &ns, body_json);
            drop(store);
            let _ = shared.notify.send(0);
            match r {
                Ok(v) => (StatusCode::CREATED, axum::Json(v)).into_response(),
                Err(e) => e,
            }
        }
        (&Method::PUT, Some(name)) => {
            let key = (t.resource.clone(), ns, name.clone());
            let mut store = shared.store.lock().unwrap();
            let Some(old) = store.objects.get(&key).cloned() else {
                return status_body(404, "NotFound", format!("{name} not found"));
            };
            let sent_rv = body_json.pointer("/metadata/resourceVersion").and_then(Value::as_str);
            if sent_rv.is_some_and(|rv| Some(rv) != old.pointer("/metadata/resourceVersion").and_then(Value::as_str)) {
                return status_body(409, "Conflict", format!("the object {name} has been modified"));
            }
            let mut new = body_json;
            if t.subresource.as_deref() == Some("status") {
                let mut merged = old.clone();
                merged["status"] = new.get("status").cloned().unwrap_or(Value::Null);
                new = merged;
            } else if let Some(s) = old.get("status") {
                new["status"] = s.clone();
            }
            let v = store.commit(&key, new);
            drop(store);
            let _ = shared.notify.send(0);
            ok(v)
        }
        (&Method::PATCH, Some(name)) => patch(&shared, &t, ns, name, &content_type, body_json),
        (&Method::DELETE, Some(name)) => {
            let key = (t.resource.clone(), ns, name.clone());
            let mut store = shared.store.lock().unwrap();
            let r = store.delete(&key);
            drop(store);
            let _ = shared.notify.send(0);
            match r {
                Some(v) => ok(v),
                None => status_body(404, "NotFound", format!("{name} not found")),
            }
        }
        _ => status_body(405, "MethodNotAllowed", format!("{method} {}", uri.path())),
    }
}

/// GET on a collection: the objects of the resource (in the namespace, if the path names
/// one) that match the label and field selectors.
fn list(shared: &Shared, t: &Target, ns: &str, q: &BTreeMap<String, String>) -> Response {
    let store = shared.store.lock().unwrap();
    let items: Vec<Value> = store
        .objects
        .iter()
        .filter(|((r, n, _), v)| {
            *r == t.resource
                && (t.namespace.is_none() || n == ns)
                && matches(v, q.get("labelSelector"), q.get("fieldSelector"))
        })
        .map(|(_, v)| v.clone())
        .collect();
    ok(json!({
        "apiVersion": api_version_of(&t.resource),
        "kind": format!("{}List", kind_of(&t.resource).unwrap_or("")),
        "metadata": { "resourceVersion": store.rv.to_string() },
        "items": items,
    }))
}

/// PATCH: JSON patch, merge patch, strategic merge (as merge) and server-side apply (which
/// also creates); the status subresource changes only the status, the object never does.
fn patch(shared: &Shared, t: &Target, ns: String, name: &str, content_type: &str, body_json: Value) -> Response {
    let key = (t.resource.clone(), ns.clone(), name.to_string());
    let mut store = shared.store.lock().unwrap();
    let existing = store.objects.get(&key).cloned();
    let is_apply = content_type.starts_with("application/apply-patch");
    let Some(old) = existing else {
        if is_apply && t.subresource.is_none() {
            let r = store.create(&t.resource, &ns, body_json);
            drop(store);
            let _ = shared.notify.send(0);
            return match r {
                Ok(v) => ok(v),
                Err(e) => e,
            };
        }
        return status_body(404, "NotFound", format!("{name} not found"));
    };
    let mut doc = old.clone();
    if content_type.starts_with("application/json-patch") {
        let patch: json_patch::Patch = match serde_json::from_value(body_json) {
            Ok(p) => p,
            Err(e) => return status_body(400, "BadRequest", e.to_string()),
        };
        // Like the API server's JSON patch library: `test` of a missing path against
        // null succeeds (kube's finalizer helper relies on it).
        let ops: Vec<json_patch::PatchOperation> = patch
            .0
            .into_iter()
            .filter(|op| match op {
                json_patch::PatchOperation::Test(t) if t.value.is_null() => {
                    !doc.pointer(t.path.as_str()).is_none_or(Value::is_null)
                }
                _ => true,
            })
            .collect();
        if let Err(e) = json_patch::patch(&mut doc, &ops) {
            return status_body(422, "Invalid", e.to_string());
        }
    } else {
        // merge, strategic merge (close enough for our objects) and apply.
        json_patch::merge(&mut doc, &body_json);
    }
    let new = if t.subresource.as_deref() == Some("status") {
        let mut merged = old.clone();
        merged["status"] = doc.get("status").cloned().unwrap_or(Value::Null);
        merged
    } else {
        let mut merged = doc;
        match old.get("status") {
            Some(s) => merged["status"] = s.clone(),
            None => {
                if let Some(m) = merged.as_object_mut() {
                    m.remove("status");
                }
            }
        }
        merged
    };
    let v = store.commit(&key, new);
    drop(store);
    let _ = shared.notify.send(0);
    ok(v)
}

/// A watch: replays the changes after `resourceVersion`, then streams new ones as JSON
/// lines until `timeoutSeconds`.
async fn watch(shared: Arc<Shared>, t: Target, q: BTreeMap<String, String>) -> Response {
    let since: u64 = q.get("resourceVersion").and_then(|v| v.parse().ok()).unwrap_or(0);
    let timeout = q.get("timeoutSeconds").and_then(|v| v.parse().ok()).unwrap_or(290u64).min(290);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(timeout);
    let rx = shared.notify.subscribe();
    let state = (shared, t, q, since, rx, VecDeque::<Value>::new());
    let stream = futures::stream::unfold(state, move |(shared, t, q, mut cursor, mut rx, mut buf)| async move {
        loop {
            if let Some(v) = buf.pop_front() {
                let mut line = serde_json::to_vec(&v).unwrap_or_default();
                line.push(b'\n');
                return Some((Ok::<_, std::convert::Infallible>(Bytes::from(line)), (shared, t, q, cursor, rx, buf)));
            }
            {
                let store = shared.store.lock().unwrap();
                for c in store.log.iter().filter(|c| c.rv > cursor) {
                    if c.resource == t.resource
                        && t.namespace.as_ref().is_none_or(|ns| *ns == c.namespace)
                        && matches(&c.object, q.get("labelSelector"), q.get("fieldSelector"))
                    {
                        buf.push_back(json!({ "type": c.type_, "object": c.object }));
                    }
                }
                cursor = store.rv;
            }
            if !buf.is_empty() {
                continue;
            }
            tokio::select! {
                _ = rx.recv() => {}
                _ = tokio::time::sleep_until(deadline) => return None,
            }
        }
    });
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/json")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| status_body(500, "InternalError", "stream"))
}

impl FakeApiServer {
    pub async fn start() -> Self {
        let (notify, _) = broadcast::channel(1024);
        let shared = Arc::new(Shared { store: Mutex::new(Store::default()), notify });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind loopback");
        let addr = listener.local_addr().expect("local addr");
        let app = axum::Router::new().fallback(handle).with_state(shared.clone());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self { shared, addr }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn client(&self) -> kube::Client {
        let config = kube::Config::new(self.url().parse().expect("url"));
        kube::Client::try_from(config).expect("client")
    }

    /// A kubeconfig pointing at this server, for running the operator binary.
    pub fn write_kubeconfig(&self, dir: &std::path::Path) -> std::path::PathBuf {
        let path = dir.join("kubeconfig");
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {}\nusers:\n- name: fake\n  user: {{}}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n    namespace: default\ncurrent-context: fake\n",
            self.url()
        );
        std::fs::write(&path, text).expect("write kubeconfig");
        path
    }

    /// Creates an object as the API would (server metadata filled in).
    pub fn insert(&self, obj: Value) -> Value {
        let api_version = obj["apiVersion"].as_str().unwrap_or("").to_string();
        let kind = obj["kind"].as_str().unwrap_or("").to_string();
        let resource = resource_for(&api_version, &kind).unwrap_or_else(|| panic!("unserved {api_version} {kind}"));
        let ns = obj.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or("").to_string();
        let v =
            self.shared.store.lock().unwrap().create(resource, &ns, obj).unwrap_or_else(|_| panic!("insert failed"));
        let _ = self.shared.notify.send(0);
        v
    }

    pub fn get(&self, resource: &str, ns: &str, name: &str) -> Option<Value> {
        self.shared.store.lock().unwrap().objects.get(&(resource.into(), ns.into(), name.into())).cloned()
    }

    pub fn list(&self, resource: &str) -> Vec<Value> {
        let store = self.shared.store.lock().unwrap();
        store.objects.iter().filter(|((r, _, _), _)| r == resource).map(|(_, v)| v.clone()).collect()
    }

    pub fn names(&self, resource: &str) -> Vec<String> {
        self.list(resource).iter().filter_map(|v| v.pointer("/metadata/name")?.as_str().map(String::from)).collect()
    }

    /// Changes an object as another controller would (e.g. the Job controller setting
    /// status); emits MODIFIED if it changed.
    pub fn update(&self, resource: &str, ns: &str, name: &str, f: impl FnOnce(&mut Value)) -> Value {
        let key = (resource.to_string(), ns.to_string(), name.to_string());
        let mut store = self.shared.store.lock().unwrap();
        let mut v = store.objects.get(&key).cloned().unwrap_or_else(|| panic!("no {resource} {ns}/{name}"));
        f(&mut v);
        let v = store.commit(&key, v);
        drop(store);
        let _ = self.shared.notify.send(0);
        v
    }

    /// Deletes as `kubectl delete` would (finalizers respected, owned objects collected).
    pub fn delete(&self, resource: &str, ns: &str, name: &str) -> Option<Value> {
        let r = self.shared.store.lock().unwrap().delete(&(resource.into(), ns.into(), name.into()));
        let _ = self.shared.notify.send(0);
        r
    }

    pub fn requests(&self) -> Vec<Request> {
        self.shared.store.lock().unwrap().requests.clone()
    }

    pub fn clear_requests(&self) {
        self.shared.store.lock().unwrap().requests.clear();
    }

    /// Polls `check` until it returns Some or `timeout` passes.
    pub async fn wait_for<T>(&self, timeout: Duration, mut check: impl FnMut(&Self) -> Option<T>) -> Option<T> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(t) = check(self) {
                return Some(t);
            }
            if tokio::time::Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
