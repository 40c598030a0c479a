#!/usr/bin/env bash
# One device run on a GPU machine without a Vulkan loader (the lent H200): unpack the loader
# libraries carried in .gl/, then run the PyTorch peer and `gelo bench gpu` on the same GPU
# and join their numbers. Logs and JSON land in $OUT (or ./gpu-out).
#
# usage: scripts/gpu/h200.sh [GELO_BINARY]   (default: .devbin/gelo, a release build)
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-gpu-out}"
mkdir -p "$out"
bin="${1:-.devbin/gelo}"
log="$out/log.txt"

if ! ldconfig -p | grep -q libvulkan.so.1; then
  for f in .gl/*.deb; do dpkg -x "$f" /; done
  ldconfig
fi
icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
[ -f "$icd" ] && export VK_DRIVER_FILES="$icd"
export XDG_RUNTIME_DIR=/tmp PYTHONUNBUFFERED=1 RUST_LOG="${RUST_LOG:-warn}"

{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
  nproc
  "$bin" --version
} >"$out/env.txt" 2>&1

stage() { # name, seconds, command...
  local name=$1 secs=$2
  shift 2
  echo "=== $name" | tee -a "$log"
  local t0=$SECONDS
  timeout "$secs" "$@" 2>&1 | tee -a "$log"
  echo "=== $name: rc=${PIPESTATUS[0]} in $((SECONDS - t0)) s" | tee -a "$log"
}

stage torch 90 python3 scripts/gpu/torch_peer.py --json "$out/torch.json"
stage gemm 150 "$bin" bench gpu --sections gemm,roundtrip --json "$out/gelo.json"
stage tensor-cores 90 "$bin" bench gpu --sections gemm --weights f16 --tensor-cores --json "$out/gelo-tc.json"
stage blocks 120 "$bin" bench gpu --sections blocks --json "$out/blocks.json"
stage tiles 60 "$bin" bench gpu --sections tiles --models qwen3-1.7b --m 16,2056 --reps 5 --json "$out/tiles.json"
python3 scripts/gpu/report.py "$out/gelo.json" "$out/torch.json" "$out/gelo-tc.json" >"$out/report.md" 2>&1
cat "$out/report.md"
