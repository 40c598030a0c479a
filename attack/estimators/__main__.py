"""`python3 attack/estimators COMMAND`: lwe | lpn | params | speed | check (see --help)."""

import argparse
import sys
from pathlib import Path

if not __package__:
    # Run as `python3 attack/estimators`: make the folder importable as the package it is.
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    __package__ = "estimators"

from estimators import lpn, lwe, params, speed  # noqa: E402


def cmd_lwe(a):
    p = lwe.LWE(a.n, 2.0**a.log_q, a.sigma_e, a.sigma_s, a.m)
    for at in lwe.estimate(p).values():
        print(
            f"{at.name:<12} β={at.beta:<5} m={at.m:<6} d={at.d:<6} classical {at.bits:6.1f}  "
            f"quantum {at.bits_quantum:6.1f}  plausible {at.bits_plausible:6.1f}"
        )


def cmd_lpn(a):
    if a.dual:
        costs = lpn.dual_estimate(a.dual, a.N, a.t, a.ring, a.lam)
    else:
        costs = lpn.estimate(a.N, a.k, a.t, a.ring, a.lam)
    for name, bits in costs.items():
        print(f"{name:<22}{bits:8.1f}")
    print(f"{'security':<22}{lpn.security(costs, a.instances_log2):8.1f}")


def cmd_params(a):
    print(f"LWE at q = 2^64, message at 2^32, uniform error and secret (≥ {params.TARGET_BITS:.0f} bits core-SVP):")
    for d_max in a.lwe_widths:
        n, sigma, at = params.lwe_hint_n(d_max)
        print(
            f"  d ≤ {d_max:<6} B_e = {params.lwe_error_bound(d_max):<6} σ_e = {sigma:7.1f}  n = {n:<5} "
            f"{at.name} β={at.beta} → {at.bits:.1f} bits"
        )
    print(f"  ring LWE for the GPU-computed hint: N = 8192, log q = 150: {params.rlwe_hint_security():.1f} bits")
    need = params.TARGET_BITS + params.ROWS_PER_H_LOG2
    print(f"Dual LPN over Z_2^32, exact-weight noise, ≥ {need:.0f} bits (128 + log2 of 2^{params.ROWS_PER_H_LOG2} rows per H):")
    for d in a.lpn_widths:
        for c in a.expansions:
            t, costs = params.dual_lpn_t(d, c)
            cs = "  ".join(f"{k} {v:.1f}" for k, v in costs.items())
            print(f"  d = {d:<6} N = {c}·d  t = {t:<4} {cs}")


def cmd_speed(a):
    hw = speed.hardware_from(a)
    print(speed.model_summary(a.expansion, a.noise))
    print()
    print(speed.table(hw, a.expansion, a.noise))


def cmd_check(a):
    from estimators import test_reproduce

    tests = [getattr(test_reproduce, n) for n in dir(test_reproduce) if n.startswith("test_")]
    failed = 0
    for t in tests:
        try:
            t()
            print(f"ok    {t.__name__}")
        except AssertionError as e:
            failed += 1
            print(f"FAIL  {t.__name__}: {e}")
    print(f"{len(tests) - failed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


def main():
    ap = argparse.ArgumentParser(prog="python3 attack/estimators", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("lwe", help="core-SVP cost of the primal and dual attacks")
    p.add_argument("--n", type=int, required=True)
    p.add_argument("--log-q", type=float, required=True)
    p.add_argument("--sigma-e", type=float, required=True)
    p.add_argument("--sigma-s", type=float, default=None, help="omit for a uniform secret")
    p.add_argument("--m", type=int, default=None, help="samples available")
    p.set_defaults(f=cmd_lwe)
    p = sub.add_parser("lpn", help="attack costs for LPN(N, k, t) or dual LPN (--dual n)")
    p.add_argument("--N", type=int, required=True)
    p.add_argument("--k", type=int, default=0)
    p.add_argument("--t", type=int, required=True)
    p.add_argument("--dual", type=int, default=0, help="output length n of a dual LPN instance")
    p.add_argument("--ring", choices=["f2", "fq", "z2k"], default="f2")
    p.add_argument("--lam", type=int, default=32)
    p.add_argument("--instances-log2", type=float, default=0.0)
    p.set_defaults(f=cmd_lpn)
    p = sub.add_parser("params", help="smallest parameters per candidate at 128 bits")
    p.add_argument("--lwe-widths", type=int, nargs="*", default=[1536, 3072, 4864, 6144, 12288])
    p.add_argument("--lpn-widths", type=int, nargs="*", default=[384, 768, 2048, 4096, 12288])
    p.add_argument("--expansions", type=int, nargs="*", default=[2, 4, 8])
    p.set_defaults(f=cmd_params)
    p = sub.add_parser("speed", help="predicted time per pass against sealed")
    p.add_argument("--expansion", type=int, default=4, help="LPN code length N = expansion·d")
    p.add_argument("--noise", choices=["uniform", "odd"], default="uniform", help="LPN noise values")
    speed.add_hardware_args(p)
    p.set_defaults(f=cmd_speed)
    p = sub.add_parser("check", help="the published-number reproductions (also a pytest file)")
    p.set_defaults(f=cmd_check)
    a = ap.parse_args()
    a.f(a)


main()
