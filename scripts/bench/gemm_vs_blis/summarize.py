#!/usr/bin/env python3
"""Markdown table from run.py's results (usage: summarize.py OUT.jsonl [max foreign cores]).
Per shape and thread count, each library's GFLOP/s: the median of the per-round medians
(with the per-round range when it spans 5 % or more), and gemm/BLIS."""
import json, statistics, sys
from collections import defaultdict

maxf = float(sys.argv[2]) if len(sys.argv) > 2 else 1e9
cell, rel, shapes, used = defaultdict(list), {}, [], defaultdict(int)
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r["rc"] != 0 or r["foreign_cores"] > maxf:
        continue
    used[(r["lib"], r["threads"])] += 1
    for lib, th, lay, m, k, n, _reps, _t, gf, rd in r["rows"]:
        key = (lay, int(m), int(k), int(n))
        cell[(key, lib, int(th))].append(float(gf))
        rel[key] = max(rel.get(key, 0.0), float(rd))
        if key not in shapes:
            shapes.append(key)

def fmt(v):
    if not v:
        return "–"
    med = statistics.median(v)
    if max(v) - min(v) < 0.05 * med:
        return f"{med:.1f}"
    return f"{med:.1f} ({min(v):.1f}–{max(v):.1f})"

def ratio(a, b):
    return f"{statistics.median(a) / statistics.median(b):.2f}" if a and b else "–"

cols = [("gemm", 1), ("blis", 1), ("gemm", 2), ("blis", 2), ("engine", 1), ("engine", 2)]
name = {"gemm": "gemm", "blis": "BLIS", "engine": "engine"}
print("| B | m × k × n | " + " | ".join(f"{name[l]} {t}T" for l, t in cols) + " | gemm/BLIS 1T | gemm/BLIS 2T | max rel. diff |")
print("|---" * (len(cols) + 5) + "|")
for s in shapes:
    v = {c: cell[(s, *c)] for c in cols}
    print(f"| {s[0]} | {s[1]} × {s[2]} × {s[3]} | " + " | ".join(fmt(v[c]) for c in cols)
          + f" | {ratio(v[('gemm', 1)], v[('blis', 1)])} | {ratio(v[('gemm', 2)], v[('blis', 2)])} | {rel[s]:.0e} |")
print("processes used:", dict(used))
