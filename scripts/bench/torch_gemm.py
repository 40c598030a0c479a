#!/usr/bin/env python3
"""PyTorch's f32 CPU product `x · Wᵀ` (`torch.nn.functional.linear`, a weight `[out, in]`)
for the shapes and row counts `gelo bench kernels --formats F32` times, on `--threads`
threads: the same cell in both says whether a BERT gap lies in the GEMM or around it.
Fastest call of at least `--seconds`, as the GELO side reports.

    python3 scripts/bench/torch_gemm.py --threads 16 --shapes 768x768,3072x768,768x3072 --rows 4096,8192
"""

import argparse
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--shapes", default="768x768,3072x768,768x3072,384x384,1536x384,384x1536")
    ap.add_argument("--rows", default="4096,8192")
    ap.add_argument("--seconds", type=float, default=0.5)
    a = ap.parse_args()

    import torch

    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    print(f"| format | out × in | rows | {a.threads} threads, torch {torch.__version__} | GFLOP/s |")
    print("|---|---|---|---|---|")
    with torch.inference_mode():
        for shape in a.shapes.split(","):
            o, i = (int(v) for v in shape.split("x"))
            w = torch.empty(o, i).uniform_(-0.05, 0.05)
            for m in (int(r) for r in a.rows.split(",")):
                x = torch.randn(m, i)
                torch.nn.functional.linear(x, w)
                best, n, t0 = float("inf"), 0, time.perf_counter()
                while n < 3 or time.perf_counter() - t0 < a.seconds:
                    c = time.perf_counter()
                    torch.nn.functional.linear(x, w)
                    best = min(best, time.perf_counter() - c)
                    n += 1
                print(f"| F32 | {o}×{i} | {m} | {best * 1e3:.3f} ms | {2 * m * o * i / best / 1e9:.1f} |")


if __name__ == "__main__":
    main()
