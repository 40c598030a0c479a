"""Checks the leakage formulas of docs/SECURITY.md ("What the GPU can learn") by simulation.

Under a Haar mask the GPU's view is the Gram XᵀX (§1), so the simulation draws Grams, not
operands: for each setting it plants n rows of a random unit "vocabulary" in a block, adds k
Gaussian shield rows of per-entry energy ratio α, and measures
  * the row-space test's non-member projection (§2: mean r/d) and its top-1 accuracy,
  * the quadratic-form SNR of a present token against the shield noise (§3: d/(α√(2k))).
Prints predicted beside measured; exits non-zero when they disagree by more than 25 %.
"""

import sys

import numpy as np


def quad_snr(d, n, k, alpha, trials, rng):
    """Measured SNR of ê_tᵀ(G − kσ²I)ê_t for a present token, over fresh shields."""
    h_norm2 = float(d)  # rows of energy d: per-entry energy 1
    sigma2 = alpha * h_norm2 / d
    signal, noise = [], []
    for _ in range(trials):
        e = rng.standard_normal((n, d))
        e *= np.sqrt(h_norm2) / np.linalg.norm(e, axis=1, keepdims=True)
        s = rng.standard_normal((k, d)) * np.sqrt(sigma2)
        x = np.vstack([e, s])
        g = x.T @ x
        t = e[0] / np.linalg.norm(e[0])
        signal.append(t @ g @ t - k * sigma2)
        u = rng.standard_normal(d)
        u /= np.linalg.norm(u)
        noise.append(u @ (s.T @ s) @ u - k * sigma2)
    return (np.mean(signal) - np.mean(noise)) / np.std(noise)


def rowspace(d, n, k, vocab, rng):
    """Non-member projection mean and top-n accuracy of the row-space test."""
    table = rng.standard_normal((vocab, d))
    table /= np.linalg.norm(table, axis=1, keepdims=True)
    toks = rng.choice(vocab, n, replace=False)
    x = np.vstack([table[toks] * 10.0, rng.standard_normal((k, d)) * 40.0])
    q, _ = np.linalg.qr(x.T)  # orthonormal basis of the row space (d×s)
    proj = np.sum((table @ q) ** 2, axis=1)
    mask = np.ones(vocab, bool)
    mask[toks] = False
    top = set(np.argsort(-proj)[:n].tolist())
    return proj[mask].mean(), len(top & set(toks.tolist())) / n


def main():
    rng = np.random.default_rng(7)
    ok = True
    print("quadratic-form SNR (one operand, one present token)")
    print(f"{'d':>5} {'n':>4} {'k':>5} {'alpha':>6} {'predicted':>10} {'measured':>9}")
    for d, n, k, alpha in [(384, 16, 8, 16), (576, 16, 8, 16), (576, 8, 576, 34), (384, 8, 384, 4)]:
        pred = d / (alpha * np.sqrt(2 * k))
        meas = quad_snr(d, n, k, alpha, 400, rng)
        print(f"{d:5d} {n:4d} {k:5d} {alpha:6.0f} {pred:10.2f} {meas:9.2f}")
        ok &= abs(meas - pred) <= 0.25 * pred + 0.1
    print("row-space test (non-member projection; top-n recovery)")
    print(f"{'d':>5} {'r':>4} {'mean r/d':>9} {'measured':>9} {'recovered':>9}")
    for d, n, k in [(384, 24, 8), (576, 32, 8), (576, 200, 376), (576, 32, 544)]:
        mean, acc = rowspace(d, n, k, 8000, rng)
        r = min(n + k, d)
        print(f"{d:5d} {r:4d} {r / d:9.3f} {mean:9.3f} {acc:9.3f}")
        ok &= abs(mean - r / d) <= 0.25 * r / d
        ok &= (acc == 1.0) if r < d else (acc < 0.5)
    print("formulas agree" if ok else "FORMULA MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
