#!/usr/bin/env bash
# One device run for the protection comparison: plain and masked on the GPU (Vulkan), and
# plain on the host's CPU, which is what the sealed default computes (SealedExecutor is the
# plaintext executor on the TEE's CPU engine). Same binary, same host, one after the other.
#   [STAGES="bert_gpu ..."] scripts/gpu/protection.sh [path to a release gelo]
# (results in $OUT or ./gpu-out; all stages by default, in the order below)
set -uo pipefail
cd "$(dirname "$0")/../.."
bin="${1:-.devbin/gelo}"
. scripts/gpu/lib.sh
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv; nproc; lscpu | grep 'Model name'; "$bin" --version; } >"$out/env.txt" 2>&1
stages=" ${STAGES:-bert_gpu bert_cpu qwen17_gpu qwen17_cpu bert_gpu_verify qwen17_gpu_verify} "
want() { [[ "$stages" == *" $1 "* ]]; }

want bert_gpu && stage bert_gpu 180 "$bin" bench model --arch bert-base --engine vulkan --batch 32 --n 256 --reps 3
want bert_cpu && stage bert_cpu 180 "$bin" bench model --arch bert-base --engine cpu --batch 32 --n 256 --reps 3
want qwen17_gpu && stage qwen17_gpu 240 "$bin" bench model --arch qwen3-1.7b --engine vulkan --decode --batch 1,8,32 --prompt 32 --steps 16 --reps 2
want qwen17_cpu && stage qwen17_cpu 300 "$bin" bench model --arch qwen3-1.7b --engine cpu --decode --batch 1,8,32 --prompt 32 --steps 16 --reps 2
# U-Verify at the services' default (2 probes) under masked, against the runs above (probes 0).
want bert_gpu_verify && stage bert_gpu_verify 180 "$bin" bench model --arch bert-base --engine vulkan --batch 32 --n 256 --reps 3 --verify-probes 2
want qwen17_gpu_verify && stage qwen17_gpu_verify 240 "$bin" bench model --arch qwen3-1.7b --engine vulkan --decode --batch 1,8,32 --prompt 32 --steps 16 --reps 2 --verify-probes 2
