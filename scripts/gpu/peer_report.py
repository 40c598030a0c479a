#!/usr/bin/env python3
"""Joins the engine's GEMM cells (`gelo bench gpu --json`, without and with tensor cores) with
cubek's through WGSL and through SPIR-V (`cubek-peer --json`, two builds) and, when given,
PyTorch's (`torch_peer.py --json`): the table of docs/DEPENDENCIES.md that decides whether the
engine keeps its own kernels.

All TFLOP/s are steady kernel time: the same kernels back to back, the device busy.

usage: peer_report.py GELO_JSON GELO_TC_JSON CUBEK_WGSL_JSON CUBEK_SPIRV_JSON [TORCH_JSON]
"""

import json
import statistics
import sys


def load(path):
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


def gemm(rows, dtype_key):
    return {(r["model"], r["linear"], r["m"], r[dtype_key]): r["tflops_steady"] if "tflops_steady" in r else r["tflops"]
            for r in rows if r.get("section") == "gemm"}


def main():
    gelo, tc = gemm(load(sys.argv[1]), "weights"), gemm(load(sys.argv[2]), "weights")
    wgsl, spirv = gemm(load(sys.argv[3]), "dtype"), gemm(load(sys.argv[4]), "dtype")
    torch = gemm(load(sys.argv[5]), "dtype") if len(sys.argv) > 5 else {}
    shapes = {}
    for path in sys.argv[3:5]:
        shapes.update({(r["model"], r["linear"], r["m"]): (r["k"], r["n"]) for r in load(path) if r.get("section") == "gemm"})
    print("| model | linear | k×n | m | engine f32 | cubek f32 WGSL | cubek f32 SPIR-V | engine / best cubek f32 "
          "| engine f16-W (best) | cubek f16 WGSL | cubek f16 SPIR-V | engine / best cubek f16 | torch fp32 | torch bf16 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    ratios = {"f32": [], "f16": []}

    def tf(v):
        return f"{v:.2f}" if v is not None and v == v else "-"

    def ratio(ours, peers, name):
        peers = [p for p in peers if p is not None]
        if ours is None or not peers:
            return "-"
        r = ours / max(peers)
        ratios[name].append(r)
        return f"{r:.2f}"

    for key in sorted(shapes):
        e32 = gelo.get(key + ("f32",))
        e16 = max([v for v in (gelo.get(key + ("f16",)), tc.get(key + ("f16",))) if v is not None and v == v],
                  default=None)
        w32, s32 = wgsl.get(key + ("f32",)), spirv.get(key + ("f32",))
        w16, s16 = wgsl.get(key + ("f16",)), spirv.get(key + ("f16",))
        k, n = shapes[key]
        print(f"| {key[0]} | {key[1]} | {k}×{n} | {key[2]} | {tf(e32)} | {tf(w32)} | {tf(s32)} | {ratio(e32, [w32, s32], 'f32')} "
              f"| {tf(e16)} | {tf(w16)} | {tf(s16)} | {ratio(e16, [w16, s16], 'f16')} "
              f"| {tf(torch.get(key + ('fp32',)))} | {tf(torch.get(key + ('bf16',)))} |")
    for name, r in ratios.items():
        if r:
            print(f"\nengine / best cubek, {name}: median {statistics.median(r):.2f}, range {min(r):.2f}–{max(r):.2f}, "
                  f"engine faster in {sum(x > 1 for x in r)} of {len(r)} cells")


if __name__ == "__main__":
    main()
