#!/usr/bin/env bash
# GELO's sealed path against the CPU runtimes a user would pick instead, in one run on one
# machine: llama.cpp (llama-cpp-python, built here for this CPU) on GGUF decoders, PyTorch
# and ONNX Runtime on BERT embedders. Process order alternates peer, GELO, peer, GELO for
# --rounds rounds; scripts/bench/peers_report.py prints medians and ratios.
#
#   scripts/bench/peers.sh --gelo PATH --threads N [--rounds 3] [--out DIR] MODEL...
#
# A MODEL is a .gguf file (llama.cpp peer) or a BERT folder (PyTorch / ONNX Runtime peers).
# The llama.cpp build is cached in ${GELO_CACHE:-~/.cache/gelo}/peers/llama-<cpu flags hash>;
# LLAMA_CPP_SDIST points at a llama-cpp-python 0.3.36 source archive where PyPI is out of
# reach. Decoder cells: prefill of 512 tokens, decode B = 1 and 8 (32 steps after 32 tokens).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
gelo="" threads="$(nproc)" rounds=3 out="" models=()
while [ $# -gt 0 ]; do
  case "$1" in
    --gelo) gelo="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    *) models+=("$1"); shift ;;
  esac
done
[ -x "$gelo" ] || { echo "--gelo: the gelo binary to measure" >&2; exit 2; }
[ ${#models[@]} -gt 0 ] || { echo "no models given" >&2; exit 2; }
out="${out:-$(mktemp -d)}"
mkdir -p "$out"

# shellcheck source=scripts/bench/lib.sh
source "$here/lib.sh"

export RAYON_NUM_THREADS="$threads"
for m in "${models[@]}"; do
  name="$(basename "$m")"
  for r in $(seq 1 "$rounds"); do
    if [[ "$m" == *.gguf ]]; then
      env="$(llama_env)"
      PYTHONPATH="$env${PYTHONPATH:+:$PYTHONPATH}" python3 "$here/llama_cpp_peer.py" --model "$m" --threads "$threads" \
        --json "$out/$name.llama.$r.json"
      "$gelo" bench sealed --model "$m" --json "$out/$name.gelo.$r.json"
    else
      python3 "$here/bert_peers.py" --model "$m" --threads "$threads" --texts 32 --n "${BERT_TOKENS:-256}" \
        --json "$out/$name.peers.$r.json"
      "$gelo" bench sealed --model "$m" --texts 32 --n "${BERT_TOKENS:-256}" --json "$out/$name.gelo.$r.json"
    fi
  done
done
python3 "$here/peers_report.py" "$out"
