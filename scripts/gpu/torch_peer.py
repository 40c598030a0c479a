#!/usr/bin/env python3
"""PyTorch peer of `gelo bench gpu`: the same GEMM cells and decode round trip on the same GPU.

GEMM: x (m×k) @ W.T with W (n×k) resident, timed with CUDA events (kernel time, medians of
--reps after warm-up), in fp32 with TF32 off and in bf16. Round trip: x from host memory to
the GPU, the product, the result back to host memory, timed on the host clock (the .cpu()
copy synchronises), like the engine's call.

Writes one JSON object per line to --json and prints markdown tables.
"""

import argparse
import json
import statistics
import time

import torch

LINEARS = {
    "bert-base": [("qkv", 768, 768), ("up", 768, 3072), ("down", 3072, 768)],
    "qwen3-0.6b": [("q", 1024, 2048), ("kv", 1024, 1024), ("o", 2048, 1024),
                   ("gate_up", 1024, 3072), ("down", 3072, 1024)],
    "qwen3-1.7b": [("q_o", 2048, 2048), ("kv", 2048, 1024), ("gate_up", 2048, 6144),
                   ("down", 6144, 2048)],
}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def kernel_seconds(fn, reps):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e-3)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="qwen3-0.6b,bert-base,qwen3-1.7b")
    ap.add_argument("--m", default="16,128,512,2056")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--json")
    a = ap.parse_args()
    # fp32 means fp32: no TF32 tensor-core shortcut.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    dev = torch.device("cuda")
    out = open(a.json, "w") if a.json else None

    def record(row):
        if out:
            out.write(json.dumps(row) + "\n")
            out.flush()

    name = torch.cuda.get_device_name(0)
    print(f"torch {torch.__version__} on {name}")
    record({"section": "engine", "device": name, "torch": torch.__version__})
    print("\n| model | linear | k×n | m | dtype | GPU µs | TFLOP/s |\n|---|---|---|---|---|---|---|")
    g = torch.Generator(device=dev).manual_seed(0)
    for model in a.models.split(","):
        for lin, k, n in LINEARS[model]:
            for dname, dt in DTYPES.items():
                w = torch.randn(n, k, device=dev, generator=g).to(dt)
                for m in map(int, a.m.split(",")):
                    x = torch.randn(m, k, device=dev, generator=g).to(dt)
                    s = kernel_seconds(lambda: x @ w.T, a.reps)
                    tf = 2 * m * k * n / s * 1e-12
                    print(f"| {model} | {lin} | {k}×{n} | {m} | {dname} | {s * 1e6:.1f} | {tf:.2f} |")
                    record({"section": "gemm", "model": model, "linear": lin, "m": m, "k": k, "n": n,
                            "dtype": dname, "gpu_s": s, "tflops": tf})
    print("\n| m | dtype | round trip median µs | p10 µs | p90 µs |\n|---|---|---|---|---|")
    k, n = 2048, 4096
    for dname, dt in DTYPES.items():
        w = torch.randn(n, k, device=dev, generator=g).to(dt)
        for m in (1, 16):
            xh = torch.randn(m, k)
            for _ in range(20):
                (xh.to(dev).to(dt) @ w.T).float().cpu()
            lat = []
            for _ in range(300):
                t = time.perf_counter()
                (xh.to(dev).to(dt) @ w.T).float().cpu()
                lat.append(time.perf_counter() - t)
            lat.sort()
            med, p10, p90 = statistics.median(lat), lat[len(lat) // 10], lat[9 * len(lat) // 10]
            print(f"| {m} | {dname} | {med * 1e6:.1f} | {p10 * 1e6:.1f} | {p90 * 1e6:.1f} |")
            record({"section": "roundtrip", "m": m, "k": k, "n": n, "dtype": dname,
                    "median_s": med, "p10_s": p10, "p90_s": p90})


if __name__ == "__main__":
    main()
