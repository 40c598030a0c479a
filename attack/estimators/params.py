"""The smallest parameters each candidate needs at a target security, from `lwe` and `lpn`.

Exactness fixes the rings. Activations and weights are int8 (|x|, |w| ≤ 127), so one output
of a linear with input width d is an integer below d·127² in magnitude, and the masks must
let the TEE recover it exactly:

* Dual LPN over Z_{2^32}: (x + e·H)·W − e·(H·W) = x·W in Z_{2^32}, exact while
  d·127² < 2^31 (d < 133,000): every shape here.
* LWE over Z_{2^64} with the message in the top half (Δ = 2^32):
  (s·A + e + Δx)·W − s·(A·W) = e·W + Δ·x·W; rounding by Δ returns x·W when
  |e·W| < 2^31, i.e. when the error bound B_e satisfies B_e · 127 · d < 2^31 (worst case
  over any int8 W). A wider error makes LWE harder, so each model takes the widest error its
  largest input width allows, uniform on [−B_e, B_e] (σ = B_e/√3), and a secret uniform on
  [−127, 127] so that s·A and s·(A·W) are int8 × 64-bit products (eight byte-sliced int8
  GEMMs on the CPU's VNNI units).

Security target: 128 bits classical. For LPN the attacker may attack any of the Q rows
masked under one public H; Gaussian elimination and Prange gain up to a factor Q from that
(one elimination serves every instance), so the LPN costs must clear 128 + log2 Q with
Q = 2^20 rows per H, and H is redrawn after 2^20 rows (H·W is public: the GPU computes it
and the TEE checks it with Freivalds). LWE uses the single-instance core-SVP estimate, as
the Kyber, FrodoKEM and SimplePIR analyses do.
"""

from __future__ import annotations

import functools
import math

from . import lpn, lwe

TARGET_BITS = 128.0
ROWS_PER_H_LOG2 = 20
LPN_LAMBDA = 32


def lwe_error_bound(d_max: int) -> int:
    return (2**31 - 1) // (127 * d_max)


@functools.lru_cache(maxsize=None)
def lwe_hint_n(d_max: int, target: float = TARGET_BITS) -> tuple[int, float, lwe.Attack]:
    """Smallest LWE dimension n (a multiple of 64) at q = 2^64 reaching `target` bits, the
    error as wide as exactness for input widths up to d_max allows. Returns (n, σ_e, attack)."""
    b_e = lwe_error_bound(d_max)
    sigma_e = b_e / math.sqrt(3)
    sigma_s = 127 / math.sqrt(3)

    def sec(n: int) -> float:
        return lwe.security(lwe.LWE(n, 2.0**64, sigma_e, sigma_s, None))

    lo, hi = 1, 1
    while sec(64 * hi) < target:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if sec(64 * mid) >= target:
            hi = mid
        else:
            lo = mid
    n = 64 * hi
    p = lwe.LWE(n, 2.0**64, sigma_e, sigma_s, None)
    best = min(lwe.estimate(p).values(), key=lambda a: a.bits)
    return n, sigma_e, best


@functools.lru_cache(maxsize=None)
def dual_lpn_t(
    d: int, expansion: int, target: float = TARGET_BITS, noise: str = "uniform"
) -> tuple[int, dict[str, float]]:
    """Smallest noise weight t for dual LPN over Z_{2^32} with output width d and code length
    N = expansion·d reaching `target` bits after the multi-instance margin.

    noise="uniform": nonzero values uniform in Z_{2^32} (2022/712's setting; mod 2 halves t).
    noise="odd": nonzero values odd (±1, say), so reducing mod 2 keeps all t; this prices the
    mod-2 attack only — attacks that use the values' smallness (lattice reduction on a short
    e) are not estimated here."""
    need = target + ROWS_PER_H_LOG2
    N = expansion * d
    ring = "z2k" if noise == "uniform" else "f2"

    def sec(t: int) -> float:
        return min(lpn.dual_estimate(d, N, t, ring, LPN_LAMBDA).values())

    lo, hi = 1, 2
    while sec(hi) < need:
        lo, hi = hi, hi * 2
        if hi > 4 * d:
            raise ValueError(f"no weight up to {4 * d} reaches {need} bits for d={d}, N={N}")
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if sec(mid) >= need:
            hi = mid
        else:
            lo = mid
    # Stern–Dumer's optimum moves in steps with t: check the neighbourhood is above too.
    t = hi
    while min(sec(t + 1), sec(t + 2)) < need:
        t += 1
    return t, lpn.dual_estimate(d, N, t, ring, LPN_LAMBDA)


@functools.lru_cache(maxsize=None)
def rlwe_hint_security(ring_dim: int = 8192, log_q: int = 150) -> float:
    """The ring LWE that encrypts the LWE secret when the GPU computes the hint: ternary
    secret, σ = 3.2 error, the HE standard's shape."""
    return lwe.security(lwe.LWE(ring_dim, 2.0**log_q, 3.2, math.sqrt(2 / 3), ring_dim))
