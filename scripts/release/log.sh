#!/usr/bin/env bash
# GELO's release log: an append-only Merkle log (C2SP tlog-tiles, RFC 9162 hashing) run
# with transparency-dev's Tessera, its POSIX storage (a folder of tiles, entry bundles and
# a signed checkpoint that any static web server can publish). Built from Go modules at the
# versions scripts/release/tlog/go.sum pins, into ${GELO_CACHE:-~/.cache/gelo}/release-tools/bin.
#
#   scripts/release/log.sh build                      build posix-oneshot and gelo-tlog
#   scripts/release/log.sh keygen NAME                a new log key (NAME is its origin)
#   scripts/release/log.sh append FILE...             append entries (each file's bytes)
#   scripts/release/log.sh checkpoint                 print the latest signed checkpoint
#   scripts/release/log.sh bundle MANIFEST OUT [FROM] a release bundle: the manifest, its
#                                                     inclusion proof under the latest
#                                                     checkpoint, and a consistency proof
#                                                     from tree size FROM when given
#
# The log lives in $GELO_RELEASE_LOG (default ${GELO_CACHE}/release-log): key/log.key
# (private, never committed), key/log.pub, and tiles/ (the log itself).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cache="${GELO_CACHE:-$HOME/.cache/gelo}"
bin="$cache/release-tools/bin"
root="${GELO_RELEASE_LOG:-$cache/release-log}"

build() {
  if [ -x "$bin/posix-oneshot" ] && [ -x "$bin/gelo-tlog" ] \
     && [ "$bin/gelo-tlog" -nt "$here/tlog/main.go" ] && [ "$bin/gelo-tlog" -nt "$here/tlog/go.sum" ]; then
    return
  fi
  mkdir -p "$bin"
  (cd "$here/tlog" && GOFLAGS=-mod=mod nice -n 10 go build -trimpath -o "$bin/gelo-tlog" . \
    && GOFLAGS=-mod=mod nice -n 10 go build -trimpath -o "$bin/posix-oneshot" \
       github.com/transparency-dev/tessera/cmd/examples/posix-oneshot)
}

cmd="${1:-}"
shift || true
case "$cmd" in
  build) build ;;
  keygen)
    build
    [ -n "${1:-}" ] || { echo "usage: $0 keygen NAME" >&2; exit 2; }
    [ ! -e "$root/key/log.key" ] || { echo "$root/key/log.key exists: not replacing a log's key" >&2; exit 1; }
    "$bin/gelo-tlog" keygen -name "$1" -out "$root/key"
    cat "$root/key/log.pub"
    ;;
  append)
    build
    [ $# -gt 0 ] || { echo "usage: $0 append FILE..." >&2; exit 2; }
    mkdir -p "$root/tiles"
    # posix-oneshot adds the files matching one glob, in the glob's order: stage them so
    # that order is the order given here.
    stage="$(mktemp -d)"
    i=0
    for f in "$@"; do cp "$f" "$stage/$(printf '%06d' "$i")"; i=$((i + 1)); done
    "$bin/posix-oneshot" --storage_dir="$root/tiles" --private_key="$root/key/log.key" --entries="$stage/*" 2>&1 \
      | sed -n 's|.*\] \([0-9][0-9]*\): .*/\([0-9]*\)$|entry \1 <- \2|p'
    rm -rf "$stage"
    ;;
  checkpoint) cat "$root/tiles/checkpoint" ;;
  bundle)
    build
    [ $# -ge 2 ] || { echo "usage: $0 bundle MANIFEST OUT [FROM]" >&2; exit 2; }
    proof="$(mktemp)"
    "$bin/gelo-tlog" prove -log "$root/tiles" -pub "$root/key/log.pub" -entry "$1" -from "${3:-0}" -out "$proof"
    python3 - "$1" "$proof" "$2" <<'PY'
import json, sys
manifest = open(sys.argv[1], encoding="utf-8").read()
proof = json.load(open(sys.argv[2]))
with open(sys.argv[3], "w") as f:
    json.dump({"manifest": manifest, "proof": proof}, f, indent=2)
    f.write("\n")
PY
    rm -f "$proof"
    ;;
  *) sed -n '2,20p' "$0" >&2; exit 2 ;;
esac
