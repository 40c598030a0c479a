#!/usr/bin/env bash
# The kind end-to-end suite: a real cluster, the real images, the chart, a pipeline with
# the project's small offline models, and a check that the attestation gate holds.
#
#   e2e/kind/run.sh            # needs docker, kind, kubectl, helm, cargo; ~15-30 min cold
#   GELO_KIND_KEEP=1 e2e/kind/run.sh   # keep the cluster afterwards
#
# Steps (each one checks its result and exits non-zero with a message if it fails):
#   1. build the `gelo` binary (host client) and the images gelo:e2e, gelo:e2e-tampered
#      (same binary, another mock launch measurement) and gelo-operator:e2e;
#   2. stage the offline models (scripts/fetch-models.sh) and create a kind cluster that
#      mounts them; load the images;
#   3. install the chart (mock roots allowed: kind has no SEV-SNP), create the mock-root
#      Secret from a fresh mock PKI, a read-only PVC over the models, and the sample
#      pipeline with each model's real identity;
#   4. wait for Ready, check the routing table and the status, ingest a document and query
#      the gateway over gRPC (RA-TLS, verified against the pipeline's policy);
#   5. the gate: swap one embedder pod's image to gelo:e2e-tampered. The pod keeps its IP
#      and becomes Ready again, but must leave the routing table within one attestation
#      period, stay out, lose its `gelo.dev/attested` label, and be reported (status
#      condition Attested=False, Event MeasurementNotAllowed), while the pipeline stays
#      Ready on the other embedder.
#
# This suite cannot run on the project's CI machines (no Docker engine, no kind).
set -euo pipefail
cd "$(dirname "$0")/../.."
CLUSTER="${GELO_KIND_CLUSTER:-gelo-e2e}"
NS=gelo-e2e
SYSTEM_NS=gelo-system
PIPELINE=demo
PERIOD=10 # spec.attestation.periodSeconds in sample-pipeline.yaml
work="$(mktemp -d)"

log() { printf '\n== %s\n' "$*"; }
fail() {
  printf '\nFAIL: %s\n' "$*" >&2
  kubectl -n "$NS" get prp,deploy,pods -o wide >&2 || true
  kubectl -n "$NS" get events --sort-by=.lastTimestamp 2>/dev/null | tail -30 >&2 || true
  kubectl -n "$SYSTEM_NS" logs deploy/gelo-operator --tail=100 >&2 || true
  exit 1
}
cleanup() {
  [ -n "${PF_PID:-}" ] && kill "$PF_PID" 2>/dev/null || true
  if [ -z "${GELO_KIND_KEEP:-}" ]; then kind delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

# Polls "$@" every 2 s until it succeeds or $timeout seconds pass.
wait_until() { # timeout description command...
  local timeout="$1" what="$2" start=$SECONDS
  shift 2
  until "$@" >/dev/null 2>&1; do
    [ $((SECONDS - start)) -ge "$timeout" ] && fail "timed out after ${timeout}s waiting for: $what"
    sleep 2
  done
  echo "ok: $what ($((SECONDS - start))s)"
}

for tool in docker kind kubectl helm cargo python3; do
  command -v "$tool" >/dev/null || fail "$tool is required"
done

log "1. build"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/gelo/target}"
cargo build --release -p gelo
GELO="$CARGO_TARGET_DIR/release/gelo"
"$GELO" rag --help >/dev/null 2>&1 || fail "this gelo has no 'rag' client subcommand (ingest/query); see docs/KUBERNETES.md"
docker build -f docker/Dockerfile.gelo -t gelo:e2e .
docker build -f docker/Dockerfile.gelo --target tampered -t gelo:e2e-tampered .
docker build -f docker/Dockerfile.operator -t gelo-operator:e2e .

log "2. models and cluster"
scripts/fetch-models.sh
cache="${GELO_CACHE:-$HOME/.cache/gelo}/models"
mkdir -p "$work/models/smollm2-135m"
cp -r "$cache/all-minilm-l6-v2" "$work/models/all-minilm-l6-v2"
cp "$cache/smollm2-135m-instruct.gguf" "$work/models/smollm2-135m/"
chmod -R a+rX "$work/models" # pods run as uid 65532
identity() { "$GELO" model identity "$1" | python3 -c 'import json,sys; print(json.load(sys.stdin)["identity"])'; }
ID_MINILM="$(identity "$work/models/all-minilm-l6-v2")"
ID_SMOL="$(identity "$work/models/smollm2-135m")"
[[ "$ID_MINILM" =~ ^[0-9a-f]{64}$ && "$ID_SMOL" =~ ^[0-9a-f]{64}$ ]] || fail "model identities: '$ID_MINILM' '$ID_SMOL'"

cat > "$work/kind.yaml" <<EOF
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
nodes:
  - role: control-plane
    extraMounts:
      - hostPath: $work/models
        containerPath: /gelo-models
        readOnly: true
EOF
kind delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true
kind create cluster --name "$CLUSTER" --config "$work/kind.yaml" --wait 120s
for image in gelo:e2e gelo:e2e-tampered gelo-operator:e2e; do
  kind load docker-image --name "$CLUSTER" "$image"
done

log "3. chart, secret, models volume, pipeline"
helm install gelo charts/gelo --namespace "$SYSTEM_NS" --create-namespace \
  --set image.repository=gelo-operator --set image.tag=e2e --set image.pullPolicy=Never \
  --set attestation.allowMockRoots=true --set logFormat=text --wait --timeout 3m
kubectl get crd privateragpipelines.gelo.dev >/dev/null || fail "CRD not installed"
kubectl create namespace "$NS"

"$GELO" attest mock-pki --out "$work/mock-pki"
[ -s "$work/mock-pki/ark.pem" ] || fail "mock PKI has no ark.pem"
# The pods sign with the whole PKI; the operator reads only ark.pem (named in the spec).
kubectl -n "$NS" create secret generic gelo-mock-root --from-file="$work/mock-pki"

kubectl apply -f - <<EOF
apiVersion: v1
kind: PersistentVolume
metadata:
  name: gelo-models-$NS
spec:
  capacity: {storage: 2Gi}
  accessModes: [ReadOnlyMany]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: ""
  hostPath: {path: /gelo-models, type: Directory}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: gelo-models
  namespace: $NS
spec:
  accessModes: [ReadOnlyMany]
  storageClassName: ""
  volumeName: gelo-models-$NS
  resources: {requests: {storage: 2Gi}}
EOF

# The sample with the real identities of the staged models.
python3 - "$ID_MINILM" "$ID_SMOL" e2e/kind/sample-pipeline.yaml > "$work/pipeline.yaml" <<'PY'
import sys
minilm, smol, path = sys.argv[1], sys.argv[2], sys.argv[3]
text = open(path).read()
for placeholder, real in (("1" * 64, minilm), ("2" * 64, smol), ("3" * 64, smol), ("4" * 64, minilm)):
    assert placeholder in text, placeholder
    text = text.replace(placeholder, real)
print(text, end="")
PY
kubectl apply -f "$work/pipeline.yaml"

log "4. Ready, routes, query"
cond() { kubectl -n "$NS" get prp "$PIPELINE" -o jsonpath="{.status.conditions[?(@.type==\"$1\")].status}"; }
is_ready() { [ "$(cond Ready)" = "True" ]; }
wait_until 900 "pipeline Ready" is_ready
kubectl -n "$NS" get prp "$PIPELINE"
routes() { kubectl -n "$NS" get configmap "$PIPELINE-routes" -o jsonpath='{.data.routes\.json}'; }
routes > "$work/routes.json"
python3 - "$work/routes.json" "$ID_MINILM" "$ID_SMOL" <<'PY' || fail "routing table"
import json, sys
t = json.load(open(sys.argv[1]))
minilm, smol = sys.argv[2], sys.argv[3]
want = {"embedder": (2, minilm), "reranker": (1, smol), "generator": (1, smol), "gateway": (1, minilm)}
for c, (n, ident) in want.items():
    routes = t["components"][c]
    assert len(routes) == n, (c, routes)
    for r in routes:
        assert r["modelIdentity"] == ident, (c, r)
        assert len(r["tlsSpkiSha256"]) == 64 and r["port"] == 50051, r
print("ok: routing table has every pod, with its proved TLS key and pinned identity")
PY
kubectl -n "$NS" get configmap "$PIPELINE-routes" -o jsonpath='{.data.policy\.json}' > "$work/policy.json"

kubectl -n "$NS" port-forward "svc/$PIPELINE-gateway" 50151:50051 >/dev/null 2>&1 &
PF_PID=$!
sleep 3
"$GELO" rag ingest --gateway 127.0.0.1:50151 --policy "$work/policy.json" --expect-identity "$ID_MINILM" \
  --text "The GELO operator routes only to pods whose SEV-SNP evidence it verified." \
  || fail "ingest through the gateway"
answer="$("$GELO" rag query --gateway 127.0.0.1:50151 --policy "$work/policy.json" --expect-identity "$ID_MINILM" \
  "Which pods does the GELO operator route to?")" || fail "query through the gateway"
echo "answer: $answer"
[ -n "$answer" ] || fail "empty answer from the gateway"
kill "$PF_PID" 2>/dev/null || true
PF_PID=""

log "5. the gate: a pod with a wrong measurement"
victim="$(kubectl -n "$NS" get pods -l "app.kubernetes.io/instance=$PIPELINE,app.kubernetes.io/component=embedder" \
  -o jsonpath='{.items[0].metadata.name}')"
[ -n "$victim" ] || fail "no embedder pod"
in_routes() { routes | python3 -c "import json,sys; t=json.load(sys.stdin); sys.exit(0 if any(r['pod']=='$1' for rs in t['components'].values() for r in rs) else 1)"; }
not_in_routes() { ! in_routes "$1"; }
in_routes "$victim" || fail "$victim is not routed before the patch"
restarts_before="$(kubectl -n "$NS" get pod "$victim" -o jsonpath='{.status.containerStatuses[0].restartCount}')"

# A pod's image is mutable: the kubelet restarts the container with the tampered image,
# same pod, same IP. In SEV-SNP terms: other code now runs where a verified pod was.
patched_at=$SECONDS
kubectl -n "$NS" set image "pod/$victim" gelo=gelo:e2e-tampered
wait_until $((PERIOD + 5)) "$victim leaves the routing table within one attestation period" not_in_routes "$victim"
restarted() {
  [ "$(kubectl -n "$NS" get pod "$victim" -o jsonpath='{.status.containerStatuses[0].restartCount}')" -gt "$restarts_before" ] &&
    [ "$(kubectl -n "$NS" get pod "$victim" -o jsonpath='{.status.containerStatuses[0].ready}')" = "true" ]
}
wait_until 180 "$victim runs the tampered image and is Ready again" restarted
ready_again=$SECONDS
# Ready but tampered: it must stay out for two full periods of re-attestation.
while [ $((SECONDS - ready_again)) -lt $((2 * PERIOD + 2)) ]; do
  in_routes "$victim" && fail "$victim was routed again while presenting a wrong measurement"
  sleep 2
done
echo "ok: $victim stayed out of the routing table for $((SECONDS - ready_again))s while Ready"
label="$(kubectl -n "$NS" get pod "$victim" -o jsonpath='{.metadata.labels.gelo\.dev/attested}')"
[ -z "$label" ] || fail "$victim still carries gelo.dev/attested=$label"
[ "$(cond Attested)" = "False" ] || fail "Attested should be False"
msg="$(kubectl -n "$NS" get prp "$PIPELINE" -o jsonpath='{.status.conditions[?(@.type=="Attested")].message}')"
[[ "$msg" == *"$victim (measurement_not_allowed)"* ]] || fail "status does not name $victim: $msg"
kubectl -n "$NS" get events.events.k8s.io -o json | python3 -c "
import json, sys
ev = json.load(sys.stdin)['items']
hits = [e for e in ev if e.get('reason') == 'MeasurementNotAllowed' and (e.get('related') or {}).get('name') == '$victim']
assert hits, 'no MeasurementNotAllowed event for $victim'
print('ok: event', hits[0]['reason'], '-', hits[0].get('note', ''))
" || fail "no Event names $victim"
is_ready || fail "the pipeline should stay Ready on the other embedder"
honest="$(kubectl -n "$NS" get pods -l "app.kubernetes.io/instance=$PIPELINE,app.kubernetes.io/component=embedder" \
  -o jsonpath='{range .items[*]}{.metadata.name}{"\n"}{end}' | grep -vx "$victim" | head -1)"
in_routes "$honest" || fail "the honest embedder $honest left the routing table"
echo "gate held: excluded $((SECONDS - patched_at))s after the patch, reported, pipeline still Ready"

log "kind e2e passed"
