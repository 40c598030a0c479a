#!/usr/bin/env bash
# One device run for the protection comparison: plain and masked on the GPU (Vulkan), and
# plain on the host's CPU, which is what the sealed default computes (SealedExecutor is the
# plaintext executor on the TEE's CPU engine). Same binary, same host, one after the other.
#   scripts/gpu/protection.sh [path to a release gelo]      (results in $OUT or ./gpu-out)
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-gpu-out}"
mkdir -p "$out"
bin="${1:-.devbin/gelo}"
if ! ldconfig -p | grep -q libvulkan.so.1; then
  for f in .gl/*.deb; do dpkg -x "$f" /; done
  ldconfig
fi
icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
[ -f "$icd" ] && export VK_DRIVER_FILES="$icd"
export XDG_RUNTIME_DIR=/tmp RUST_LOG="${RUST_LOG:-warn}"
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv; nproc; lscpu | grep 'Model name'; } >"$out/env.txt" 2>&1

stage() { # name seconds command...
  local name=$1 secs=$2
  shift 2
  echo "=== $name" | tee -a "$out/log.txt"
  local t0=$SECONDS
  timeout "$secs" "$@" 2>>"$out/log.txt" | tee "$out/$name.md"
  echo "=== $name rc=${PIPESTATUS[0]} $((SECONDS - t0))s" | tee -a "$out/log.txt"
}

stage bert_gpu 180 "$bin" bench model --arch bert-base --engine vulkan --batch 32 --n 256 --reps 3
stage bert_cpu 180 "$bin" bench model --arch bert-base --engine cpu --batch 32 --n 256 --reps 3
stage qwen17_gpu 240 "$bin" bench model --arch qwen3-1.7b --engine vulkan --decode --batch 1,8,32 --prompt 32 --steps 16 --reps 2
stage qwen17_cpu 300 "$bin" bench model --arch qwen3-1.7b --engine cpu --decode --batch 1,8,32 --prompt 32 --steps 16 --reps 2
