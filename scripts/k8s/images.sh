#!/usr/bin/env bash
# OCI images of the project's binaries for a node without a registry, written by umoci
# (Debian package, pinned below) as OCI layouts, and imported into a containerd. `build`
# prints each image's reference by digest, one `name=repository@sha256:...` per line, and
# appends them to OUT/refs; `import` loads every layout of OUT into the containerd at SOCKET
# under its tag and its digest (scripts/k8s/node.sh starts one).
#
#   scripts/k8s/images.sh build OUT pause=PATH gelo=PATH gelo-operator=PATH
#   scripts/k8s/images.sh import SOCKET OUT
#
# Each image is one layer holding a minimal root filesystem: the binary, the
# shared libraries `ldd` names for it (from this machine, which is what the binary was
# linked against), /etc/passwd and /etc/group naming the non-root user, the CA bundle and an
# empty /tmp; no shell, no package manager. gelo and gelo-operator run as uid 65532 (as
# the chart's and the operator's security contexts ask), pause as 65535 (as the release
# pause image does). `gelo` also gets a second tag, gelo-tampered: the same layer with
# another mock launch measurement in its environment, for the attestation gate's test.
# Files carry a fixed time and the config a fixed creation date, so the same binary gives
# the same digest.
set -euo pipefail

UMOCI_PIN="0.4.7+ds-3+b7"
REPO_PREFIX="gelo.local" # image names: gelo.local/gelo, ...; no registry answers for it
TAMPERED_MEASUREMENT="$(printf 'bad0%.0s' $(seq 24))"

EPOCH=1767225600 # 2026-01-01T00:00:00Z
usage() { echo "usage: $0 build OUT name=BINARY... | import SOCKET OUT" >&2; exit 2; }
ctr() { command ctr --address "$sock" --namespace k8s.io "$@"; }

if [ "${1:-}" = import ]; then
  sock="${2:?containerd socket}" out="${3:?layouts folder}"
  for layout in "$out"/*/; do
    name="$(basename "$layout")"
    [ -f "$layout/index.json" ] || continue
    # containerd names each tag of the layout <base-name>:<tag> and, with --digests,
    # <base-name>@<manifest digest>: the name a pod's digest reference resolves to.
    repo="$REPO_PREFIX/$name"
    tar -C "$layout" -cf "$out/$name.tar" .
    ctr images import --base-name "$repo" --digests "$out/$name.tar" >"$out/import.log" 2>&1 \
      || { cat "$out/import.log" >&2; exit 1; }
    rm -f "$out/$name.tar"
  done
  while IFS='=' read -r name ref; do
    ctr images ls -q | grep -x "$ref" >/dev/null || { echo "images.sh: $name ($ref) not in containerd" >&2; exit 1; }
  done <"$out/refs"
  exit 0
fi
[ "${1:-}" = build ] || usage
out="${2:?output folder}"
shift 2
[ $# -gt 0 ] || usage
command -v umoci >/dev/null || { echo "images.sh: needs umoci (apt-get install umoci=$UMOCI_PIN)" >&2; exit 1; }
have="$(dpkg-query -W -f '${Version}' umoci 2>/dev/null || true)"
[ "$have" = "$UMOCI_PIN" ] || echo "images.sh: umoci $have, not the pinned $UMOCI_PIN" >&2
mkdir -p "$out"
out="$(cd "$out" && pwd)"

# rootfs DIR BINARY DEST UID: the minimal root filesystem around one binary.
rootfs() {
  local dir=$1 bin=$2 dest=$3 uid=$4 lib
  mkdir -p "$dir/etc" "$dir/tmp" "$dir$(dirname "$dest")"
  chmod 1777 "$dir/tmp"
  install -m 0755 "$bin" "$dir$dest"
  # Every library ldd resolves, at the path the dynamic loader will look for it.
  for lib in $(ldd "$bin" 2>/dev/null | grep -oE '/[^ ]+' || true); do
    mkdir -p "$dir$(dirname "$lib")"
    cp -L "$lib" "$dir$lib"
  done
  if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
    mkdir -p "$dir/etc/ssl/certs"
    cp /etc/ssl/certs/ca-certificates.crt "$dir/etc/ssl/certs/"
  fi
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%s:%s:nonroot:/tmp:/sbin/nologin\n' "$uid" "$uid" >"$dir/etc/passwd"
  printf 'root:x:0:\nnonroot:x:%s:\n' "$uid" >"$dir/etc/group"
  find "$dir" -exec touch -h -d "@$EPOCH" {} +
}

for spec in "$@"; do
  name="${spec%%=*}" bin="${spec#*=}"
  [ -x "$bin" ] || { echo "images.sh: $name: $bin is not an executable" >&2; exit 1; }
  case "$name" in
    pause) dest=/pause uid=65535 entry=(--config.entrypoint /pause) ;;
    gelo) dest=/usr/local/bin/gelo uid=65532 entry=(--config.entrypoint /usr/local/bin/gelo) ;;
    gelo-operator) dest=/usr/local/bin/gelo-operator uid=65532
      entry=(--config.entrypoint /usr/local/bin/gelo-operator --config.cmd run) ;;
    *) echo "images.sh: unknown image $name (pause, gelo, gelo-operator)" >&2; exit 2 ;;
  esac
  layout="$out/$name"
  rm -rf "$layout" "$out/$name.rootfs"
  rootfs "$out/$name.rootfs" "$bin" "$dest" "$uid"
  umoci init --layout "$layout"
  umoci new --image "$layout:e2e"
  created="$(date -u -d "@$EPOCH" +%Y-%m-%dT%H:%M:%SZ)"
  umoci insert --image "$layout:e2e" --history.created "$created" \
    --history.created_by "scripts/k8s/images.sh: $name and its shared libraries" "$out/$name.rootfs" /
  umoci config --no-history --image "$layout:e2e" --os linux --architecture amd64 \
    --config.user "$uid:$uid" --config.workingdir /tmp --config.env HOME=/tmp "${entry[@]}" \
    --created "$created"
  tags=(e2e)
  if [ "$name" = gelo ]; then
    umoci config --no-history --image "$layout:e2e" --tag e2e-tampered \
      --config.env "GELO_MOCK_MEASUREMENT=$TAMPERED_MEASUREMENT"
    tags+=(e2e-tampered)
  fi
  umoci gc --layout "$layout"
  rm -rf "$out/$name.rootfs"
  touch "$out/refs"
  for tag in "${tags[@]}"; do
    digest="$(python3 - "$layout" "$tag" <<'PY'
import json, sys
index = json.load(open(sys.argv[1] + "/index.json"))
m = [m for m in index["manifests"] if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == sys.argv[2]]
assert len(m) == 1, m
print(m[0]["digest"])
PY
)"
    line="$name${tag#e2e}=$REPO_PREFIX/$name@$digest"
    grep -v "^$name${tag#e2e}=" "$out/refs" >"$out/refs.new" || true
    echo "$line" >>"$out/refs.new"
    mv "$out/refs.new" "$out/refs"
    echo "$line"
  done
done
