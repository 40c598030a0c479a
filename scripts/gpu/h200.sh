#!/usr/bin/env bash
# One run on a GPU machine without a Vulkan loader (such as an NVIDIA H200): unpack the loader
# libraries carried in .gl/, then run the PyTorch peer and `gelo bench gpu` on the same GPU
# and join their numbers. Logs and JSON land in $OUT (or ./gpu-out).
#
# usage: [STAGES="torch gemm tc blocks thp tiles cubek-spirv cubek-wgsl"] scripts/gpu/h200.sh [GELO_BINARY [PEER_DIR]]
#        (default binary: .devbin/gelo, a release build; `cubek-*` run PEER_DIR/cubek-peer-*,
#        default .devbin, built by scripts/gpu/cubek-peer/build.sh; not in the default stages)
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/gpu/lib.sh
bin="${1:-.devbin/gelo}"
peers="${2:-.devbin}"
log="$out/log.txt"

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

# Stages to run (all by default); e.g. STAGES="torch gemm tc blocks" for the headline numbers.
stages=" ${STAGES:-torch gemm tc blocks thp tiles} "
want() { [[ "$stages" == *" $1 "* ]]; }

# The peer first: it also brings the GPU to its working clocks.
want torch && stage torch 90 python3 scripts/gpu/torch_peer.py --json "$out/torch.json"
want gemm && stage gemm 150 "$bin" bench gpu --sections gemm,roundtrip --json "$out/gelo.json"
want tc && stage tensor-cores 90 "$bin" bench gpu --sections gemm --weights f16 --tensor-cores --json "$out/gelo-tc.json"
want blocks && stage blocks 120 "$bin" bench gpu --sections blocks --json "$out/blocks.json"
# The same with transparent huge pages for the host allocator: how much of the call time is
# page faults on freshly allocated result buffers (a VM's first touch is expensive).
# (Tables in log.txt only: $OUT brings back at most 8 files.)
if want thp; then
  stage gemm-thp 60 env GLIBC_TUNABLES=glibc.malloc.hugetlb=1 "$bin" bench gpu --sections gemm --models qwen3-1.7b --weights f32
  stage blocks-thp 60 env GLIBC_TUNABLES=glibc.malloc.hugetlb=1 "$bin" bench gpu --sections blocks --models qwen3-1.7b
fi
want tiles && stage tiles 90 "$bin" bench gpu --sections tiles --tensor-cores --models qwen3-1.7b --m 16,512,2056 --weights f32,f16 --reps 5 --json "$out/tiles.json"
# cubek's matmul on the same cells, every routine it offers tried per cell, through SPIR-V
# (cubecl's fastest on Vulkan) and through WGSL (the engine's compiler); peer_report.py
# joins them with gelo.json and gelo-tc.json.
want cubek-spirv && stage cubek-spirv 540 "$peers/cubek-peer-spirv" --json "$out/cubek-spirv.json"
want cubek-wgsl && stage cubek-wgsl 540 "$peers/cubek-peer-wgsl" --json "$out/cubek-wgsl.json"
if [ -f "$out/torch.json" ]; then
  python3 scripts/gpu/report.py "$out/gelo.json" "$out/torch.json" "$out/gelo-tc.json" >"$out/report.md" 2>&1
  cat "$out/report.md"
fi
