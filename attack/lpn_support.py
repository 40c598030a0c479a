#!/usr/bin/env python3
"""The access-pattern attack on the dual-LPN protection (docs/SECURITY.md, "Computational
hiding"): a hypervisor that traces which rows of `H` (and of the tables `H·W`) the TEE reads
learns the support `S` of the sparse secret `e`; the masked row `b = x + e_S·H_S mod 2^32`
is then an LWE sample with a `t`-dimensional secret and the int8 row `x` as its error,
`2^25` times smaller than the modulus. Lattice reduction (fpylll's LLL, then BKZ if needed)
of the primal embedding on `m` of the `d` columns finds `x` on those columns; `e` and the
whole row follow by linear algebra modulo 2^32.

    python3 attack/lpn_support.py [--d 384] [--t 134] [--m 240] [--rows 3] [--check]

`--check` exits non-zero unless every row is recovered exactly and a control with one wrong
support row recovers nothing (attack/run.sh gates it).
The same attack without the support has to guess `S` among C(4d, t) sets: the trace is what
breaks the scheme, not the LPN assumption.
"""

import argparse
import sys
import time

import numpy as np

Q = 1 << 32


def inv_mod2k(a):
    """Inverse of a square integer matrix modulo 2^32 (Gauss-Jordan over Z/2^32, pivots odd),
    or None if it is singular mod 2."""
    n = a.shape[0]
    m = np.concatenate([a.astype(object) % Q, np.eye(n, dtype=object)], axis=1)
    for col in range(n):
        piv = next((r for r in range(col, n) if m[r, col] % 2 == 1), None)
        if piv is None:
            return None
        m[[col, piv]] = m[[piv, col]]
        m[col] = (m[col] * pow(int(m[col, col]), -1, Q)) % Q
        for r in range(n):
            if r != col and m[r, col] != 0:
                m[r] = (m[r] - m[r, col] * m[col]) % Q
    return m[:, n:]


def activation_row(rng, d, kind):
    if kind == "uniform":
        return rng.integers(-127, 128, size=d)
    # Heavy-tailed like a transformer's activations, quantized per row as the scheme does.
    v = rng.laplace(size=d)
    return np.round(v / np.abs(v).max() * 127).astype(np.int64)


def attack_row(b, h_s, t, m, block):
    """x from the masked row `b` and the rows `h_s` of H at the traced support."""
    from fpylll import BKZ, LLL, IntegerMatrix

    d = b.shape[0]
    # Columns where the first t form a block invertible mod 2.
    rng = np.random.default_rng(0)
    for _ in range(64):
        cols = rng.permutation(d)[:m]
        a1_inv = inv_mod2k(h_s[:, cols[:t]])
        if a1_inv is not None:
            break
    else:
        return None
    g = (a1_inv.dot(h_s[:, cols[t:]].astype(object))) % Q  # t × (m − t), systematic form
    basis = IntegerMatrix(m + 1, m + 1)
    for i in range(t):
        basis[i, i] = 1
        for j in range(m - t):
            basis[i, t + j] = int(g[i, j])
    for j in range(m - t):
        basis[t + j, t + j] = Q
    for j in range(m):
        basis[m, j] = int(b[cols[j]])
    basis[m, m] = 1
    LLL.reduction(basis)
    for reduce in (None, block):
        if reduce:
            BKZ.reduction(basis, BKZ.Param(block_size=reduce))
        for r in range(m + 1):
            row = np.array([basis[r, j] for j in range(m + 1)], dtype=object)
            if abs(row[m]) != 1:
                continue
            x_j = row[:m] * row[m]  # the embedding coordinate is ±1
            if np.max(np.abs(x_j.astype(np.int64))) > 127:
                continue
            # c = (b − x) on the first t columns; e = c·A1⁻¹; then the whole row.
            c = (b[cols[:t]].astype(object) - x_j[:t]) % Q
            e = (c.dot(a1_inv)) % Q
            r_full = (e.dot(h_s.astype(object))) % Q
            x = ((b.astype(object) - r_full) % Q).astype(np.int64)
            x = np.where(x >= Q // 2, x - Q, x)
            if np.max(np.abs(x)) <= 127:
                return x
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--d", type=int, default=384)
    ap.add_argument("--t", type=int, default=134)
    ap.add_argument("--m", type=int, default=240, help="columns the lattice uses")
    ap.add_argument("--block", type=int, default=20, help="BKZ block size if LLL alone fails")
    ap.add_argument("--rows", type=int, default=3)
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args()
    rng = np.random.default_rng(1)
    n = 4 * a.d
    h = rng.integers(0, Q, size=(n, a.d), dtype=np.uint64).astype(object)
    ok = 0
    for i in range(a.rows):
        kind = "uniform" if i % 2 == 0 else "heavy-tailed"
        x = activation_row(rng, a.d, kind)
        support = np.sort(rng.choice(n, size=a.t, replace=False))
        e = rng.integers(1, Q, size=a.t, dtype=np.uint64).astype(object)
        b = (x.astype(object) + e.dot(h[support])) % Q
        start = time.perf_counter()
        got = attack_row(b, h[support], a.t, a.m, a.block)
        exact = got is not None and np.array_equal(got, x)
        ok += exact
        print(f"row {i} ({kind}): {'recovered exactly' if exact else 'not recovered'} "
              f"from the traced support in {time.perf_counter() - start:.1f} s (d = {a.d}, t = {a.t}, m = {a.m})")
    print(f"{ok}/{a.rows} rows recovered")
    # The control: the same attack given a wrong support (one traced row replaced) finds
    # nothing, so what recovers the row is the trace, not a weakness of the masks.
    x = activation_row(rng, a.d, "heavy-tailed")
    support = np.sort(rng.choice(n, size=a.t, replace=False))
    e = rng.integers(1, Q, size=a.t, dtype=np.uint64).astype(object)
    b = (x.astype(object) + e.dot(h[support])) % Q
    wrong = support.copy()
    wrong[0] = next(p for p in range(n) if p not in set(support.tolist()))
    control = attack_row(b, h[wrong], a.t, a.m, a.block)
    blind = control is None or not np.array_equal(control, x)
    print(f"control (one support row wrong): {'nothing recovered' if blind else 'RECOVERED'}")
    if a.check and (ok != a.rows or not blind):
        sys.exit(1)


if __name__ == "__main__":
    main()
