#!/usr/bin/env bash
# Builds the pinned Kubernetes control plane and tools (kube-apiserver,
# kube-controller-manager, kubectl, etcd, helm) from their Go modules, once, into a cache
# outside the clone; a later call finds them there and returns at once. Prints the folder.
# With `node`, also what a cluster with a real node needs, of the same k8s.io/kubernetes
# version: kube-scheduler, kubelet, kube-proxy, and the pause binary (build/pause/linux/pause.c
# of that module, static, by cc).
#   scripts/k8s/build.sh            # → ${GELO_CACHE:-~/.cache/gelo}/k8s/<versions>/bin
#   scripts/k8s/build.sh node       # the same folder, with kube-scheduler, kubelet, kube-proxy, pause
set -euo pipefail

K8S=v1.37.2       # k8s.io/kubernetes; every k8s.io staging module at the matching v0.37.x
STAGING=v0.37.2
ETCD=v3.6.16      # go.etcd.io/etcd/server/v3
HELM=v4.3.2       # helm.sh/helm/v4

RECIPE=2          # bump when this script builds differently, so caches rebuild
root="${GELO_CACHE:-$HOME/.cache/gelo}/k8s/k8s-$K8S-etcd-$ETCD-helm-$HELM-r$RECIPE"
bin="$root/bin"
want=(kube-apiserver kube-controller-manager kubectl etcd helm)
if [ "${1:-}" = node ]; then want+=(kube-scheduler kubelet kube-proxy pause); fi
missing=()
for b in "${want[@]}"; do [ -x "$bin/$b" ] || missing+=("$b"); done
if [ ${#missing[@]} -eq 0 ]; then echo "$bin"; exit 0; fi

command -v go >/dev/null || { echo "scripts/k8s/build.sh: needs Go (https://go.dev/dl)" >&2; exit 1; }
mkdir -p "$bin" "$root/src"
export GOFLAGS="-trimpath -mod=mod" CGO_ENABLED=0
ldflags="-s -w"
log() { echo "k8s build: $*" >&2; }
# Go's download chatter goes to a log, shown when a step fails.
quiet() { "$@" >>"$root/src/build.log" 2>&1 || { tail -30 "$root/src/build.log" >&2; return 1; }; }

has() { [[ " ${missing[*]} " == *" $1 "* ]]; }

k8s_cmds=(kube-apiserver kube-controller-manager kubectl kube-scheduler kubelet kube-proxy)
if has kube-apiserver || has kube-controller-manager || has kubectl || has kube-scheduler || has kubelet || has kube-proxy || has pause; then
  # k8s.io/kubernetes points its staging modules at ./staging with replace lines, which a
  # module that requires it does not inherit: pin each to the matching release instead.
  # What a release build stamps (hack/lib/version.sh): charts check kubeVersion against it.
  minor="${K8S#v1.}"; minor="${minor%%.*}"
  k8s_version=""
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    k8s_version+=" -X $pkg.gitVersion=$K8S -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
  done
  mod="$root/src/kubernetes"
  mkdir -p "$mod"
  gomod="$(go mod download -json "k8s.io/kubernetes@$K8S" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')"
  {
    echo "module gelo.local/k8s-tools"
    echo
    grep -E '^go [0-9.]+$' "$gomod" | head -1
    echo
    echo "require k8s.io/kubernetes $K8S"
    echo
    grep -oE '^\s*k8s\.io/[a-z0-9-]+ => \./staging/src/k8s\.io/[a-z0-9-]+' "$gomod" \
      | awk -v v="$STAGING" '{print "replace " $1 " => " $1 " " v}'
  } >"$mod/go.mod"
  log "resolving k8s.io/kubernetes $K8S ($(grep -c '^replace' "$mod/go.mod") staging modules at $STAGING)"
  # The main packages as imports, so `go mod tidy` records everything they need.
  { printf '//go:build tools\n\npackage tools\n\nimport (\n'
    printf '\t_ "k8s.io/kubernetes/cmd/%s"\n' "${k8s_cmds[@]}"
    printf ')\n'; } >"$mod/tools.go"
  (cd "$mod" && quiet go mod tidy)
  for b in "${k8s_cmds[@]}"; do
    has "$b" || continue
    log "building $b (several minutes on two cores)"
    (cd "$mod" && quiet go build -ldflags "$ldflags $k8s_version" -o "$bin/$b.tmp" "k8s.io/kubernetes/cmd/$b") && mv "$bin/$b.tmp" "$bin/$b"
  done
  if has pause; then
    # The sandbox's init process, as the release's pause image holds it (its Makefile's flags).
    command -v cc >/dev/null || { log "the pause binary needs a C compiler (cc)"; exit 1; }
    src="$(cd "$mod" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)/build/pause"
    tag="$(sed -n 's/^TAG ?= *//p' "$src/Makefile")"
    log "building pause $tag"
    cc -Os -Wall -Werror -static -DVERSION="v$tag-gelo" -o "$bin/pause.tmp" "$src/linux/pause.c" && mv "$bin/pause.tmp" "$bin/pause"
    echo "$tag" >"$bin/pause.version"
  fi
fi

if has etcd; then
  mod="$root/src/etcd"
  mkdir -p "$mod"
  [ -f "$mod/go.mod" ] || (cd "$mod" && go mod init gelo.local/etcd >/dev/null 2>&1)
  log "building etcd $ETCD"
  (cd "$mod" && quiet go get "go.etcd.io/etcd/server/v3@$ETCD" && quiet go build -ldflags "$ldflags" -o "$bin/etcd.tmp" go.etcd.io/etcd/server/v3) \
    && mv "$bin/etcd.tmp" "$bin/etcd"
fi

if has helm; then
  log "building helm $HELM"
  GOBIN="$root/src/helm-bin" quiet go install -ldflags "$ldflags" "helm.sh/helm/v4/cmd/helm@$HELM"
  mv "$root/src/helm-bin/helm" "$bin/helm"
fi

for b in "${want[@]}"; do [ -x "$bin/$b" ] || { log "$b did not build"; exit 1; }; done
echo "$bin"
