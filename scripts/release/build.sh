#!/usr/bin/env bash
# Builds the `gelo` service binary so that anyone with the same commit and toolchain gets
# the same bytes, whatever folder they build in and whenever they do (docs/RELEASES.md).
#
#   scripts/release/build.sh [--src DIR] [--out DIR] [--allow-dirty] [--print-env]
#
# What makes it reproducible:
# - `cargo build --locked`: the dependency versions are Cargo.lock's, nothing newer.
# - `--remap-path-prefix` for the source folder, cargo's home (registry sources, git
#   checkouts) and the target folder, and `-ffile-prefix-map` for the same folders in C/C++
#   built by build scripts: no path of this machine reaches the binary (panic locations,
#   line tables, `file!()`).
# - `SOURCE_DATE_EPOCH` is the commit's time, for any tool that stamps a date; GELO itself
#   reads no clock at build time (no build.rs timestamps, no `env!` of a date).
# - No incremental compilation, the workspace's release profile (fixed codegen units), a
#   fixed locale and time zone.
# Writes DIR/gelo and DIR/gelo.buildinfo (commit, toolchain, flags, SHA-256).
set -euo pipefail

src=""
out=""
allow_dirty=0
print_env=0
while [ $# -gt 0 ]; do
  case "$1" in
    --src) src="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --allow-dirty) allow_dirty=1; shift ;;
    --print-env) print_env=1; allow_dirty=1; shift ;;
    *) echo "usage: $0 [--src DIR] [--out DIR] [--allow-dirty] [--print-env]" >&2; exit 2 ;;
  esac
done
src="$(cd "${src:-$(dirname "$0")/../..}" && git rev-parse --show-toplevel)"
out="${out:-$src/out/release}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"

if [ "$allow_dirty" = 0 ] && [ -n "$(git -C "$src" status --porcelain --untracked-files=no)" ]; then
  echo "release build: $src has uncommitted changes to tracked files; commit them or pass --allow-dirty" >&2
  exit 1
fi
if [ -n "${RUSTFLAGS:-}${CARGO_ENCODED_RUSTFLAGS:-}${CARGO_BUILD_RUSTFLAGS:-}" ]; then
  echo "release build: unset RUSTFLAGS / CARGO_ENCODED_RUSTFLAGS / CARGO_BUILD_RUSTFLAGS: the release's flags are this script's" >&2
  exit 1
fi

commit="$(git -C "$src" rev-parse HEAD)"
SOURCE_DATE_EPOCH="$(git -C "$src" log -1 --format=%ct "$commit")"
export SOURCE_DATE_EPOCH
cargo_home="$(cd "${CARGO_HOME:-$HOME/.cargo}" && pwd)"
target="${CARGO_TARGET_DIR:-$src/target}"
mkdir -p "$target"
target="$(cd "$target" && pwd)"
export CARGO_TARGET_DIR="$target"

# The longest prefix first: the target folder may lie inside the source folder.
prefixes=("$target=/target" "$cargo_home=/cargo" "$src=/gelo")
rustflags=()
cflags=""
for p in "${prefixes[@]}"; do
  rustflags+=("--remap-path-prefix=$p")
  cflags="$cflags -ffile-prefix-map=$p"
done
CARGO_ENCODED_RUSTFLAGS="$(IFS=$'\x1f'; echo "${rustflags[*]}")"
export CARGO_ENCODED_RUSTFLAGS
export CFLAGS="${cflags# }" CXXFLAGS="${cflags# }"
export CARGO_INCREMENTAL=0 TZ=UTC LC_ALL=C LANG=C
unset CARGO_BUILD_JOBS_OVERRIDE RUSTC_WRAPPER RUSTC_WORKSPACE_WRAPPER

build=(cargo build --release --locked -p gelo --bin gelo)
if [ "$print_env" = 1 ]; then
  # What the build would run with, for scripts/release/flags_check.sh; builds nothing.
  echo "SOURCE_DATE_EPOCH=$SOURCE_DATE_EPOCH"
  echo "RUSTFLAGS=${CARGO_ENCODED_RUSTFLAGS//$'\x1f'/ }"
  echo "CFLAGS=$CFLAGS"
  echo "CARGO_INCREMENTAL=$CARGO_INCREMENTAL TZ=$TZ LC_ALL=$LC_ALL"
  echo "COMMAND=${build[*]}"
  exit 0
fi
(cd "$src" && "${build[@]}")

cp "$target/release/gelo" "$out/gelo"
digest="$(sha256sum "$out/gelo" | cut -d' ' -f1)"
{
  echo "commit: $commit"
  echo "source_date_epoch: $SOURCE_DATE_EPOCH"
  echo "rustc: $(rustc -V)"
  echo "cargo: $(cargo -V)"
  echo "host: $(rustc -vV | sed -n 's/^host: //p')"
  echo "command: cargo build --release --locked -p gelo --bin gelo"
  echo "rustflags: --remap-path-prefix=<target>=/target --remap-path-prefix=<cargo home>=/cargo --remap-path-prefix=<source>=/gelo"
  echo "cflags: -ffile-prefix-map (same three folders)"
  echo "sha256: $digest"
} >"$out/gelo.buildinfo"
echo "gelo $digest (commit $commit)"
