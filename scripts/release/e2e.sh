#!/usr/bin/env bash
# The release path end to end, on this machine: a fresh Tessera log, two release manifests
# of one binary (2 and 4 vCPUs: two launch measurements derived by measure.sh), proofs
# taken by reading the log's tiles, a fork (a second history signed with the same key),
# then GELO's Rust verifier over what the log produced (the attest crate's release tests).
#
#   scripts/release/e2e.sh --binary PATH [--commit C] [--out DIR] [--no-test]
#
# --out (default: a temporary folder) receives the proof fixtures; the committed ones in
# services/edge/attest/testdata/release/ came from this script (docs/RELEASES.md).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(git -C "$here" rev-parse --show-toplevel)"
binary=""
commit=""
out=""
run_tests=1
while [ $# -gt 0 ]; do
  case "$1" in
    --binary) binary="$2"; shift 2 ;;
    --commit) commit="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --no-test) run_tests=0; shift ;;
    *) echo "usage: $0 --binary PATH [--commit C] [--out DIR] [--no-test]" >&2; exit 2 ;;
  esac
done
[ -f "$binary" ] || { echo "usage: $0 --binary PATH [--commit C] [--out DIR] [--no-test]" >&2; exit 2; }
commit="${commit:-$(sed -n 's/^commit: //p' "$(dirname "$binary")/gelo.buildinfo" 2>/dev/null || true)}"
commit="${commit:-$(git -C "$repo" rev-parse HEAD)}"
work="$(mktemp -d /tmp/gelo-release-e2e.XXXXXX)"
trap 'rm -rf "$work"' EXIT
out="${out:-$work/fixtures}"
mkdir -p "$out"
export SOURCE_DATE_EPOCH="$(git -C "$repo" log -1 --format=%ct "$commit")"
log="$here/log.sh"

release() { # NAME VCPUS CMDLINE: measure and write NAME.manifest.json
  bash "$here/measure.sh" --binary "$binary" --out "$work/$1" --vcpus "$2" --cmdline "$3" >/dev/null
  python3 "$here/manifest.py" --commit "$commit" --binary "$binary" --launch "$work/$1/launch.json" \
    --out "$out/$1.manifest.json"
  echo "$1: $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["launch"]["measurement"])' "$out/$1.manifest.json")"
}

release gelo-2vcpu 2 "console=ttyS0 rdinit=/init panic=-1"
release gelo-4vcpu 4 "console=ttyS0 rdinit=/init panic=-1"
# What a compromised host would like a client to accept: the same parts, a shell as init.
release forged 2 "console=ttyS0 rdinit=/bin/sh panic=-1"
cp "$work/gelo-2vcpu/launch.json" "$out/launch.json"

# The log: one key, the first release, a checkpoint a client remembers, the second release.
export GELO_RELEASE_LOG="$work/log"
bash "$log" keygen "gelo.example/releases" >/dev/null
cp "$GELO_RELEASE_LOG/key/log.pub" "$out/log.pub"
bash "$log" append "$out/gelo-2vcpu.manifest.json"
bash "$log" checkpoint >"$out/remembered.checkpoint"
bash "$log" bundle "$out/gelo-2vcpu.manifest.json" "$out/gelo-2vcpu.at1.bundle.json"
bash "$log" append "$out/gelo-4vcpu.manifest.json"
bash "$log" checkpoint >"$out/latest.checkpoint"
bash "$log" bundle "$out/gelo-2vcpu.manifest.json" "$out/gelo-2vcpu.bundle.json" 1
bash "$log" bundle "$out/gelo-4vcpu.manifest.json" "$out/gelo-4vcpu.bundle.json" 1

# A fork: the same key signs a second history (the forged release, then the real second
# one), as a log operator showing one client another log would. Its checkpoints verify; only
# consistency with what the client saw before tells it apart.
mkdir -p "$work/fork"
cp -r "$GELO_RELEASE_LOG/key" "$work/fork/key"
GELO_RELEASE_LOG="$work/fork" bash "$log" append "$out/forged.manifest.json" "$out/gelo-4vcpu.manifest.json"
GELO_RELEASE_LOG="$work/fork" bash "$log" bundle "$out/forged.manifest.json" "$out/forged.bundle.json" 1

echo "fixtures in $out"
if [ "$run_tests" = 1 ]; then
  (cd "$repo" && GELO_RELEASE_FIXTURES="$out" nice -n 10 cargo test -p gelo-attest --test verify release_log)
fi
