#!/usr/bin/env bash
# Checks that the release build is reproducible: builds `gelo` twice from one commit, in two
# fresh clones at different paths with their own target folders, one after the other, and
# compares the SHA-256 of the two binaries. Two release builds take 15 minutes or more on two
# cores, so this is not part of CI (scripts/release/flags_check.sh is).
#
#   scripts/release/check.sh [COMMIT]      (default HEAD)
#
# Target folders go under ${GELO_CACHE:-~/.cache/gelo}/release-check/ and are removed at the
# end, as are the clones; the binaries and build records are kept in
# ${GELO_CACHE}/release-check/out-{a,b}/ and the verdict is printed.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(git -C "$here" rev-parse --show-toplevel)"
commit="$(git -C "$repo" rev-parse "${1:-HEAD}")"
cache="${GELO_CACHE:-$HOME/.cache/gelo}/release-check"
mkdir -p "$cache"
work="$(mktemp -d /tmp/gelo-release-check.XXXXXX)"
cleanup() { rm -rf "$work" "$cache/target-a" "$cache/target-b"; }
trap cleanup EXIT

build() { # NAME CLONE_PATH
  local name="$1" clone="$2"
  git clone -q --no-checkout "$repo" "$clone"
  git -C "$clone" checkout -q --detach "$commit"
  rm -rf "$cache/target-$name" "$cache/out-$name"
  local t0; t0=$(date +%s)
  CARGO_TARGET_DIR="$cache/target-$name" nice -n 10 bash "$here/build.sh" --src "$clone" --out "$cache/out-$name"
  echo "build $name: $(( $(date +%s) - t0 )) s in $clone"
}

build a "$work/first/gelo"
sleep 2 # a different wall-clock second at least; SOURCE_DATE_EPOCH must not care
build b "$work/second/elsewhere/gelo-src"

a="$(sha256sum "$cache/out-a/gelo" | cut -d' ' -f1)"
b="$(sha256sum "$cache/out-b/gelo" | cut -d' ' -f1)"
echo "commit $commit"
echo "a: $a"
echo "b: $b"
if [ "$a" != "$b" ]; then
  echo "NOT REPRODUCIBLE: the two builds differ" >&2
  cmp "$cache/out-a/gelo" "$cache/out-b/gelo" | head -1 >&2 || true
  exit 1
fi
echo "reproducible: $a"
