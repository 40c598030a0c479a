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
cache="${GELO_CACHE:-$HOME/.cache/gelo}/peers"

llama_env() {
  # One build per CPU: GGML_NATIVE compiles for the machine it runs on.
  local sig; sig="$(grep -m1 '^flags' /proc/cpuinfo | sha256sum | cut -c1-12)"
  local dir="$cache/llama-$sig"
  if [ ! -f "$dir/.done" ]; then
    rm -rf "$dir" && mkdir -p "$dir"
    local src="${LLAMA_CPP_SDIST:-llama-cpp-python==0.3.36}"
    echo "building llama-cpp-python 0.3.36 for this CPU into $dir" >&2
    CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF" \
      CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
      python3 -m pip install --quiet --no-deps --no-build-isolation --target "$dir" "$src" >&2
    python3 -c "import diskcache" 2>/dev/null || python3 -m pip install --quiet --no-deps --target "$dir" diskcache==5.6.3 >&2
    touch "$dir/.done"
  fi
  echo "$dir"
}

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
