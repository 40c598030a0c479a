#!/usr/bin/env bash
# Builds the two cubek peers (WGSL and SPIR-V kernels) into DEST (default .devbin at the
# repository root), stripped, for scripts/gpu/h200.sh's `cubek` stage. A workspace of its
# own: the project's build and CI never compile cubecl.
set -euo pipefail
cd "$(dirname "$0")"
dest="${1:-../../../.devbin}"
mkdir -p "$dest"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/gelo/peer-target}"
cargo build --release --locked
cp "$CARGO_TARGET_DIR/release/cubek-peer" "$dest/cubek-peer-wgsl"
cargo build --release --locked --features spirv
cp "$CARGO_TARGET_DIR/release/cubek-peer" "$dest/cubek-peer-spirv"
