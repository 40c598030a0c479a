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
# With `node`, the same steps on a real node (scripts/k8s/node.sh: kubelet, kube-proxy,
# containerd, runc, CNI bridge) instead of kubelet.py: the pods run the images
# scripts/k8s/images.sh builds from the same binaries, named by digest, under the chart's
# and the operator's security contexts, with the kubelet's probes, volumes and Secret
# mounts; the operator runs as the chart's Deployment; the fetch Job reaches the hub
# through a Service; the query goes through the gateway's Service. The measurement change
# is an image swap (as in the kind suite), and one step more has the kubelet kill an
# embedder whose liveness probe fails and checks that the new process is verified again
# before it serves.
#
#   e2e/apiserver/run.sh        (scripts/test.sh runs it; the binaries build once, cached)
#   e2e/apiserver/run.sh node   (root; `scripts/k8s/node.sh deps` once)
set -euo pipefail
cd "$(dirname "$0")/../.."
mode="${1:-kubelet.py}"
case "$mode" in kubelet.py | node) ;; *) echo "usage: $0 [node]" >&2; exit 2 ;; esac
node() { [ "$mode" = node ]; }
SYSTEM_NS=gelo-system
NS=gelo-e2e

work="$(mktemp -d)"
operator_pid=""
kubelet_pid=""
hub_pid=""
cleanup() {
  status=$?
  if [ -n "$operator_pid" ]; then { kill -CONT "$operator_pid"; kill "$operator_pid"; } 2>/dev/null || true; fi
  if [ -n "$hub_pid" ]; then kill "$hub_pid" 2>/dev/null || true; fi
  if [ -n "$kubelet_pid" ]; then { kill "$kubelet_pid" 2>/dev/null; wait "$kubelet_pid" 2>/dev/null; } || true; fi
  if [ $status -ne 0 ] && node && [ -d "$work/cp/node" ]; then
    kubectl get pods -A -o wide >&2 2>/dev/null || true
    kubectl -n "$NS" get events --sort-by=.lastTimestamp 2>/dev/null | tail -25 >&2 || true
    for f in "$work"/cp/node/logs/*.log $(pod_logs) $(pod_logs "" "$SYSTEM_NS"); do
      echo "--- tail of $f" >&2; tail -15 "$f" >&2
    done
  fi
  if node; then scripts/k8s/node.sh stop "$work/cp" || true; fi
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
suite="apiserver e2e"
if node; then suite+=", real node"; fi
log() { echo "[$suite] $*"; }
fail() { echo "[$suite] FAIL: $*" >&2; exit 1; }
# The log files of pods (name prefix, namespace), whoever ran them.
pod_logs() {
  if node; then
    find "$work/cp/node/pod-logs" -path "*/${2:-$NS}_${1:-}*" -name '*.log' 2>/dev/null || true
  else
    ls "$work"/pods/"${1:-}"*.log 2>/dev/null || true
  fi
}
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
if node; then
  [ "$(id -u)" = 0 ] || fail "a real node needs root"
  scripts/k8s/build.sh node >/dev/null
fi
kubeconfig="$(scripts/k8s/controlplane.sh start "$work/cp" "$(node && echo node || echo loopback)")" || fail "the control plane did not start"
bin="$(cat "$work/cp/bin")"
export KUBECONFIG="$kubeconfig" PATH="$bin:$PATH"
log "control plane up in $(( $(date +%s) - t0 ))s: $(kubectl version -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["serverVersion"]["gitVersion"])')"
chart_values=()
if node; then
  t1=$(date +%s)
  NODE="$(scripts/k8s/node.sh start "$work/cp")" || fail "the node did not start"
  node_ip="$(cat "$work/cp/advertise")"
  log "node $NODE Ready in $(( $(date +%s) - t1 ))s: $(kubectl get node "$NODE" -o jsonpath='kubelet {.status.nodeInfo.kubeletVersion}, {.status.nodeInfo.containerRuntimeVersion}, {.status.nodeInfo.osImage}')"
  t1=$(date +%s)
  scripts/k8s/images.sh build "$work/images" gelo="$GELO" gelo-operator="$operator" >/dev/null
  scripts/k8s/node.sh import "$work/cp" "$work/images"
  ref() { sed -n "s/^$1=//p" "$work/images/refs"; }
  GELO_IMAGE="$(ref gelo)" TAMPERED_IMAGE="$(ref gelo-tampered)" OPERATOR_IMAGE="$(ref gelo-operator)"
  log "images built and imported in $(( $(date +%s) - t1 ))s: $GELO_IMAGE, $OPERATOR_IMAGE"
  # The hub runs on this machine, behind a Service of fixed address that the fetch Job asks.
  HUB_SERVICE_IP=10.96.200.200
  chart_values=(--set "image.repository=${OPERATOR_IMAGE%@*}" --set "image.digest=${OPERATOR_IMAGE#*@}"
    --set image.pullPolicy=Never --set logFormat=text --set "hub.endpoint=http://$HUB_SERVICE_IP")
fi

log "1. the chart: helm lint, helm install"
helm lint charts/gelo >"$work/lint.txt" || { cat "$work/lint.txt"; fail "helm lint"; }
helm install gelo charts/gelo --namespace "$SYSTEM_NS" --create-namespace \
  --set attestation.allowMockRoots=true "${chart_values[@]}" >/dev/null 2>"$work/install.err" || { cat "$work/install.err"; fail "helm install"; }
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
if node; then
  # A volume's symbolic links would point outside it in the container: hard links (or copies).
  cp -rl "$cache/all-minilm-l6-v2" "$work/models/" 2>/dev/null || cp -r "$cache/all-minilm-l6-v2" "$work/models/"
  cp -l "$cache/smollm2-135m-instruct.gguf" "$work/models/smollm2-135m/" 2>/dev/null \
    || cp "$cache/smollm2-135m-instruct.gguf" "$work/models/smollm2-135m/"
  chmod 0755 "$work" "$work/models" "$work/models/smollm2-135m" # the pods run as uid 65532
else
  ln -s "$cache/all-minilm-l6-v2" "$work/models/all-minilm-l6-v2"
  ln -s "$cache/smollm2-135m-instruct.gguf" "$work/models/smollm2-135m/smollm2-135m-instruct.gguf"
fi
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
hub_ip=127.0.0.1
if node; then hub_ip="$node_ip"; fi # where the pods reach this machine
python3 e2e/apiserver/hub.py --port-file "$work/hub.port" --log "$work/hub.log" --listen "$hub_ip:0" \
  --repo "$HUB_REPO@$HUB_REV=$cache/all-minilm-l6-v2" --repo "$HUB_REPO@$TAMPERED_REV=$work/tampered" &
hub_pid=$!
wait_for 10 "the hub serves" test -s "$work/hub.port"
HUB="http://$hub_ip:$(cat "$work/hub.port")"
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
if node; then
  # Volumes for the claims, bound to them ahead (no provisioner here): the staged models,
  # and the folder the embedder's fetch Job writes, owned by the pods' user (a hostPath
  # volume gets no fsGroup). The hub's Service: this machine's address, the hub's port.
  mkdir -p "$work/claims/demo-embedder-models"
  chown 65532:65532 "$work/claims/demo-embedder-models"
  chmod 0755 "$work/claims"
  kubectl apply -f - >/dev/null <<EOF
apiVersion: v1
kind: PersistentVolume
metadata: {name: gelo-e2e-models}
spec:
  capacity: {storage: 2Gi}
  accessModes: [ReadOnlyMany]
  storageClassName: ""
  persistentVolumeReclaimPolicy: Retain
  claimRef: {namespace: $NS, name: gelo-models}
  hostPath: {path: "$work/models", type: Directory}
---
apiVersion: v1
kind: PersistentVolume
metadata: {name: gelo-e2e-embedder-models}
spec:
  capacity: {storage: 20Gi} # at least the operator's claim (spec.storage.size, 10Gi)
  accessModes: [ReadWriteOnce, ReadOnlyMany, ReadWriteMany]
  persistentVolumeReclaimPolicy: Retain
  claimRef: {namespace: $NS, name: demo-embedder-models}
  hostPath: {path: "$work/claims/demo-embedder-models", type: Directory}
---
apiVersion: v1
kind: Service
metadata: {name: hub, namespace: $SYSTEM_NS}
spec:
  clusterIP: $HUB_SERVICE_IP
  ports: [{name: http, port: 80, targetPort: $(cat "$work/hub.port")}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: hub, namespace: $SYSTEM_NS, labels: {kubernetes.io/service-name: hub}}
addressType: IPv4
endpoints: [{addresses: ["$node_ip"]}]
ports: [{name: http, port: $(cat "$work/hub.port")}]
EOF
fi
python3 - "$ID_MINILM" "$ID_SMOL" "$HUB_REPO" "$HUB_REV" "${GELO_IMAGE:-}" >"$work/pipeline.yaml" <<'PY'
import sys
minilm, smol, repo, rev, image = sys.argv[1:6]
text = open("e2e/kind/sample-pipeline.yaml").read()
if image:  # the image built for the node, by digest
    assert "  image: gelo:e2e\n" in text
    text = text.replace("  image: gelo:e2e\n", f"  image: {image}\n", 1)
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
# On the node: the host's process id of a pod's (first) container, from containerd.
container_pid() { # namespace pod
  local id
  id="$(kubectl -n "$1" get pod "$2" -o jsonpath='{.status.containerStatuses[0].containerID}')"
  ctr --address "$work/cp/node/containerd.sock" --namespace k8s.io tasks ls | awk -v id="${id#containerd://}" '$1 == id {print $2}'
}
operator_pod() { kubectl -n "$SYSTEM_NS" get pods -l app.kubernetes.io/name=gelo-operator -o jsonpath='{.items[0].metadata.name}'; }
if node; then
  # The chart's Deployment runs the operator (since step 1), in its pod as that account.
  operator_ready() { [ "$(kubectl -n "$SYSTEM_NS" get deployment gelo-operator -o jsonpath='{.status.readyReplicas}')" = 1 ]; }
  wait_for 120 "the chart's operator pod Ready through its probes" operator_ready
  operator_holder="$(operator_pod)"
  [ "$(kubectl -n "$SYSTEM_NS" get pod "$operator_holder" -o jsonpath='{.spec.serviceAccountName}')" = gelo-operator ] \
    || fail "the operator pod's ServiceAccount"
else
  python3 e2e/apiserver/kubelet.py --kubeconfig "$KUBECONFIG" --namespace "$NS" --gelo "$GELO" \
    --claim gelo-models="$work/models" --work "$work/pods" >"$work/kubelet.log" 2>&1 &
  kubelet_pid=$!
  start_operator 1
  operator_holder=gelo-operator-1
fi
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
[ "$lease" = "$operator_holder" ] || fail "leader lease held by '$lease', not $operator_holder"

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
claim_dir="$work/pods/claims/demo-embedder-models"
if node; then claim_dir="$work/claims/demo-embedder-models"; fi
[ "$(identity "$claim_dir/embedder")" = "$ID_MINILM" ] || fail "the claim does not hold the pinned model"
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
if node; then
  # Through the gateway's Service (kube-proxy's rules), as a client in the cluster would.
  gateway_ip="$(kubectl -n "$NS" get service demo-gateway -o jsonpath='{.spec.clusterIP}')"
  [ -n "$gateway_ip" ] || fail "no ClusterIP on the gateway's Service"
fi
rag() { "$GELO" rag "$1" --gateway "$gateway_ip:50051" --policy "$work/policy.json" --expect-identity "$ID_MINILM" "${@:2}"; }
rag ingest --text "The GELO operator routes only to pods whose SEV-SNP evidence it verified." >/dev/null \
  || fail "ingest through the gateway"
answer="$(rag query --max-tokens 24 "Which pods does the GELO operator route to?")" || fail "query through the gateway"
# The ingested passage (a --text document is named text-<hash>) is among the sources.
[[ "$answer" == *"Sources:"*"[text-"* ]] || fail "the answer does not list the ingested passage: $answer"
log "   answered: $(echo "$answer" | head -1 | cut -c1-100)"
if node; then
  # The five pods' processes, as the kernel sees them: runc's containers with the operator's
  # security contexts (uid/gid 65532, no capabilities, no privilege gain, seccomp filter,
  # read-only root), Ready through the kubelet's probes.
  pods="$(kubectl -n "$NS" get pods -l app.kubernetes.io/instance=demo --field-selector=status.phase=Running -o jsonpath='{.items[*].metadata.name}')"
  [ "$(echo "$pods" | wc -w)" -eq 5 ] || fail "not five running pods: $pods"
  for pod in $pods; do
    pid="$(container_pid "$NS" "$pod")"
    [ -n "$pid" ] || fail "$pod: no container task in containerd"
    python3 - "$pod" "$pid" <<'PY' || fail "$pod: the security context is not applied"
import sys
pod, pid = sys.argv[1], sys.argv[2]
st = dict(l.split(":", 1) for l in open(f"/proc/{pid}/status").read().splitlines() if ":" in l)
want = {"Uid": "65532\t65532\t65532\t65532", "Gid": "65532\t65532\t65532\t65532", "CapEff": "0000000000000000",
        "CapPrm": "0000000000000000", "CapBnd": "0000000000000000", "NoNewPrivs": "1", "Seccomp": "2"}
bad = {k: st.get(k, "").strip() for k, v in want.items() if st.get(k, "").strip() != v}
assert not bad, f"{pod}: {bad}"
root = [l.split() for l in open(f"/proc/{pid}/mountinfo") if l.split()[4] == "/"]
assert root and "ro" in root[0][5].split(","), f"{pod}: root mount {root}"
PY
    [ "$(kubectl -n "$NS" get pod "$pod" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" = True ] || fail "$pod is not Ready"
  done
  runtime="$(ctr --address "$work/cp/node/containerd.sock" --namespace k8s.io containers info \
    "$(kubectl -n "$NS" get pod "$(echo "$pods" | cut -d' ' -f1)" -o jsonpath='{.status.containerStatuses[0].containerID}' | sed 's|containerd://||')" \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["Runtime"]["Name"])')"
  [ "$runtime" = io.containerd.runc.v2 ] || fail "the containers run under $runtime"
  log "   five pods under $runtime ($(command -v runc) $(runc --version | head -1 | cut -d' ' -f3)): uid 65532, no capabilities, no_new_privs, seccomp, read-only root; Ready by their probes"
fi

# Up to here every connection to a service's RA-TLS port was a client that verifies it; the
# probes ask the metrics port, so no service logged a handshake cut short. (Step 6 makes
# the gateway refuse a pod mid-handshake on purpose.)
[ -n "$(pod_logs)" ] || fail "no pod logs found"
if pod_logs | xargs -r grep -l "RA-TLS handshake failed"; then
  fail "a service logged an RA-TLS handshake cut short: $(pod_logs | xargs -r grep -h "RA-TLS handshake failed" | head -3)"
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
paused_pid="$operator_pid"
if node; then paused_pid="$(container_pid "$SYSTEM_NS" "$operator_holder")"; fi
kill -STOP "$paused_pid"
if node; then
  # Other code where a verified pod ran: the image whose mock launch measurement differs.
  kubectl -n "$NS" set image "pod/$victim" "gelo=$TAMPERED_IMAGE" >/dev/null
else
  kubectl -n "$NS" annotate pod "$victim" e2e.gelo.dev/env="{\"GELO_MOCK_MEASUREMENT\": \"$other_measurement\"}" >/dev/null
fi
restarted() { [ "$(embeds "$victim_ip")" = 0 ]; }
wait_for 10 "the victim restarted with the new measurement" restarted
refused_by_gateway() { pod_logs demo-gateway- | xargs -r grep -h "$victim_ip:50051" | grep "is not allowed" >/dev/null; }
sent=0 paused=$SECONDS
while ! refused_by_gateway && [ $((SECONDS - paused)) -lt 6 ]; do
  query && sent=$((sent + 1))
done
kill -CONT "$paused_pid"
out_of_routes() { ! routes | grep "\"$victim_ip\"" >/dev/null; }
refused_by_gateway || fail "the gateway never met the re-measured pod ($sent queries answered)"
log "   the gateway refused the re-measured pod while it was routed; $sent queries answered meanwhile"
wait_for 40 "the re-measured pod leaves the routing table (period 10 s)" out_of_routes
n="$(embeds "$victim_ip")" || fail "the re-measured pod's metrics are unreachable"
[ "$n" = 0 ] || fail "the re-measured pod served $n Embed calls"
rejected() { kubectl -n "$NS" get events -o jsonpath='{range .items[*]}{.message}{"\n"}{end}' | grep "$victim" | grep measurement_not_allowed >/dev/null; }
wait_for 30 "the rejection is reported as an event naming the pod and the reason" rejected
rag query --max-tokens 8 "Which pods does the GELO operator route to?" >/dev/null || fail "query with one embedder out"

if node; then
  log "6b. an embedder whose liveness probe fails is killed by the kubelet, verified again before it serves"
  # (The fetch Job's pod carries the embedder's labels too, and has Succeeded.)
  honest="$(kubectl -n "$NS" get pods -l app.kubernetes.io/component=embedder --field-selector=status.phase=Running \
    -o jsonpath='{.items[*].metadata.name}' | tr ' ' '\n' | grep -vx "$victim" | head -1)"
  [ -n "$honest" ] || fail "no other running embedder than $victim"
  honest_ip="$(kubectl -n "$NS" get pod "$honest" -o jsonpath='{.status.podIP}')"
  spki() { routes | python3 -c 'import json,sys; t=json.load(sys.stdin); print(" ".join(r["tlsSpkiSha256"] for rs in t["components"].values() for r in rs if r.get("podIP", r.get("ip")) == sys.argv[1] or r.get("pod") == sys.argv[2]))' "$honest_ip" "$honest"; }
  old_spki="$(spki)"
  [ -n "$old_spki" ] || fail "$honest is not routed before its liveness fails"
  restarts() { kubectl -n "$NS" get pod "$honest" -o jsonpath='{.status.containerStatuses[0].restartCount}'; }
  restarts_before="$(restarts)"
  # A stopped process answers no probe: /healthz times out three periods in a row (10 s).
  kill -STOP "$(container_pid "$NS" "$honest")"
  killed=$SECONDS
  liveness_restart() { [ "$(restarts)" -gt "$restarts_before" ]; }
  wait_for 150 "the kubelet restarts the unresponsive embedder" liveness_restart
  kubectl -n "$NS" get events --field-selector "involvedObject.name=$honest" -o jsonpath='{range .items[*]}{.message}{"\n"}{end}' \
    | grep "Liveness probe failed" >/dev/null || fail "no 'Liveness probe failed' event for $honest"
  log "   restarted by the kubelet $((SECONDS - killed))s after it stopped answering"
  # Until its route carries the new process's key, the new process serves nothing. (Embed
  # count first, routes after: a count seen before the new key was routed is a failure.)
  verified=""
  for _ in $(seq 120); do
    n="$(embeds "$honest_ip")" || n=0
    now="$(spki)"
    if [ -n "$now" ] && [ "$now" != "$old_spki" ]; then verified=1; break; fi
    [ "$n" = 0 ] || fail "the restarted embedder served $n Embed calls before it was verified again"
    query || true
    sleep 0.5
  done
  [ -n "$verified" ] || fail "the restarted embedder was not verified again (its route: '$(spki)')"
  served() { query; [ "$(embeds "$honest_ip")" -gt 0 ]; }
  wait_for 60 "the re-verified embedder serves again" served
  log "   re-verified with a new RA-TLS key before its first request, then served"
fi

log "7. a field another manager set is reported, not overwritten"
kubectl -n "$NS" label deployment demo-generator app.kubernetes.io/managed-by=someone-else --overwrite >/dev/null
conflict() { kubectl -n "$NS" get events -o jsonpath='{range .items[?(@.reason=="FieldConflict")]}{.message}{"\n"}{end}' | grep "Deployment demo-generator" | grep "kubectl-label" >/dev/null; }
wait_for 40 "a FieldConflict event naming the object and the other manager" conflict
label="$(kubectl -n "$NS" get deployment demo-generator -o jsonpath='{.metadata.labels.app\.kubernetes\.io/managed-by}')"
[ "$label" = "someone-else" ] || fail "the operator overwrote another manager's field ($label)"
before="$(owned | sort)"

log "8. the operator killed and restarted converges without duplicates"
if node; then
  # Killed in its container; the kubelet starts it again in the same pod.
  op_restarts="$(kubectl -n "$SYSTEM_NS" get pod "$operator_holder" -o jsonpath='{.status.containerStatuses[0].restartCount}')"
  kill -9 "$(container_pid "$SYSTEM_NS" "$operator_holder")"
  op_restarted() { [ "$(kubectl -n "$SYSTEM_NS" get pod "$operator_holder" -o jsonpath='{.status.containerStatuses[0].restartCount}')" -gt "$op_restarts" ]; }
  wait_for 60 "the kubelet restarts the killed operator" op_restarted
  kubectl -n "$SYSTEM_NS" delete lease gelo-operator >/dev/null # taken again only by the new process
else
  kill -9 "$operator_pid"; wait "$operator_pid" 2>/dev/null || true
  kubectl -n "$SYSTEM_NS" delete lease gelo-operator >/dev/null # its holder is dead; don't wait for expiry
  start_operator 2
  operator_holder=gelo-operator-2
fi
wait_for 60 "the restarted operator takes the lease" \
  sh -c "[ \"\$(kubectl -n $SYSTEM_NS get lease gelo-operator -o jsonpath='{.spec.holderIdentity}')\" = $operator_holder ]"
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
