#!/usr/bin/env bash
# A cheap check (seconds) that the release scripts still do what docs/RELEASES.md says;
# CI runs it. The double build itself (check.sh) is too slow for CI.
# - build.sh builds with --locked, remaps the source, cargo-home and target folders for rustc
#   and C compilers, takes SOURCE_DATE_EPOCH from the commit, turns incremental builds off;
# - no build script reads a clock and no source stamps a build date;
# - initrd.py writes the same bytes for the same files, whatever their order and times;
# - the Tessera version the log is built from is pinned.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(git -C "$here" rev-parse --show-toplevel)"
fail() { echo "release flags check: $*" >&2; exit 1; }

for s in "$here"/*.sh; do bash -n "$s" || fail "$s does not parse"; done

tmp="$(mktemp -d)"
mkdir -p "$tmp/cargo"
trap 'rm -rf "$tmp"' EXIT
env="$(CARGO_TARGET_DIR="$tmp/target" CARGO_HOME="$tmp/cargo" bash "$here/build.sh" --src "$repo" --print-env --out "$tmp/out")"
want_epoch="$(git -C "$repo" log -1 --format=%ct)"
grep -qx "SOURCE_DATE_EPOCH=$want_epoch" <<<"$env" || fail "SOURCE_DATE_EPOCH is not the commit's time: $env"
for prefix in "$tmp/target=/target" "$tmp/cargo=/cargo" "$repo=/gelo"; do
  grep -q -- "--remap-path-prefix=$prefix" <<<"$env" || fail "rustc does not remap $prefix"
  grep -q -- "-ffile-prefix-map=$prefix" <<<"$env" || fail "C compilers do not remap $prefix"
done
grep -q "^CARGO_INCREMENTAL=0 TZ=UTC LC_ALL=C" <<<"$env" || fail "incremental, time zone or locale not fixed"
grep -qx "COMMAND=cargo build --release --locked -p gelo --bin gelo" <<<"$env" || fail "not a --locked release build"
if RUSTFLAGS=-Ctarget-cpu=native bash "$here/build.sh" --src "$repo" --print-env --out "$tmp/out" >/dev/null 2>&1; then
  fail "build.sh accepts RUSTFLAGS from the environment"
fi

# Build-time clocks: a build script reading the time, or a source stamping a build date.
clocks="$(git -C "$repo" grep -nE 'SystemTime::now|Utc::now|Local::now|chrono' -- '*build.rs' || true)
$(git -C "$repo" grep -nE 'env!\("(SOURCE_DATE_EPOCH|BUILD_(DATE|TIME)|VERGEN_[A-Z_]*(DATE|TIMESTAMP))' -- '*.rs' || true)"
[ -z "${clocks//$'\n'/}" ] || fail "build-time clock: $clocks"

mkdir -p "$tmp/a" "$tmp/b"
printf 'one' >"$tmp/a/x"; printf 'two' >"$tmp/a/y"; chmod +x "$tmp/a/y"
cp -p "$tmp/a/x" "$tmp/a/y" "$tmp/b/"; touch -d '2001-01-01' "$tmp/b/x"
SOURCE_DATE_EPOCH=7 python3 "$here/initrd.py" "$tmp/1.cpio" usr/bin/y="$tmp/a/y" etc/x="$tmp/a/x"
SOURCE_DATE_EPOCH=7 python3 "$here/initrd.py" "$tmp/2.cpio" etc/x="$tmp/b/x" usr/bin/y="$tmp/b/y"
cmp -s "$tmp/1.cpio" "$tmp/2.cpio" || fail "initrd.py depends on argument order or file times"
head -c 6 "$tmp/1.cpio" | grep -q 070701 || fail "initrd.py does not write newc"

grep -q 'github.com/transparency-dev/tessera v1.0.4 h1:' "$here/tlog/go.sum" || fail "Tessera is not pinned in tlog/go.sum"
echo "release flags check: locked, remapped, commit-dated, clock-free, initrd reproducible, Tessera pinned"
