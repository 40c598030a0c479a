"""Core-SVP estimates for LWE: the primal uSVP attack and the dual (distinguishing) attack.

The model is the one of Alkim–Ducas–Pöppelmann–Schwabe (NewHope, eprint 2015/1092), which
the Kyber, Saber and FrodoKEM submissions use for their "core-SVP" numbers:

* BKZ-β reaches root-Hermite factor δ(β) = ((πβ)^{1/β} · β/(2πe))^{1/(2(β−1))} and the
  geometric series assumption (each Gram–Schmidt norm is δ^{-2} times the previous one);
* one BKZ-β tour is charged as one SVP call in dimension β: 2^{0.292β} classically
  (sieving, Becker–Ducas–Gama–Laarhoven), 2^{0.265β} quantumly; a sieve returns
  2^{0.2075β} short vectors at that price.

Primal: embed (secret, error, 1) as a short vector of a lattice of dimension d = n + m + 1
and volume q^m · ξ^n · σ, where ξ = σ_e/σ_s rescales a secret narrower than the error.
BKZ-β finds it once the projection of the target on the last β Gram–Schmidt vectors is
shorter than the β-th last Gram–Schmidt norm: σ√β ≤ δ^{2β−d−1} · Vol^{1/d}.

Dual: find a short vector (v, w) with w ≡ v·A (mod q) (dimension d = m + n, volume q^n,
the w part scaled by σ_s/σ_e); ⟨v, b⟩ − ⟨w, s⟩ = ⟨v, e⟩ is then a Gaussian of width
τ = ℓσ_e/q modulo 1 instead of uniform, which a test tells apart with advantage
ε = exp(−2π²τ²); about 1/ε² samples are needed, of which one sieve call yields 2^{0.2075β},
so the attack repeats the reduction max(1, ε^{-2} · 2^{-0.2075β}) times.

Both attacks are optimised over β and the number of samples m ≤ the number available.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

CLASSICAL = math.log2(math.sqrt(3 / 2))  # 0.2925: BDGL16 sieve
QUANTUM = math.log2(math.sqrt(13 / 9))  # 0.2653: Laarhoven's quantum sieve
PLAUSIBLE = math.log2(math.sqrt(4 / 3))  # 0.2075: the "paranoid" lower bound, also the sieve's output count
SIEVE_OUTPUT = PLAUSIBLE


def delta(beta: float) -> float:
    """Root-Hermite factor of BKZ-β (valid for β ≳ 50, the only range the attacks here reach)."""
    return ((math.pi * beta) ** (1 / beta) * beta / (2 * math.pi * math.e)) ** (1 / (2 * (beta - 1)))


@dataclass(frozen=True)
class LWE:
    """An LWE instance: dimension n, modulus q, error and secret standard deviations, samples m.

    A secret that is uniform mod q is handled as the attacker would: n samples turn it into
    a secret distributed like the error (normal form), leaving m − n samples."""

    n: int
    q: float
    sigma_e: float
    sigma_s: float | None = None  # None: uniform secret mod q
    m: int | None = None  # available samples; None: as many as the attack wants

    def normal_form(self) -> "LWE":
        if self.sigma_s is not None:
            return self
        m = None if self.m is None else self.m - self.n
        return LWE(self.n, self.q, self.sigma_e, self.sigma_e, m)


@dataclass(frozen=True)
class Attack:
    name: str
    beta: int
    m: int  # samples used
    d: int  # lattice dimension
    bits: float  # classical core-SVP cost, log2
    bits_quantum: float
    bits_plausible: float


def _max_m(p: LWE) -> int:
    # Beyond a few times n extra samples never help: the optimum sits near √(n log q / log δ).
    cap = 8 * p.n
    return cap if p.m is None else min(p.m, cap)


def primal_usvp(p: LWE) -> Attack:
    """Smallest β at which BKZ-β recovers the secret by uSVP, and the m it uses."""
    p = p.normal_form()
    xi = max(1.0, p.sigma_e / p.sigma_s)
    lq, ls = math.log(p.q), math.log(p.sigma_e)
    ms = np.arange(1, _max_m(p) + 1, dtype=np.float64)
    d = p.n + ms + 1
    log_vol = ms * lq + p.n * math.log(xi) + ls

    def ok(beta: int):
        # log of rhs − lhs for every m: success where it is ≥ 0 (and the lattice is at least β wide).
        lhs = ls + 0.5 * math.log(beta)
        rhs = (2 * beta - d - 1) * math.log(delta(beta)) + log_vol / d
        good = (rhs >= lhs) & (d >= beta)
        return np.nonzero(good)[0]

    beta = _smallest_beta(lambda b: ok(b).size > 0, p)
    m = int(ms[ok(beta)[0]])
    return _attack("primal-usvp", beta, m, p.n + m + 1)


def dual(p: LWE) -> Attack:
    """Cheapest (β, m) for the dual distinguishing attack, repetitions included."""
    p = p.normal_form()
    c = min(1.0, p.sigma_s / p.sigma_e)  # weight of the secret part of the short vector
    ms = np.arange(1, _max_m(p) + 1, dtype=np.float64)
    d = ms + p.n
    log_vol = p.n * (math.log(p.q) + math.log(c))
    best = None
    for beta in range(50, 3 * p.n + 1):
        core = beta * CLASSICAL
        if best is not None and core > best.bits:
            break
        # Shortest vector BKZ-β finds: δ^{d−1} · Vol^{1/d}; its distinguishing advantage.
        log_l = (d - 1) * math.log(delta(beta)) + log_vol / d
        log_tau = log_l + math.log(p.sigma_e) - math.log(p.q)
        # Past τ ≈ e^{10} the advantage is 2^{-10^9}: cap the exponent instead of overflowing.
        log2_eps = -2 * math.pi**2 * np.exp(2 * np.minimum(log_tau, 10.0)) / math.log(2)
        reps = np.maximum(0.0, -2 * log2_eps - beta * SIEVE_OUTPUT)
        i = int(np.argmin(reps))
        bits = core + reps[i]
        if best is None or bits < best.bits:
            best = _attack("dual", beta, int(ms[i]), int(d[i]), extra=float(reps[i]))
    assert best is not None
    return best


def _smallest_beta(success, p: LWE) -> int:
    lo, hi = 50, 50
    while not success(hi):
        lo, hi = hi, hi * 2
        if hi > 8 * (p.n + _max_m(p)):
            raise ValueError("no block size up to the lattice dimension succeeds")
    # success is monotone in β: a larger block size reduces better.
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if success(mid):
            hi = mid
        else:
            lo = mid
    return hi if not success(lo) else lo


def _attack(name: str, beta: int, m: int, d: int, extra: float = 0.0) -> Attack:
    return Attack(
        name,
        beta,
        m,
        d,
        beta * CLASSICAL + extra,
        beta * QUANTUM + extra,
        beta * PLAUSIBLE + extra,
    )


def estimate(p: LWE) -> dict[str, Attack]:
    return {"primal-usvp": primal_usvp(p), "dual": dual(p)}


def security(p: LWE) -> float:
    """Classical core-SVP bits of the cheaper attack."""
    return min(a.bits for a in estimate(p).values())
