#!/usr/bin/env bash
# A Kubernetes control plane on loopback, from the binaries scripts/k8s/build.sh built:
# etcd, kube-apiserver (RBAC, service-account tokens, client certificates) and
# kube-controller-manager (garbage collection, Jobs, Deployments → ReplicaSets → Pods).
# No kubelet and no container runtime: Pods are created and stay Pending unless a test
# plays the kubelet, or scripts/k8s/node.sh starts a real node against it.
#
#   scripts/k8s/controlplane.sh start DIR    # writes DIR/admin.kubeconfig, prints it; DIR/*.log
#   scripts/k8s/controlplane.sh start DIR node
#   scripts/k8s/controlplane.sh stop DIR
#
# With `node`, the control plane is one a kubelet and its pods can reach: the API server
# listens on every address and advertises this machine's primary address (the `kubernetes`
# Service's endpoint, which pods reach through kube-proxy at 10.96.0.1), its certificate
# names both, it authorizes kubelets with the Node authorizer (NodeRestriction admission),
# and it has a client certificate for the kubelets' API (logs, exec); kube-scheduler runs
# too (scripts/k8s/build.sh node builds it), to put the pods on the node.
set -euo pipefail
cd "$(dirname "$0")/../.."

cmd="${1:?start|stop}"
dir="${2:?state folder}"
mode="${3:-loopback}"
mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"

stop() {
  for p in kube-scheduler kube-controller-manager kube-apiserver etcd; do
    if [ -f "$dir/$p.pid" ]; then
      kill "$(cat "$dir/$p.pid")" 2>/dev/null || true
      for _ in $(seq 50); do kill -0 "$(cat "$dir/$p.pid")" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$(cat "$dir/$p.pid")" 2>/dev/null || true
      rm -f "$dir/$p.pid"
    fi
  done
}
if [ "$cmd" = stop ]; then stop; exit 0; fi
[ "$cmd" = start ] || { echo "usage: $0 start|stop DIR [node]" >&2; exit 2; }
case "$mode" in loopback | node) ;; *) echo "usage: $0 start DIR [node]" >&2; exit 2 ;; esac

if [ "$mode" = node ]; then bin="$(scripts/k8s/build.sh node)"; else bin="$(scripts/k8s/build.sh)"; fi
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
etcd_client=$(free_port); etcd_peer=$(free_port); api=$(free_port)

# --- certificates: a cluster CA, the API server's serving certificate, client identities
pki="$dir/pki"
mkdir -p "$pki"
ossl() { openssl "$@" 2>/dev/null; }
ossl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=gelo-test-cluster-ca" -keyout "$pki/ca.key" -out "$pki/ca.crt"
client() { # name, subject
  ossl req -newkey rsa:2048 -nodes -subj "$2" -keyout "$pki/$1.key" -out "$pki/$1.csr"
  ossl x509 -req -in "$pki/$1.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial -days 2 -out "$pki/$1.crt" ${3:+-extfile "$3"}
}
san="IP:127.0.0.1,DNS:localhost,DNS:kubernetes.default.svc"
bind=127.0.0.1 advertise=127.0.0.1 authz=RBAC reconciler=none node_flags=()
if [ "$mode" = node ]; then
  # The address the default route leaves by: the node's, and the API server's for pods.
  advertise="$(ip -4 route get 1.1.1.1 | sed -n 's/.* src \([0-9.]*\).*/\1/p')"
  [ -n "$advertise" ] || { echo "controlplane.sh: no primary IPv4 address for node mode" >&2; exit 1; }
  bind=0.0.0.0
  san+=",IP:$advertise,IP:10.96.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc.cluster.local"
  authz="Node,RBAC" reconciler=lease
  node_flags=(--enable-admission-plugins NodeRestriction
    --kubelet-client-certificate "$pki/apiserver-kubelet-client.crt" --kubelet-client-key "$pki/apiserver-kubelet-client.key")
fi
printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth\n' "$san" >"$pki/serving.ext"
client apiserver "/CN=kube-apiserver" "$pki/serving.ext"
client admin "/O=system:masters/CN=gelo-test-admin"
client controller-manager "/CN=system:kube-controller-manager"
client scheduler "/CN=system:kube-scheduler"
if [ "$mode" = node ]; then client apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client"; fi
ossl genrsa -out "$pki/sa.key" 2048
ossl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub"

kubeconfig() { # name → a kubeconfig with that client certificate
  cat >"$dir/$1.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: gelo-test
  cluster: {server: "https://127.0.0.1:$api", certificate-authority: "$pki/ca.crt"}
users:
- name: $1
  user: {client-certificate: "$pki/$1.crt", client-key: "$pki/$1.key"}
contexts:
- name: gelo-test
  context: {cluster: gelo-test, user: $1}
current-context: gelo-test
EOF
}
kubeconfig admin
kubeconfig controller-manager
kubeconfig scheduler

# --- etcd
"$bin/etcd" --name gelo-test --data-dir "$dir/etcd" \
  --listen-client-urls "http://127.0.0.1:$etcd_client" --advertise-client-urls "http://127.0.0.1:$etcd_client" \
  --listen-peer-urls "http://127.0.0.1:$etcd_peer" --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer" \
  --initial-cluster "gelo-test=http://127.0.0.1:$etcd_peer" --log-level warn >"$dir/etcd.log" 2>&1 &
echo $! >"$dir/etcd.pid"

# --- kube-apiserver
"$bin/kube-apiserver" \
  --etcd-servers "http://127.0.0.1:$etcd_client" \
  --bind-address "$bind" --advertise-address "$advertise" --secure-port "$api" \
  --endpoint-reconciler-type "$reconciler" \
  --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
  --client-ca-file "$pki/ca.crt" \
  --authorization-mode "$authz" "${node_flags[@]}" \
  --service-account-issuer https://kubernetes.default.svc \
  --service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
  --service-cluster-ip-range 10.96.0.0/16 \
  --allow-privileged=false --v 1 >"$dir/kube-apiserver.log" 2>&1 &
echo $! >"$dir/kube-apiserver.pid"

kubectl() { "$bin/kubectl" --kubeconfig "$dir/admin.kubeconfig" "$@"; }
for _ in $(seq 120); do
  if kubectl get --raw /readyz >/dev/null 2>&1; then break; fi
  kill -0 "$(cat "$dir/kube-apiserver.pid")" 2>/dev/null || { tail -20 "$dir/kube-apiserver.log" >&2; stop; exit 1; }
  sleep 0.5
done
kubectl get --raw /readyz >/dev/null || { echo "kube-apiserver not ready; see $dir/kube-apiserver.log" >&2; stop; exit 1; }

# --- kube-controller-manager: garbage collector, Deployments, ReplicaSets, Jobs, namespaces
"$bin/kube-controller-manager" \
  --kubeconfig "$dir/controller-manager.kubeconfig" \
  --authentication-kubeconfig "$dir/controller-manager.kubeconfig" \
  --authorization-kubeconfig "$dir/controller-manager.kubeconfig" \
  --service-account-private-key-file "$pki/sa.key" --root-ca-file "$pki/ca.crt" \
  --use-service-account-credentials \
  --leader-elect=false --bind-address 127.0.0.1 --secure-port 0 \
  --cluster-signing-cert-file "$pki/ca.crt" --cluster-signing-key-file "$pki/ca.key" \
  --v 1 >"$dir/kube-controller-manager.log" 2>&1 &
echo $! >"$dir/kube-controller-manager.pid"

if [ "$mode" = node ]; then
  # --- kube-scheduler: the Pods onto the node
  "$bin/kube-scheduler" --kubeconfig "$dir/scheduler.kubeconfig" \
    --authentication-kubeconfig "$dir/scheduler.kubeconfig" --authorization-kubeconfig "$dir/scheduler.kubeconfig" \
    --leader-elect=false --bind-address 127.0.0.1 --secure-port 0 --v 1 >"$dir/kube-scheduler.log" 2>&1 &
  echo $! >"$dir/kube-scheduler.pid"
fi

echo "$bin" >"$dir/bin"
echo "$advertise" >"$dir/advertise"
echo "$api" >"$dir/port"
echo "$dir/admin.kubeconfig"
