"""Attack costs for LPN and dual LPN over F_2, F_q and Z_{2^λ} (log2 of operations).

Notation as in Liu–Yu–Wang–Yang (eprint 2022/712): an LPN instance has N samples, a
secret of length k and a noise vector of Hamming weight t (exactly t, or each coordinate
noisy with probability t/N). Dual LPN with output length n and code length N — the
syndrome e·H of a t-sparse e ∈ R^N under a public N×n matrix H — is the same problem as
primal LPN with k = N − n (H is a parity-check matrix of the code the primal matrix spans).

Attacks (each a function returning log2 cost):

* `gauss` — Gaussian elimination ("Pooled Gauss", Esser–Kübler–May): guess k noise-free
  samples, solve, test; k^ω per guess (ω = 2.8, Strassen), repeated 1/P(k samples clean).
  With Bernoulli noise P = (1 − t/N)^k (the formula of Boyle–Couteau–Gilboa–Ishai,
  eprint 2019/273); with exactly t noisy samples P = C(N−k, t)/C(N, t).
* `stern_dumer` — information set decoding with Stern's collision step in Dumer's form,
  costed as 2022/712 does: an iteration is a Gaussian elimination on (N−k−l)×N plus two
  lists of L₀ = C((k+l)/2, p/2) partial sums and their S = L₀²/2^l collisions on l bits,
  each vector operation N bit operations; an iteration succeeds when the noise has p
  positions in the k+l window and t−p outside it. `prange` is its p = l = 0 case.
* `statistical_decoding` — collect parity checks of weight about k+1 (from Gaussian
  elimination on k+1 coordinates); one is unbiased unless its support misses all noise,
  so about ((N−t)/(N−k−t))^{2t} of them are needed over F_2, (C(N,t)/C(N−k−1,t))² over
  a large field, k+1 operations each.
* Over Z_{2^λ}, reducing every sample mod 2 gives LPN over F_2 whose noise keeps only the
  odd noise values: a uniform nonzero value of Z_{2^λ} is odd with probability
  2^{λ−1}/(2^λ − 1), so weight t becomes about t/2 (`ring_to_f2_weight`). 2022/712 shows
  this "halving" is the best known attack structure for Z_{2^λ}: the F_2 attacks with
  t/2 are its estimate.

The regular-noise variants (one nonzero per block of N/t) and the algebraic AGB attack
that only applies to them are not modelled: the masks analysed here use exact-weight noise.
"""

from __future__ import annotations

import math

import numpy as np

OMEGA = 2.8


def log2_binom(n: float, k: float) -> float:
    if k < 0 or k > n:
        return -math.inf
    return (math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)) / math.log(2)


def _log2_binom_vec(n: np.ndarray, k: np.ndarray) -> np.ndarray:
    from math import lgamma

    lg = np.vectorize(lgamma, otypes=[float])
    out = (lg(n + 1) - lg(k + 1) - lg(n - k + 1)) / math.log(2)
    return np.where((k < 0) | (k > n), -np.inf, out)


def gauss(N: int, k: int, t: int, noise: str = "exact", solve_dim: str = "min") -> float:
    """Pooled Gauss. `solve_dim="k"` charges k^ω per guess as Boyle et al. do; "min" charges
    min(k, N−k)^ω, the cheaper of solving the primal or the dual system (2022/712)."""
    if t > N - k:
        return math.inf
    if noise == "bernoulli":
        log_p = k * math.log2(1 - t / N)
    else:
        log_p = log2_binom(N - k, t) - log2_binom(N, t)
    dim = k if solve_dim == "k" else min(k, N - k)
    return OMEGA * math.log2(dim) - log_p


def stern_dumer(N: int, k: int, t: int, p_max: int | None = None) -> tuple[float, int, int]:
    """(log2 cost, p, l) of the cheapest Stern–Dumer ISD."""
    log_all = log2_binom(N, t)
    best = (math.inf, 0, 0)
    p_max = t if p_max is None else min(p_max, t)
    for p in range(0, p_max + 1, 2):
        # The optimum l balances the collision list S = L0²/2^l against L0, so l ≈ log2 L0;
        # scan a window around it wide enough to contain the minimum.
        l0_guess = log2_binom((k + 60) / 2, p / 2) if p else 0.0
        l_hi = min(N - k - (t - p) - 1, int(2 * l0_guess) + 80)
        if l_hi < 0:
            break
        ls = np.arange(0, l_hi + 1, dtype=np.float64)
        half = np.floor((k + ls) / 2)
        log_l0 = _log2_binom_vec(half, np.full_like(half, p / 2))
        log_s = 2 * log_l0 - ls
        rest = N - k - ls
        gauss_it = np.log2(rest * N / np.log2(np.maximum(rest, 2)))
        it = np.logaddexp2(gauss_it, np.logaddexp2(1 + log_l0, 1 + log_s)) + math.log2(N)
        log_succ = _log2_binom_vec(rest, np.full_like(rest, t - p)) + 2 * log_l0 - log_all
        log_succ = np.minimum(log_succ, 0.0)
        cost = it - log_succ
        i = int(np.argmin(cost))
        if cost[i] < best[0]:
            best = (float(cost[i]), p, int(ls[i]))
        elif cost[i] > best[0] + 20:
            break  # convex in p: past the minimum
    return best


def prange(N: int, k: int, t: int) -> float:
    if t > N - k:
        return math.inf
    rest = N - k
    it = math.log2(rest * N / math.log2(max(rest, 2))) + math.log2(N)
    return it - (log2_binom(N - k, t) - log2_binom(N, t))


def statistical_decoding(N: int, k: int, t: int, field: str = "f2") -> float:
    if N - k - t <= 0:
        return math.inf  # no parity check of weight k+1 can miss every noise position
    if field == "f2":
        return math.log2(k + 1) + 2 * t * math.log2((N - t + 1) / (N - k - t))
    return math.log2(k + 1) + 2 * (log2_binom(N, t) - log2_binom(N - k - 1, t))


def ring_to_f2_weight(t: int, lam: int) -> int:
    """Expected F_2 noise weight after reducing LPN over Z_{2^λ} (uniform nonzero noise) mod 2."""
    return min(t, int(t * 2 ** (lam - 1) / (2**lam - 1)) + 1)


def estimate(N: int, k: int, t: int, ring: str = "f2", lam: int = 32) -> dict[str, float]:
    """log2 cost of each attack on LPN(N, k, t) over `ring`: "f2", "fq" (large field) or "z2k"
    (Z_{2^lam}, uniform nonzero noise values)."""
    field = "fq" if ring == "fq" else "f2"
    w = ring_to_f2_weight(t, lam) if ring == "z2k" else t
    out = {
        "gauss": gauss(N, k, w),
        "prange": prange(N, k, w),
        "statistical-decoding": statistical_decoding(N, k, w, field),
    }
    if field == "f2":
        out["stern-dumer"] = stern_dumer(N, k, w)[0]
    return out


def dual_estimate(n: int, N: int, t: int, ring: str = "z2k", lam: int = 32) -> dict[str, float]:
    """Dual LPN: a t-sparse e ∈ R^N times a public N×n matrix. Same costs as LPN(N, N−n, t)."""
    return estimate(N, N - n, t, ring, lam)


def security(costs: dict[str, float], instances_log2: float = 0.0) -> float:
    """Bits of the cheapest attack when the attacker may target any of 2^instances_log2
    instances under one matrix. One Gaussian elimination on the shared matrix serves every
    instance, so Gauss and Prange gain up to the full factor (collision-based ISD gains about
    its square root, Sendrier's DOOM); the whole factor is charged."""
    return min(costs.values()) - instances_log2
