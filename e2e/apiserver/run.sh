#!/usr/bin/env bash
# The chart, the CRD and the operator against a real Kubernetes control plane on loopback
# (etcd, kube-apiserver with RBAC, kube-controller-manager; scripts/k8s/), with
# e2e/apiserver/kubelet.py playing the kubelet: it runs each Pod's container (the real
# `gelo` binary) with the pod spec's args and environment on a loopback address of its own
# and reports the Pod's status. The chart installs with the real helm; the CRD's structural
# schema refuses invalid pipelines with its own messages; `kubectl get prp` shows the
# printer columns; the operator, authenticated as the chart's ServiceAccount, fetches the
# embedder's model through its Job from a hub on loopback (e2e/apiserver/hub.py, the hub's
# URL layout; the pinned commit and the files' hashes checked), creates the workloads,
# attests every pod, writes the routes; the gateway (its own ServiceAccount) follows them
# and answers a query; a pod restarted with another launch measurement gets no request and
# leaves the routes within the period; a field another manager set is reported, not overwritten; a
# restarted operator converges without duplicates; deleting the pipeline garbage-collects
# everything.
#
#   e2e/apiserver/run.sh        (scripts/test.sh runs it; the binaries build once, cached)
set -euo pipefail
cd "$(dirname "$0")/../.."

work="$(mktemp -d)"
operator_pid=""
kubelet_pid=""
hub_pid=""
cleanup() {
  status=$?
  [ -n "$operator_pid" ] && { kill -CONT "$operator_pid"; kill "$operator_pid"; } 2>/dev/null || true
  [ -n "$hub_pid" ] && kill "$hub_pid" 2>/dev/null || true
  [ -n "$kubelet_pid" ] && { kill "$kubelet_pid" 2>/dev/null; wait "$kubelet_pid" 2>/dev/null; } || true
  scripts/k8s/controlplane.sh stop "$work/cp" || true
  if [ $status -ne 0 ]; then
    for f in "$work"/operator*.log "$work/kubelet.log" "$work"/pods/*.log "$work/hub.log" "$work/cp/kube-apiserver.log"; do
      [ -f "$f" ] && { echo "--- tail of $f" >&2; tail -25 "$f" >&2; }
    done
  fi
  rm -rf "$work"
  exit $status
}
trap cleanup EXIT
log() { echo "[apiserver e2e] $*"; }
fail() { echo "[apiserver e2e] FAIL: $*" >&2; exit 1; }
# (In pipelines, `grep PATTERN >/dev/null` rather than `grep -q`: it reads all its input, so
# the writer never dies of SIGPIPE, which pipefail would turn into a failure.)
# Waits until "$@" succeeds, for at most $1 seconds.
wait_for() {
  local limit=$1 what=$2; shift 2
  for _ in $(seq $((limit * 4))); do "$@" >/dev/null 2>&1 && return 0; sleep 0.25; done
  fail "timed out after ${limit}s: $what"
}

t0=$(date +%s)
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/gelo/target}"
cargo build -q -p gelo-operator -p gelo
operator="$CARGO_TARGET_DIR/debug/gelo-operator"
GELO="$CARGO_TARGET_DIR/debug/gelo"
scripts/fetch-models.sh >/dev/null
kubeconfig="$(scripts/k8s/controlplane.sh start "$work/cp")" || fail "the control plane did not start"
bin="$(cat "$work/cp/bin")"
export KUBECONFIG="$kubeconfig" PATH="$bin:$PATH"
log "control plane up in $(( $(date +%s) - t0 ))s: $(kubectl version -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["serverVersion"]["gitVersion"])')"

SYSTEM_NS=gelo-system
NS=gelo-e2e

log "1. the chart: helm lint, helm install"
helm lint charts/gelo >"$work/lint.txt" || { cat "$work/lint.txt"; fail "helm lint"; }
helm install gelo charts/gelo --namespace "$SYSTEM_NS" --create-namespace \
  --set attestation.allowMockRoots=true >/dev/null 2>"$work/install.err" || { cat "$work/install.err"; fail "helm install"; }
# The API server warns about what it does not understand (a schema format, a field): none.
if grep -i "warning" "$work/install.err"; then fail "helm install printed warnings"; fi
kubectl wait --for=condition=Established crd/privateragpipelines.gelo.dev --timeout=30s >/dev/null
kubectl -n "$SYSTEM_NS" get serviceaccount gelo-operator >/dev/null || fail "the chart's ServiceAccount"
kubectl -n "$SYSTEM_NS" get deployment gelo-operator >/dev/null || fail "the chart's Deployment"

log "2. a pipeline through kubectl; the printer columns"
kubectl create namespace "$NS" >/dev/null
# The models volume (claim gelo-models, as in the kind suite) and the mock PKI the pods
# sign with; the spec names its root, which the operator may trust (allowMockRoots).
cache="${GELO_CACHE:-$HOME/.cache/gelo}/models"
mkdir -p "$work/models/smollm2-135m"
ln -s "$cache/all-minilm-l6-v2" "$work/models/all-minilm-l6-v2"
ln -s "$cache/smollm2-135m-instruct.gguf" "$work/models/smollm2-135m/smollm2-135m-instruct.gguf"
identity() { "$GELO" model identity "$1" | python3 -c 'import json,sys; print(json.load(sys.stdin)["identity"])'; }
ID_MINILM="$(identity "$work/models/all-minilm-l6-v2")"
ID_SMOL="$(identity "$work/models/smollm2-135m")"
# The hub the embedder's model is fetched from: MiniLM at one pinned commit, and the same
# repository at another commit whose vocabulary differs by one line (a mirror serving
# something else than the pin).
HUB_REPO=sentence-transformers/all-MiniLM-L6-v2
HUB_REV=c9745ed1d9f207416be6d2e6f8de32d1f16199bf
TAMPERED_REV=0123456789abcdef0123456789abcdef01234567
mkdir -p "$work/tampered"
for f in "$cache/all-minilm-l6-v2"/*; do ln -s "$f" "$work/tampered/"; done
rm "$work/tampered/vocab.txt"
sed '1000s/.*/tampered/' "$cache/all-minilm-l6-v2/vocab.txt" >"$work/tampered/vocab.txt"
python3 e2e/apiserver/hub.py --port-file "$work/hub.port" --log "$work/hub.log" \
  --repo "$HUB_REPO@$HUB_REV=$cache/all-minilm-l6-v2" --repo "$HUB_REPO@$TAMPERED_REV=$work/tampered" &
hub_pid=$!
wait_for 10 "the hub serves" test -s "$work/hub.port"
HUB="http://127.0.0.1:$(cat "$work/hub.port")"
# What the fetch Job runs, against the mirror that serves other bytes: refused, nothing kept.
if out="$(HF_ENDPOINT="$HUB" "$GELO" model fetch --repo "$HUB_REPO" --revision "$TAMPERED_REV" \
  --out "$work/fetch-tampered" --expect-identity "$ID_MINILM" 2>&1)"; then fail "a tampered model was fetched"; fi
[[ "$out" == *"identity"* ]] || fail "the tampered fetch failed for another reason: $out"
[ -z "$(ls -A "$work/fetch-tampered")" ] || fail "a refused fetch left files behind"
hub_mark=$(wc -l <"$work/hub.log") # what the Job asks comes after this line
"$GELO" attest mock-pki --out "$work/mock-pki" >/dev/null
kubectl -n "$NS" create secret generic gelo-mock-root --from-file="$work/mock-pki" >/dev/null
kubectl -n "$NS" apply -f - >/dev/null <<EOF
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: gelo-models}
spec: {accessModes: [ReadOnlyMany], storageClassName: "", resources: {requests: {storage: 2Gi}}}
EOF
python3 - "$ID_MINILM" "$ID_SMOL" "$HUB_REPO" "$HUB_REV" >"$work/pipeline.yaml" <<'PY'
import sys
minilm, smol, repo, rev = sys.argv[1:5]
text = open("e2e/kind/sample-pipeline.yaml").read()
for placeholder, real in (("1" * 64, minilm), ("2" * 64, smol), ("3" * 64, smol), ("4" * 64, minilm)):
    assert placeholder in text, placeholder
    text = text.replace(placeholder, real)
# The embedder's model comes from the hub, through the operator's fetch Job.
volume = "      volume:\n        claimName: gelo-models\n        subPath: all-minilm-l6-v2\n"
assert volume in text
text = text.replace(volume, f"      hub: {{repo: {repo}, revision: {rev}}}\n", 1)
print(text, end="")
PY
kubectl apply -f "$work/pipeline.yaml" >/dev/null
header="$(kubectl -n "$NS" get prp | sed -n 1p | tr -s ' ')"
[ "$header" = "NAME READY MODELS ATTESTED VERIFIED AGE" ] || fail "printer columns: '$header'"

log "3. invalid pipelines are refused by the API server with the CRD's messages"
refused() { # name, python edit of the sample (variable s), expected message part
  python3 - "$2" >"$work/bad-$1.yaml" <<'PY'
import sys
s = open("e2e/kind/sample-pipeline.yaml").read().replace("name: demo\n", "name: bad\n", 1)
exec(sys.argv[1])
print(s, end="")
PY
  if out="$(kubectl apply -f "$work/bad-$1.yaml" 2>&1)"; then fail "$1 was accepted"; fi
  [[ "$out" == *"$3"* ]] || fail "$1: expected '$3' in: $out"
}
refused revision 's = s.replace("      volume:\n        claimName: gelo-models\n        subPath: all-minilm-l6-v2\n", "      hub: {repo: sentence-transformers/all-MiniLM-L6-v2, revision: main}\n", 1)' \
  'spec.embedder.model.hub.revision: Invalid value: "main": spec.embedder.model.hub.revision in body should match'
refused replicas 's = s.replace("replicas: 2", "replicas: -1", 1)' \
  'spec.embedder.replicas: Invalid value: -1: spec.embedder.replicas in body should be greater than or equal to 0'
refused role 's = s.replace("  gateway:\n", "  summarizer:\n    replicas: 1\n  gateway:\n", 1)' \
  'unknown field "spec.summarizer"'
refused engine 's = s.replace("engine: cpu", "engine: tpu", 1)' \
  'spec.embedder.engine: Unsupported value: "tpu"'
refused identity 's = s.replace("1" * 64, "1" * 63, 1)' \
  'spec.embedder.model.modelIdentity: Invalid value'
refused protection 's = s.replace("engine: cpu", "engine: cpu\n    protection: plaintext", 1)' \
  'spec.embedder.protection: Unsupported value: "plaintext"'
kubectl -n "$NS" get prp bad >/dev/null 2>&1 && fail "an invalid pipeline was stored"

log "4. the operator, as the chart's ServiceAccount"
token="$(kubectl -n "$SYSTEM_NS" create token gelo-operator --duration=1h)"
server="$(kubectl config view --minify -o jsonpath='{.clusters[0].cluster.server}')"
cat >"$work/operator.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "$server", certificate-authority: "$work/cp/pki/ca.crt"}}]
users: [{name: gelo-operator, user: {token: "$token"}}]
contexts: [{name: c, context: {cluster: c, user: gelo-operator}}]
current-context: c
EOF
kubectl --kubeconfig "$work/operator.kubeconfig" auth whoami -o jsonpath='{.status.userInfo.username}' \
  | grep -x "system:serviceaccount:$SYSTEM_NS:gelo-operator" >/dev/null || fail "the operator's identity"
start_operator() {
  KUBECONFIG="$work/operator.kubeconfig" POD_NAMESPACE="$SYSTEM_NS" POD_NAME="gelo-operator-$1" \
    GELO_OPERATOR_ALLOW_MOCK_ROOTS=true GELO_OPERATOR_METRICS_ADDR=127.0.0.1:0 GELO_OPERATOR_LOG_FORMAT=text \
    GELO_OPERATOR_LEADER_ELECT=true GELO_OPERATOR_HUB_ENDPOINT="$HUB" RUST_LOG=info "$operator" run >"$work/operator-$1.log" 2>&1 &
  operator_pid=$!
}
python3 e2e/apiserver/kubelet.py --kubeconfig "$KUBECONFIG" --namespace "$NS" --gelo "$GELO" \
  --claim gelo-models="$work/models" --work "$work/pods" >"$work/kubelet.log" 2>&1 &
kubelet_pid=$!
start_operator 1
owned() { kubectl -n "$NS" get deployments,services,configmaps,serviceaccounts,roles,rolebindings -l "app.kubernetes.io/instance=demo" -o name 2>/dev/null; }
all_owned() {
  for d in embedder reranker generator gateway; do kubectl -n "$NS" get deployment "demo-$d" >/dev/null 2>&1 || return 1; done
  kubectl -n "$NS" get configmap demo-routes >/dev/null 2>&1
}
wait_for 90 "the operator creates the pipeline's workloads" all_owned
cond() { kubectl -n "$NS" get prp demo -o jsonpath="{.status.conditions[?(@.type==\"$1\")].status}"; }
status_written() { [ -n "$(cond Ready)" ]; }
wait_for 60 "the operator writes the status subresource" status_written
uid="$(kubectl -n "$NS" get prp demo -o jsonpath='{.metadata.uid}')"
for d in embedder reranker generator gateway; do
  owner="$(kubectl -n "$NS" get deployment "demo-$d" -o jsonpath='{.metadata.ownerReferences[0].uid}')"
  [ "$owner" = "$uid" ] || fail "demo-$d is not owned by the pipeline ($owner)"
done
manager="$(kubectl -n "$NS" get deployment demo-embedder -o jsonpath='{.metadata.managedFields[*].manager}')"
[[ " $manager " == *" gelo-operator "* ]] || fail "server-side apply field manager: '$manager'"
lease="$(kubectl -n "$SYSTEM_NS" get lease gelo-operator -o jsonpath='{.spec.holderIdentity}')"
[ "$lease" = "gelo-operator-1" ] || fail "leader lease held by '$lease'"

log "5. the model fetched by the Job; pods run, are attested and routed; a query through the gateway"
is_ready() { [ "$(cond Ready)" = "True" ]; }
wait_for 300 "the pipeline Ready: every component has an attested route" is_ready
job="$(kubectl -n "$NS" get jobs -l app.kubernetes.io/component=embedder -o jsonpath='{.items[*].metadata.name}')"
[ "$job" = "demo-embedder-fetch-${HUB_REV:0:12}" ] || fail "the embedder's fetch Job: '$job'"
[ "$(kubectl -n "$NS" get job "$job" -o jsonpath='{.status.succeeded}')" = 1 ] || fail "the fetch Job did not succeed"
# Everything the Job asked of the hub named the pinned commit.
tail -n +$((hub_mark + 1)) "$work/hub.log" >"$work/hub-job.log"
grep -q "^GET /api/models/$HUB_REPO/revision/$HUB_REV\$" "$work/hub-job.log" || fail "the Job never asked the hub for the pinned commit"
if grep -v "^GET /$HUB_REPO/resolve/$HUB_REV/\|^GET /api/models/$HUB_REPO/revision/$HUB_REV\$" "$work/hub-job.log"; then
  fail "the Job asked the hub for something else than the pinned commit"
fi
grep -q "^GET /$HUB_REPO/resolve/$HUB_REV/model.safetensors\$" "$work/hub-job.log" || fail "the weights were not fetched from the hub"
[ "$(identity "$work/pods/claims/demo-embedder-models/embedder")" = "$ID_MINILM" ] || fail "the claim does not hold the pinned model"
routes() { kubectl -n "$NS" get configmap demo-routes -o jsonpath='{.data.routes\.json}'; }
every_replica_routed() {
  python3 - "$(routes)" <<'PY'
import json, sys
t = json.loads(sys.argv[1])
want = {"embedder": 2, "reranker": 1, "generator": 1, "gateway": 1}
got = {c: len(t["components"].get(c, [])) for c in want}
assert got == want, got
PY
}
# Ready needs one verified pod per component; the second embedder may be a round later.
wait_for 60 "every replica in the routing table" every_replica_routed
kubectl -n "$NS" get configmap demo-routes -o jsonpath='{.data.policy\.json}' >"$work/policy.json"
gateway_ip="$(kubectl -n "$NS" get pods -l app.kubernetes.io/component=gateway -o jsonpath='{.items[0].status.podIP}')"
rag() { "$GELO" rag "$1" --gateway "$gateway_ip:50051" --policy "$work/policy.json" --expect-identity "$ID_MINILM" "${@:2}"; }
rag ingest --text "The GELO operator routes only to pods whose SEV-SNP evidence it verified." >/dev/null \
  || fail "ingest through the gateway"
answer="$(rag query --max-tokens 24 "Which pods does the GELO operator route to?")" || fail "query through the gateway"
# The ingested passage (a --text document is named text-<hash>) is among the sources.
[[ "$answer" == *"Sources:"*"[text-"* ]] || fail "the answer does not list the ingested passage: $answer"
log "   answered: $(echo "$answer" | head -1 | cut -c1-100)"

# Up to here every connection to a service's RA-TLS port was a client that verifies it; the
# probes ask the metrics port, so no service logged a handshake cut short. (Step 6 makes
# the gateway refuse a pod mid-handshake on purpose.)
if grep -l "RA-TLS handshake failed" "$work"/pods/*.log; then
  fail "a service logged an RA-TLS handshake cut short: $(grep -h "RA-TLS handshake failed" "$work"/pods/*.log | head -3)"
fi

log "6. a pod restarted with another launch measurement gets no request and leaves the routes"
# Embed calls a pod served, from its metrics port (the count restarts with its process).
embeds() {
  local m
  m="$(curl -sf "http://$1:9090/metrics")" || return 1
  python3 -c '
import re, sys
print(int(sum(float(v) for v in re.findall(r"^gelo_requests_total\{[^}]*method=\"Embed\"[^}]*\} (\S+)$", sys.argv[1], re.M))))' "$m"
}
query() { rag query --max-tokens 4 "Which pods does the GELO operator route to?" >/dev/null 2>&1; }
# The victim is an embedder the gateway has been sending requests to.
victim="" victim_ip=""
for _ in $(seq 8); do
  for pod in $(kubectl -n "$NS" get pods -l app.kubernetes.io/component=embedder -o jsonpath='{.items[*].metadata.name}'); do
    ip="$(kubectl -n "$NS" get pod "$pod" -o jsonpath='{.status.podIP}')"
    n="$(embeds "$ip")" || n=0
    if [ "$n" -gt 0 ]; then victim=$pod victim_ip=$ip; break 2; fi
  done
  query || true
done
[ -n "$victim" ] || fail "no embedder served an Embed call"
other_measurement="$(printf 'ab%.0s' $(seq 48))"
# The operator is paused while the pod restarts, so the gateway meets the restarted process
# while it is still in the routes (the worst case, a whole period; unpaused, the operator's
# pod watch usually re-attests it first). Well within the 15 s lease.
kill -STOP "$operator_pid"
kubectl -n "$NS" annotate pod "$victim" e2e.gelo.dev/env="{\"GELO_MOCK_MEASUREMENT\": \"$other_measurement\"}" >/dev/null
restarted() { [ "$(embeds "$victim_ip")" = 0 ]; }
wait_for 10 "the victim restarted with the new measurement" restarted
refused_by_gateway() { grep -h "$victim_ip:50051" "$work"/pods/demo-gateway-*.log | grep "is not allowed" >/dev/null; }
sent=0 paused=$SECONDS
while ! refused_by_gateway && [ $((SECONDS - paused)) -lt 6 ]; do
  query && sent=$((sent + 1))
done
kill -CONT "$operator_pid"
out_of_routes() { ! routes | grep "\"$victim_ip\"" >/dev/null; }
refused_by_gateway || fail "the gateway never met the re-measured pod ($sent queries answered)"
log "   the gateway refused the re-measured pod while it was routed; $sent queries answered meanwhile"
wait_for 40 "the re-measured pod leaves the routing table (period 10 s)" out_of_routes
n="$(embeds "$victim_ip")" || fail "the re-measured pod's metrics are unreachable"
[ "$n" = 0 ] || fail "the re-measured pod served $n Embed calls"
rejected() { kubectl -n "$NS" get events -o jsonpath='{range .items[*]}{.message}{"\n"}{end}' | grep "$victim" | grep measurement_not_allowed >/dev/null; }
wait_for 30 "the rejection is reported as an event naming the pod and the reason" rejected
rag query --max-tokens 8 "Which pods does the GELO operator route to?" >/dev/null || fail "query with one embedder out"

log "7. a field another manager set is reported, not overwritten"
kubectl -n "$NS" label deployment demo-generator app.kubernetes.io/managed-by=someone-else --overwrite >/dev/null
conflict() { kubectl -n "$NS" get events -o jsonpath='{range .items[?(@.reason=="FieldConflict")]}{.message}{"\n"}{end}' | grep "Deployment demo-generator" | grep "kubectl-label" >/dev/null; }
wait_for 40 "a FieldConflict event naming the object and the other manager" conflict
label="$(kubectl -n "$NS" get deployment demo-generator -o jsonpath='{.metadata.labels.app\.kubernetes\.io/managed-by}')"
[ "$label" = "someone-else" ] || fail "the operator overwrote another manager's field ($label)"
before="$(owned | sort)"

log "8. the operator killed and restarted converges without duplicates"
kill -9 "$operator_pid"; wait "$operator_pid" 2>/dev/null || true
kubectl -n "$SYSTEM_NS" delete lease gelo-operator >/dev/null # its holder is dead; don't wait for expiry
start_operator 2
wait_for 60 "the restarted operator takes the lease" \
  sh -c "[ \"\$(kubectl -n $SYSTEM_NS get lease gelo-operator -o jsonpath='{.spec.holderIdentity}')\" = gelo-operator-2 ]"
sleep 3
after="$(owned | sort)"
[ "$before" = "$after" ] || fail "objects changed across the restart: $(diff <(echo "$before") <(echo "$after"))"
n="$(kubectl -n "$NS" get deployments -l app.kubernetes.io/instance=demo -o name | wc -l)"
[ "$n" -eq 4 ] || fail "$n Deployments after the restart, not 4"

log "9. deleting the pipeline garbage-collects what it owned"
kubectl -n "$NS" delete prp demo --wait=true >/dev/null
gone() { [ -z "$(owned)" ]; }
wait_for 60 "owned objects garbage-collected" gone

log "passed in $(( $(date +%s) - t0 ))s"
