"""The estimators against published numbers: `python3 -m pytest attack/estimators` or
`python3 attack/estimators check` (the same tests, no pytest needed; attack/run.sh runs it).

Published values and their sources:

* Kyber round 3 (CRYSTALS-Kyber specification 3.01, 2021, core-SVP; the numbers come
  from the submitters' pq-crystals/security-estimates scripts): primal attack
  Kyber512 β = 405 → 118 classical / 107 quantum bits, Kyber768 β = 625 → 182 / 165,
  Kyber1024 β = 877 → 256 / 232; dual attack β = 403 / 620 / 868 → 117 / 181 / 253.
  The lattice-estimator (malb/lattice-estimator, `LWE.estimate.rough(schemes.Kyber512)`,
  same core-SVP model) gives Kyber512 primal β = 406, d = 998, 2^118.6. The spec's script
  simulates the q-vectors of the basis where this module uses the plain geometric series,
  and steps the sample count by 5: a few units of β apart is the expected disagreement.
* Boyle–Couteau–Gilboa–Ishai, "Compressing vector OLE" (CCS 2018, eprint 2019/273),
  Table 1: LPN parameters (N, k, t) for 80-bit security and the cost of the Gaussian
  elimination attack (80, 85, 94, 99, 103, 106, 108 bits) and of ISD (115, 104, 108, 112,
  117, 121, 126 bits). Their ISD column is a Prange-type estimate; this module's Prange
  charges an elimination on (N−k)×N with N-bit vector operations, 2022/712's accounting.
* Ferret (eprint 2020/924), Table 2: (N, k, t) = (10,616,092, 588,160, 1,324) and
  (10,805,248, 589,760, 1,319) chosen for 128 bits.
"""

import math
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from estimators import lpn, lwe  # noqa: E402

# (name, n, σ, samples, primal β, primal bits (classical, quantum), dual β, dual bits)
KYBER = [
    ("Kyber512", 512, math.sqrt(3 / 2), 768, 405, (118, 107), 403, (117, 106)),
    ("Kyber768", 768, 1.0, 1024, 625, (182, 165), 620, (181, 164)),
    ("Kyber1024", 1024, 1.0, 1280, 877, (256, 232), 868, (253, 230)),
]
BETA_TOL = 4  # block sizes
BITS_TOL = 1.5  # the spec floors its bits; ours are unrounded

BCGI18 = [
    # (N, k, t, Gaussian elimination bits, ISD bits)
    (2**10, 652, 57, 80, 115),
    (2**12, 1589, 98, 85, 104),
    (2**14, 3482, 198, 94, 108),
    (2**16, 7391, 389, 99, 112),
    (2**18, 15336, 760, 103, 117),
    (2**20, 32771, 1419, 106, 121),
    (2**22, 67440, 2735, 108, 126),
]
GAUSS_TOL = 1.0
ISD_TOL = 2.5

FERRET = [(10_616_092, 588_160, 1_324), (10_805_248, 589_760, 1_319)]


def _kyber(row):
    _, n, s, m, *_ = row
    return lwe.LWE(n, 3329, s, s, m)


def test_kyber_primal_core_svp():
    for row in KYBER:
        name, *_, beta, bits, _, _ = row
        a = lwe.primal_usvp(_kyber(row))
        assert abs(a.beta - beta) <= BETA_TOL, f"{name}: primal β {a.beta}, published {beta}"
        assert abs(a.bits - bits[0]) <= BITS_TOL, f"{name}: primal {a.bits:.1f} bits, published {bits[0]}"
        assert abs(a.bits_quantum - bits[1]) <= BITS_TOL, f"{name}: quantum {a.bits_quantum:.1f}, published {bits[1]}"


def test_kyber_dual_core_svp():
    for row in KYBER:
        name, *_, beta, bits = row
        a = lwe.dual(_kyber(row))
        assert abs(a.beta - beta) <= BETA_TOL, f"{name}: dual β {a.beta}, published {beta}"
        assert abs(a.bits - bits[0]) <= BITS_TOL, f"{name}: dual {a.bits:.1f} bits, published {bits[0]}"
        assert abs(a.bits_quantum - bits[1]) <= BITS_TOL, f"{name}: quantum {a.bits_quantum:.1f}, published {bits[1]}"


def test_kyber512_matches_lattice_estimator_rough():
    a = lwe.primal_usvp(lwe.LWE(512, 3329, math.sqrt(3 / 2), math.sqrt(3 / 2), 512))
    assert (a.beta, a.d) == (406, 998), (a.beta, a.d)
    assert abs(a.bits - 118.6) < 0.3, a.bits


def test_uniform_secret_costs_n_samples():
    # Normal form: a uniform secret is as hard as an error-shaped one with n fewer samples.
    u = lwe.primal_usvp(lwe.LWE(1024, 2.0**32, 6.4, None, 1024 + 1500))
    g = lwe.primal_usvp(lwe.LWE(1024, 2.0**32, 6.4, 6.4, 1500))
    assert (u.beta, u.m) == (g.beta, g.m)


def test_simplepir_parameters_in_core_svp():
    # SimplePIR (eprint 2022/949) states 128 bits for n = 1024, q = 2^32, σ = 6.4 from the
    # lattice-estimator's default cost model; in core-SVP the same instance is ~95 bits.
    # docs/SECURITY.md quotes this figure.
    bits = lwe.security(lwe.LWE(1024, 2.0**32, 6.4, None, 2**14))
    assert 93 <= bits <= 97, bits


def test_bcgi18_gaussian_elimination():
    for N, k, t, gauss, _ in BCGI18:
        got = lpn.gauss(N, k, t, noise="bernoulli", solve_dim="k")
        assert abs(got - gauss) <= GAUSS_TOL, f"({N},{k},{t}): {got:.1f} bits, published {gauss}"


def test_bcgi18_isd():
    for N, k, t, _, isd in BCGI18:
        got = lpn.prange(N, k, t)
        assert abs(got - isd) <= ISD_TOL, f"({N},{k},{t}): {got:.1f} bits, published {isd}"


def test_stern_dumer_beats_prange():
    for N, k, t, _, _ in BCGI18[:4]:
        assert lpn.stern_dumer(N, k, t)[0] < lpn.prange(N, k, t)


def test_ferret_parameters_reach_128():
    for N, k, t in FERRET:
        costs = lpn.estimate(N, k, t)
        assert lpn.security(costs) >= 128, (N, k, t, costs)


def test_z2k_reduces_to_f2_with_half_the_weight():
    for t in (57, 130, 1319):
        w = lpn.ring_to_f2_weight(t, 32)
        assert w == t // 2 + 1
        z = lpn.estimate(8192, 8192 - 2048, t, "z2k", 32)
        f = lpn.estimate(8192, 8192 - 2048, w, "f2")
        assert z == f
    assert lpn.ring_to_f2_weight(10, 1) == 10  # over F_2 itself nothing is lost


if __name__ == "__main__":
    import subprocess

    sys.exit(subprocess.call([sys.executable, str(Path(__file__).resolve().parent), "check"]))
