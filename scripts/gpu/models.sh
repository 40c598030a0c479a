#!/usr/bin/env bash
# One device run for the model-level measurements and the Hugging Face references:
#   1. tiny random-weight Qwen3 / BERT cross-encoder checkpoints and their transformers outputs
#      (scripts/reference/hf_reference.py; the tokenizers are carried in .devref/);
#   2. `gelo bench model` on the Vulkan engine: embedding forward (BERT-base, Qwen3-0.6B,
#      batch 32) and Qwen3-1.7B decode (B = 1, 8), plain vs masked.
# Everything lands in $OUT (or ./gpu-out).
set -uo pipefail
cd "$(dirname "$0")/../.."
bin="${1:-.devbin/gelo}"
. scripts/gpu/lib.sh
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv; nproc; } >"$out/env.txt" 2>&1

# Stages to run (all by default), e.g. STAGES="bert_base qwen3_17b_decode".
stages=" ${STAGES:-hf bert_base qwen3_06b qwen3_17b_decode} "
want() { [[ "$stages" == *" $1 "* ]]; }

want hf && stage hf_generate 120 python3 scripts/reference/hf_reference.py generate /tmp/tiny \
  --qwen3-tokenizer .devref/qwen3-tokenizer --bert-tokenizer .devref/minilm
want hf && sha256sum /tmp/tiny/*/model.safetensors | tee "$out/tiny_sha256.txt"
want hf && stage hf_reference 240 python3 scripts/reference/hf_reference.py reference /tmp/tiny "$out"
want bert_base && stage bert_base 240 "$bin" bench model --arch bert-base --engine vulkan --batch 32 --n "${BERT_N:-128,256,512}" --reps 3
want qwen3_06b && stage qwen3_06b 300 "$bin" bench model --arch qwen3-0.6b --engine vulkan --batch 32 --n 128,256 --reps 2
want qwen3_17b_decode && stage qwen3_17b_decode 300 "$bin" bench model --arch qwen3-1.7b --engine vulkan --decode --batch 1,8 --prompt 32 --steps 32 --reps 2
# The embedding cell again with mimalloc keeping freed memory (no purge, large OS pages):
# how much of the host path is page faults on fresh result buffers.
want bert_alloc && stage bert_alloc 180 env MIMALLOC_PURGE_DELAY=-1 MIMALLOC_ALLOW_LARGE_OS_PAGES=1 \
  "$bin" bench model --arch bert-base --engine vulkan --batch 32 --n 256 --reps 3
