#!/usr/bin/env bash
# One device run for the protection comparison: plain and masked on the GPU (Vulkan), and
# plain on the host's CPU, which is what the sealed default computes (SealedExecutor is the
# plaintext executor on the TEE's CPU engine). Same binary, same host, one after the other.
#   scripts/gpu/protection.sh [path to a release gelo]      (results in $OUT or ./gpu-out)
set -uo pipefail
cd "$(dirname "$0")/../.."
bin="${1:-.devbin/gelo}"
. scripts/gpu/lib.sh
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv; nproc; lscpu | grep 'Model name'; } >"$out/env.txt" 2>&1

stage bert_gpu 180 "$bin" bench model --arch bert-base --engine vulkan --batch 32 --n 256 --reps 3
stage bert_cpu 180 "$bin" bench model --arch bert-base --engine cpu --batch 32 --n 256 --reps 3
stage qwen17_gpu 240 "$bin" bench model --arch qwen3-1.7b --engine vulkan --decode --batch 1,8,32 --prompt 32 --steps 16 --reps 2
stage qwen17_cpu 300 "$bin" bench model --arch qwen3-1.7b --engine cpu --decode --batch 1,8,32 --prompt 32 --steps 16 --reps 2
# U-Verify at the services' default (2 probes) under masked, against the runs above (probes 0).
stage bert_gpu_verify 180 "$bin" bench model --arch bert-base --engine vulkan --batch 32 --n 256 --reps 3 --verify-probes 2
stage qwen17_gpu_verify 240 "$bin" bench model --arch qwen3-1.7b --engine vulkan --decode --batch 1,8,32 --prompt 32 --steps 16 --reps 2 --verify-probes 2
