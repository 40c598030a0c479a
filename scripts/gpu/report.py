#!/usr/bin/env python3
"""Joins `gelo bench gpu --json` and `torch_peer.py --json` output into the comparison tables
of docs/BENCHMARKS.md: engine f32 vs PyTorch fp32 (TF32 off), engine f16 weights vs PyTorch
bf16, and the decode round trip.

usage: report.py GELO_JSON TORCH_JSON [TENSOR_CORE_GELO_JSON]
"""

import json
import sys


def load(path):
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                rows.append(json.loads(line))
    return rows


def main():
    gelo, torch = load(sys.argv[1]), load(sys.argv[2])
    tc = {}
    if len(sys.argv) > 3:
        try:
            tc = {(r["model"], r["linear"], r["m"], r["weights"]): r
                  for r in load(sys.argv[3]) if r["section"] == "gemm"}
        except FileNotFoundError:
            pass
    peer = {(r["model"], r["linear"], r["m"], r["dtype"]): r for r in torch if r["section"] == "gemm"}
    # "steady": the engine's kernels repeated back to back in one submission, the device
    # busy as in the peer's timing; "per call": the kernel time inside one engine call.
    print("| model | linear | k×n | m | engine f32 steady TFLOP/s | per call | torch fp32 | % steady | % per call "
          "| engine f16-W steady | tensor cores f16-W steady | torch bf16 | % (best f16, steady) | engine f32 call TFLOP/s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    cells = {}
    for r in gelo:
        if r["section"] == "gemm":
            cells[(r["model"], r["linear"], r["m"], r["weights"])] = r
    keys = sorted({(m, l, mm) for (m, l, mm, _) in cells}, key=lambda k: (k[0], k[1], k[2]))
    for model, lin, m in keys:
        f32, f16 = cells.get((model, lin, m, "f32")), cells.get((model, lin, m, "f16"))
        t32, t16 = peer.get((model, lin, m, "fp32")), peer.get((model, lin, m, "bf16"))
        ref = f32 or f16

        def pct(e, t, key="tflops_gpu"):
            return f"{100 * e[key] / t['tflops']:.0f}" if e and t else "-"

        def tf(e, key="tflops_gpu"):
            return f"{e[key]:.2f}" if e else "-"

        def tt(t):
            return f"{t['tflops']:.2f}" if t else "-"

        c16 = tc.get((model, lin, m, "f16"))
        st = "tflops_steady"
        best16 = max([e for e in (f16, c16) if e and e.get(st) == e.get(st)],
                     key=lambda e: e[st], default=None)
        print(f"| {model} | {lin} | {ref['k']}×{ref['n']} | {m} | {tf(f32, st)} | {tf(f32)} | {tt(t32)} "
              f"| {pct(f32, t32, st)} | {pct(f32, t32)} "
              f"| {tf(f16, st)} | {tf(c16, st)} | {tt(t16)} | {pct(best16, t16, st)} | {tf(f32, 'tflops_call')} |")
    print()
    print("| m | engine weights | engine median µs | torch dtype | torch median µs |")
    print("|---|---|---|---|---|")
    tr = {(r["m"], r["dtype"]): r for r in torch if r["section"] == "roundtrip"}
    for r in gelo:
        if r["section"] == "roundtrip" and r["threads"] == 1:
            t = tr.get((r["m"], "fp32" if r["weights"] == "f32" else "bf16"))
            ts = f"{t['median_s'] * 1e6:.1f}" if t else "-"
            print(f"| {r['m']} | {r['weights']} | {r['median_s'] * 1e6:.1f} | {t['dtype'] if t else '-'} | {ts} |")


if __name__ == "__main__":
    main()
