#!/usr/bin/env bash
# A real Kubernetes node on this machine, registered with the control plane that
# `scripts/k8s/controlplane.sh start DIR node` started: containerd, runc and the CNI
# bridge/host-local/loopback plugins (Debian packages, pinned below), the kubelet and
# kube-proxy of the control plane's k8s.io/kubernetes version (scripts/k8s/build.sh node),
# and a pause image built by scripts/k8s/images.sh, referenced by digest. Needs root,
# cgroups (v1 or v2), overlayfs and network namespaces.
#
#   scripts/k8s/node.sh deps          # apt-get install the pinned packages (Debian 12)
#   scripts/k8s/node.sh start DIR     # DIR: the control plane's folder; the node's state in DIR/node
#   scripts/k8s/node.sh import DIR OUT   # load the layouts of `images.sh build OUT` into its containerd
#   scripts/k8s/node.sh stop DIR      # stops everything, removes what it mounted, made and added
#
# One node at a time per machine: the bridge (gelo0), the pod subnet (10.244.0.0/24), the
# kubepods cgroups and kube-proxy's iptables chains are the machine's. Pods get no cluster
# DNS (no CoreDNS: the services find each other through the operator's routing table and
# reach the API server at the `kubernetes` Service's address); they resolve with the host's
# /etc/resolv.conf.
set -euo pipefail
cd "$(dirname "$0")/../.."

# Debian 12 (bookworm) versions.
CONTAINERD_PIN="1.6.20~ds1-1+deb12u3"
RUNC_PIN="1.1.5+ds1-1+deb12u1"
CNI_PIN="1.1.1+ds1-3+b5"
UMOCI_PIN="0.4.7+ds-3+b7"
NODE=gelo-node
BRIDGE=gelo0
POD_CIDR=10.244.0.0/24
CNI_BIN=/usr/lib/cni

log() { echo "k8s node: $*" >&2; }
die() { log "$*"; exit 1; }

cmd="${1:?deps|start|import|stop}"
if [ "$cmd" = deps ]; then
  pkgs=("containerd=$CONTAINERD_PIN" "runc=$RUNC_PIN" "containernetworking-plugins=$CNI_PIN" "umoci=$UMOCI_PIN")
  installed=1
  for pkg in "${pkgs[@]}"; do
    [ "$(dpkg-query -W -f '${Version}' "${pkg%%=*}" 2>/dev/null || true)" = "${pkg#*=}" ] || installed=""
  done
  for tool in iptables conntrack; do command -v "$tool" >/dev/null || installed=""; done
  [ -n "$installed" ] && exit 0
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${pkgs[@]}" iptables conntrack >/dev/null
  exit 0
fi
dir="${2:?the control plane folder}"
dir="$(cd "$dir" && pwd)"
n="$dir/node"
sock="$n/containerd.sock"
ctr() { command ctr --address "$sock" --namespace k8s.io "$@"; }

if [ "$cmd" = import ]; then
  scripts/k8s/images.sh import "$sock" "${3:?layouts folder}"
  exit 0
fi

alive() { [ -f "$n/$1.pid" ] && kill -0 "$(cat "$n/$1.pid")" 2>/dev/null; }
stop_pid() { # name: TERM, then KILL after 10 s
  [ -f "$n/$1.pid" ] || return 0
  local pid
  pid="$(cat "$n/$1.pid")"
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null || true
  rm -f "$n/$1.pid"
}

stop() {
  [ -d "$n" ] || return 0
  stop_pid kube-proxy
  stop_pid kubelet
  # The pods' containers and sandboxes: without the kubelet nothing stops them, so kill and
  # delete every task, then the containers; each shim exits with its last task.
  if alive containerd; then
    local ids id
    ids="$(ctr tasks ls 2>/dev/null | awk 'NR > 1 {print $1}')"
    for id in $ids; do ctr tasks kill -s SIGKILL "$id" >/dev/null 2>&1 || true; done
    for id in $ids; do
      for _ in $(seq 50); do ctr tasks delete "$id" >/dev/null 2>&1 && break; sleep 0.1; done
    done
    for id in $(ctr containers ls -q 2>/dev/null); do ctr containers delete "$id" >/dev/null 2>&1 || true; done
  fi
  # Shims left behind by a containerd that died: their pid files are in its state folder.
  local f
  for f in "$n"/containerd/state/io.containerd.runtime.v2.task/k8s.io/*/shim.pid; do
    if [ -f "$f" ]; then kill -9 "$(cat "$f")" 2>/dev/null || true; fi
  done
  stop_pid containerd
  # The sandboxes' network namespaces (their veths go with them).
  if [ -f "$n/netns.before" ]; then
    local ns
    for ns in $(ip netns list | awk '{print $1}' | grep '^cni-' || true); do
      grep -qx "$ns" "$n/netns.before" || ip netns delete "$ns" 2>/dev/null || true
    done
  fi
  # Every mount below the node's folder (volumes, container root filesystems, shm), deepest first.
  local m
  awk -v p="$n/" 'index($5, p) == 1 {print $5}' /proc/self/mountinfo | sort -r | while read -r m; do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
  done
  # The cgroups the kubelet made (cgroupfs driver: /kubepods in each hierarchy).
  local c
  for c in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods /sys/fs/cgroup/unified/kubepods; do
    if [ -d "$c" ]; then find "$c" -depth -type d -exec rmdir {} + 2>/dev/null || true; fi
  done
  # The kubelet's links to the containers' logs (in /var/log/containers whatever podLogsDir says).
  find /var/log/containers -maxdepth 1 -lname "$n/*" -delete 2>/dev/null || true
  rmdir /var/log/containers 2>/dev/null || true # only when empty
  ip link delete "$BRIDGE" 2>/dev/null || true
  # kube-proxy's chains and rules.
  if [ -f "$n/kube-proxy.yaml" ] && [ -x "$(cat "$dir/bin")/kube-proxy" ]; then
    "$(cat "$dir/bin")/kube-proxy" --config "$n/kube-proxy.yaml" --cleanup >/dev/null 2>&1 || true
  fi
  # The kubelet's own (KUBE-FIREWALL, KUBE-KUBELET-CANARY), which kube-proxy leaves.
  local ipt table rule chain
  for ipt in iptables ip6tables; do
    command -v "$ipt" >/dev/null || continue
    for table in filter nat mangle; do
      { "$ipt" -t "$table" -S 2>/dev/null || true; } | { grep -E '^-A [A-Z]+ .*-j KUBE-' || true; } | { grep -vE '^-A KUBE-' || true; } \
        | while read -r rule; do
          # iptables -S quotes a rule as a shell would: eval gives back its arguments.
          eval "$ipt -t $table ${rule/-A/-D}" 2>/dev/null || true
        done
      for chain in $("$ipt" -t "$table" -S 2>/dev/null | sed -n 's/^-N \(KUBE-[A-Z0-9-]*\)$/\1/p' || true); do
        "$ipt" -t "$table" -F "$chain" 2>/dev/null || true
      done
      for chain in $("$ipt" -t "$table" -S 2>/dev/null | sed -n 's/^-N \(KUBE-[A-Z0-9-]*\)$/\1/p' || true); do
        "$ipt" -t "$table" -X "$chain" 2>/dev/null || true
      done
    done
  done
  # The kernel settings as they were.
  if [ -f "$n/sysctl.before" ]; then
    local key value
    while read -r key value; do sysctl -qw "$key=$value" 2>/dev/null || true; done <"$n/sysctl.before"
  fi
  rm -rf "$n"
}
if [ "$cmd" = stop ]; then stop; exit 0; fi
[ "$cmd" = start ] || { echo "usage: $0 deps | start DIR | import DIR OUT | stop DIR" >&2; exit 2; }

[ "$(id -u)" = 0 ] || die "needs root (containers, mounts, cgroups, network namespaces)"
[ -f "$dir/advertise" ] || die "no control plane in $dir (scripts/k8s/controlplane.sh start DIR node)"
node_ip="$(cat "$dir/advertise")"
[ "$node_ip" != 127.0.0.1 ] || die "the control plane in $dir listens on loopback only: start it with 'node'"
for pkg in containerd:$CONTAINERD_PIN runc:$RUNC_PIN containernetworking-plugins:$CNI_PIN umoci:$UMOCI_PIN; do
  have="$(dpkg-query -W -f '${Version}' "${pkg%%:*}" 2>/dev/null || true)"
  [ -n "$have" ] || die "${pkg%%:*} is not installed: scripts/k8s/node.sh deps"
  [ "$have" = "${pkg#*:}" ] || log "${pkg%%:*} $have, not the pinned ${pkg#*:}"
done
for plugin in bridge host-local loopback; do [ -x "$CNI_BIN/$plugin" ] || die "no CNI plugin $CNI_BIN/$plugin"; done
bin="$(scripts/k8s/build.sh node)"
api_port="$(cat "$dir/port")"
pki="$dir/pki"
rm -rf "$n"
mkdir -p "$n/cni" "$n/logs"
t0=$SECONDS

cgroup_version=1
[ "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs ] && cgroup_version=2
log "cgroup v$cgroup_version; containerd $(dpkg-query -W -f '${Version}' containerd), runc $(dpkg-query -W -f '${Version}' runc)"

# --- kernel settings the node needs, remembered for stop
: >"$n/sysctl.before"
for key in net.ipv4.ip_forward net.bridge.bridge-nf-call-iptables; do
  value="$(sysctl -n "$key" 2>/dev/null)" || continue
  echo "$key $value" >>"$n/sysctl.before"
done
sysctl -qw net.ipv4.ip_forward=1
# Pod → Service → pod on the same bridge goes through kube-proxy's rules only with this.
sysctl -qw net.bridge.bridge-nf-call-iptables=1 2>/dev/null || log "no net.bridge.bridge-nf-call-iptables: same-node Service hairpin may fail"
ip netns list | awk '{print $1}' >"$n/netns.before"

# --- identities, signed by the cluster CA: the kubelet (Node authorizer) and kube-proxy
ossl() { openssl "$@" 2>/dev/null; }
client() { # name, subject
  ossl req -newkey rsa:2048 -nodes -subj "$2" -keyout "$n/$1.key" -out "$n/$1.csr"
  ossl x509 -req -in "$n/$1.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial -days 2 -out "$n/$1.crt"
  cat >"$n/$1.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: gelo-test
  cluster: {server: "https://$node_ip:$api_port", certificate-authority: "$pki/ca.crt"}
users:
- name: $1
  user: {client-certificate: "$n/$1.crt", client-key: "$n/$1.key"}
contexts:
- name: gelo-test
  context: {cluster: gelo-test, user: $1}
current-context: gelo-test
EOF
}
client kubelet "/O=system:nodes/CN=system:node:$NODE"
client kube-proxy "/CN=system:kube-proxy"

# --- the pause image, by digest (its layout is imported once containerd runs)
scripts/k8s/images.sh build "$n/images" pause="$bin/pause" >/dev/null
pause_ref="$(sed -n 's/^pause=//p' "$n/images/refs")"

# --- CNI: one bridge, host-local addresses; no masquerade (pods talk to this machine and
# each other only), so the plugins add no iptables rules
cat >"$n/cni/10-gelo.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "gelo-node",
  "plugins": [
    {
      "type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": false, "hairpinMode": true,
      "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_CIDR"}]], "routes": [{"dst": "0.0.0.0/0"}], "dataDir": "$n/cni-ipam"}
    }
  ]
}
EOF

# --- containerd
cgroup_systemd=false
# Without CAP_SYS_RESOURCE (root on these machines lacks it) no process may lower its OOM
# score: runc then fails to give a sandbox the kubelet's -998 ("can't get final child's PID
# from pipe"). containerd's restrict_oom_score_adj raises such scores to its own (0).
restrict_oom=false kubelet_oom=-999
if (( (0x$(awk '/^CapEff/ {print $2}' /proc/self/status) >> 24 & 1) == 0 )); then
  restrict_oom=true kubelet_oom=0
  log "no CAP_SYS_RESOURCE: OOM scores below 0 are raised to 0 (restrict_oom_score_adj)"
fi
cat >"$n/containerd.toml" <<EOF
version = 2
root = "$n/containerd/root"
state = "$n/containerd/state"
[grpc]
  address = "$sock"
[plugins."io.containerd.internal.v1.opt"]
  path = "$n/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$pause_ref"
  restrict_oom_score_adj = $restrict_oom
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "$(command -v runc)"
        SystemdCgroup = $cgroup_systemd
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$CNI_BIN"
    conf_dir = "$n/cni"
EOF
containerd --config "$n/containerd.toml" >"$n/logs/containerd.log" 2>&1 &
echo $! >"$n/containerd.pid"
for _ in $(seq 100); do ctr version >/dev/null 2>&1 && break; alive containerd || break; sleep 0.1; done
ctr version >/dev/null 2>&1 || { tail -20 "$n/logs/containerd.log" >&2; stop; die "containerd did not start"; }
scripts/k8s/images.sh import "$sock" "$n/images"
log "containerd up; pause image $pause_ref"

# --- kubelet
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("0.0.0.0",0)); print(s.getsockname()[1])'; }
kubelet_port=$(free_port)
fail_cgroup_v1=false # this machine's kernel mounts cgroup v1; the kubelet refuses it unless told
cat >"$n/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $node_ip
port: $kubelet_port
readOnlyPort: 0
healthzPort: 0
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: "$pki/ca.crt"}
authorization: {mode: Webhook}
cgroupDriver: cgroupfs
failCgroupV1: $fail_cgroup_v1
failSwapOn: false
oomScoreAdj: $kubelet_oom
containerRuntimeEndpoint: unix://$sock
podLogsDir: $n/pod-logs
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
hairpinMode: hairpin-veth
serializeImagePulls: false
# A shared disk: evict only when it is truly full, never collect the imported images.
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
syncFrequency: 10s
EOF
"$bin/kubelet" --config "$n/kubelet.yaml" --kubeconfig "$n/kubelet.kubeconfig" --root-dir "$n/kubelet" \
  --hostname-override "$NODE" --node-ip "$node_ip" --v 2 >"$n/logs/kubelet.log" 2>&1 &
echo $! >"$n/kubelet.pid"

# --- kube-proxy (iptables mode), for Service addresses: the API server's, the gateway's
proxy_health=$(free_port) proxy_metrics=$(free_port)
cat >"$n/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: "$n/kube-proxy.kubeconfig"}
mode: iptables
clusterCIDR: $POD_CIDR
hostnameOverride: $NODE
healthzBindAddress: 127.0.0.1:$proxy_health
metricsBindAddress: 127.0.0.1:$proxy_metrics
iptables: {localhostNodePorts: false}
# Leave the machine's conntrack settings alone.
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
EOF
"$bin/kube-proxy" --config "$n/kube-proxy.yaml" --v 2 >"$n/logs/kube-proxy.log" 2>&1 &
echo $! >"$n/kube-proxy.pid"

kubectl() { "$bin/kubectl" --kubeconfig "$dir/admin.kubeconfig" "$@"; }
node_ready() { [ "$(kubectl get node "$NODE" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]; }
for _ in $(seq 240); do
  node_ready && break
  alive kubelet || { tail -30 "$n/logs/kubelet.log" >&2; stop; die "the kubelet exited"; }
  alive kube-proxy || { tail -30 "$n/logs/kube-proxy.log" >&2; stop; die "kube-proxy exited"; }
  sleep 0.5
done
node_ready || { tail -30 "$n/logs/kubelet.log" >&2; stop; die "node $NODE not Ready after 120 s"; }
log "node $NODE Ready in $((SECONDS - t0))s: kubelet $(kubectl get node "$NODE" -o jsonpath='{.status.nodeInfo.kubeletVersion}'), $(kubectl get node "$NODE" -o jsonpath='{.status.nodeInfo.containerRuntimeVersion}'), $node_ip"
echo "$NODE"
