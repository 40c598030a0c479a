#!/usr/bin/env bash
# The CPU comparison on a host of many cores, from nothing but this checkout and a gelo
# binary: random-weight models of the shapes no download offers (Qwen3-1.7B GGUF, quantized
# by llama.cpp; BERT-base and MiniLM-L6 safetensors), then the peers (scripts/bench/peers.sh),
# the thread scaling of GELO and llama.cpp, and the kernels against the copy bandwidth.
#
#   scripts/bench/host.sh --gelo PATH --work DIR [STAGE...]
#
# STAGE: models, decoders, bert, scaling, kernels, gemm (all but gemm, in this order, by default). Each is
# idempotent: models already written are reused. Results go to DIR/results. GGUF_WHEEL,
# LLAMA_CPP_SDIST and DISKCACHE_WHEEL name local files where PyPI is out of reach (LLAMA_CPP_DIR a
# llama-cpp-python built elsewhere, see lib.sh);
# QWEN3_TOKENIZER Qwen3's tokenizer.json (default: scripts/fetch-models.sh's copy);
# BERT_TOKENIZER a sentence-transformers folder whose tokenizer the random BERTs use
# (default: the all-MiniLM-L6-v2 of scripts/fetch-models.sh).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=scripts/bench/lib.sh
source "$here/lib.sh"
gelo="" work="" stages=()
while [ $# -gt 0 ]; do
  case "$1" in
    --gelo) gelo="$2"; shift 2 ;;
    --work) work="$2"; shift 2 ;;
    *) stages+=("$1"); shift ;;
  esac
done
[ -x "$gelo" ] && [ -n "$work" ] || { echo "usage: $0 --gelo PATH --work DIR [STAGE...]" >&2; exit 2; }
[ ${#stages[@]} -gt 0 ] || stages=(models decoders bert scaling kernels)
threads="${THREADS:-$(nproc)}"
mkdir -p "$work/models" "$work/results"
res="$work/results"
llama="$(llama_env)"
pyenv="$work/py"
if [ ! -d "$pyenv/gguf" ]; then
  python3 -m pip install --quiet --no-deps --target "$pyenv" "${GGUF_WHEEL:-gguf==0.19.0}"
fi
export PYTHONPATH="$llama:$pyenv${PYTHONPATH:+:$PYTHONPATH}"
q17="$work/models/qwen3-1.7b-q4_k_m.gguf"

for stage in "${stages[@]}"; do
  case "$stage" in
    models)
      [ -f "$q17" ] || python3 "$here/random_gguf.py" --shape qwen3-1.7b --out "$work/models" --types Q4_K_M,Q8_0 \
        ${QWEN3_TOKENIZER:+--tokenizer "$QWEN3_TOKENIZER"}
      rm -f "$work/models/qwen3-1.7b-f16.gguf"
      for shape in bert-base minilm-l6; do
        [ -f "$work/models/$shape/model.safetensors" ] ||
          python3 "$here/bert_peers.py" --random "$shape" --out "$work/models/$shape" \
            --tokenizer-from "${BERT_TOKENIZER:-${GELO_CACHE:-$HOME/.cache/gelo}/models/all-minilm-l6-v2}"
      done
      ;;
    decoders) "$here/peers.sh" --gelo "$gelo" --threads "$threads" --rounds "${ROUNDS:-3}" --out "$res/decoders" "$q17" ;;
    bert)
      BERT_TOKENS=256 "$here/peers.sh" --gelo "$gelo" --threads "$threads" --rounds "${ROUNDS:-3}" --out "$res/bert-base" "$work/models/bert-base"
      BERT_TOKENS=128 "$here/peers.sh" --gelo "$gelo" --threads "$threads" --rounds "${ROUNDS:-3}" --out "$res/minilm" "$work/models/minilm-l6"
      ;;
    scaling)
      for t in 1 2 4 8 16; do
        [ "$t" -le "$(nproc)" ] || continue
        RAYON_NUM_THREADS=$t "$gelo" bench sealed --model "$q17" --prompt 128 --steps 16 --reps 1 --batch 1 \
          --json "$res/scaling.gelo.$t.json" | grep -v '^memory' || true
        python3 "$here/llama_cpp_peer.py" --model "$q17" --threads "$t" --prompt 128 --steps 16 --reps 1 --batch 1 \
          --json "$res/scaling.llama.$t.json" || true
      done
      ;;
    kernels)
      cells=(--shapes 6144x2048,2048x6144,151936x2048 --formats Q4_K,Q6_K,Q8_0 --rows 1,8,512)
      "$gelo" bench kernels "${cells[@]}" | tee "$res/kernels.gelo.txt"
      # The AVX2 kernels on the same host, where a wider set was picked above.
      GELO_ISA=avx2 "$gelo" bench kernels "${cells[@]}" | tee "$res/kernels.gelo-avx2.txt"
      # CANDLE_PEER: scripts/bench/candle-peer built for this host (the library alternative).
      if [ -n "${CANDLE_PEER:-}" ]; then
        RAYON_NUM_THREADS="$threads" "$CANDLE_PEER" "${cells[@]}" | tee "$res/kernels.candle.txt"
      fi
      ;;
    gemm)
      # BERT's f32 products alone, GELO (its row split, then the gemm crate's own threading)
      # against PyTorch's: whether a BERT gap lies in the GEMM or around it.
      cells=(--formats F32 --shapes 768x768,3072x768,768x3072,384x384,1536x384,384x1536 --rows 4096,8192)
      "$gelo" bench kernels "${cells[@]}" | tee "$res/gemm.gelo.txt"
      GELO_SGEMM=gemm "$gelo" bench kernels "${cells[@]}" | tee "$res/gemm.gelo-split-gemm.txt"
      python3 "$here/torch_gemm.py" --threads "$threads" | tee "$res/gemm.torch.txt"
      ;;
    *) echo "unknown stage $stage" >&2; exit 2 ;;
  esac
done
