"""GELO attack harness: capture what the GPU sees, attack it, print the table, check the
gates, write the JSON. Exits non-zero when a gate fails.

    python3 attack/report.py            # CI size: MiniLM + SmolLM2, a few dozen prompts
    python3 attack/report.py --full     # release size: ≥ 512 prompts (docs/SECURITY.md)

Captured data goes under ${GELO_CACHE:-~/.cache/gelo}/attack/<run>/ (never into git).
"""

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import attacks as A  # noqa: E402
import corpus  # noqa: E402
from data import Public, Site  # noqa: E402

MODELS = {
    "minilm": "all-minilm-l6-v2",
    "smollm2": "smollm2-135m-instruct.gguf",
    "qwen": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
}
PREFILL = ["c0", "c1", "c2", "c3", "c3b"]
MASKED = ["c2", "c3", "c3b"]
# Columns of the table: (label, phase, condition).
COLUMNS = [("C0", "prefill", "c0"), ("C1", "prefill", "c1"), ("C2", "prefill", "c2"), ("C3", "prefill", "c3"),
           ("C3b", "prefill", "c3b"), ("C4·C0", "decode", "c0"), ("C4·C1", "decode", "c1"), ("C4", "decode", "c2"),
           ("C4·C3", "decode", "c3"), ("C4s", "decode", "c2s"), ("C5·C0", "lm_head", "c0"), ("C5·C1", "lm_head", "c1"),
           ("C5", "lm_head", "c2"), ("C5·C3", "lm_head", "c3"), ("C5s", "lm_head", "c2s")]
# Shared decode-step masks (opt-in, `--decode-masks shared`): a decoder's decode steps under
# one mask for all sequences of the step. Reported and checked as findings, outside the
# issue's gates.
SHARED = ["C4s", "C5s"]
DECODERS = ("smollm2", "qwen")
TOKEN_ATTACKS = ("NN", "IMA", "ISA", "LM-head argmax")
SHIELD = {"c0": (0, 0.0), "c1": (0, 0.0), "c2": (8, 4.0), "c3": (8, 4.0), "c3b": (8, 4.0), "c2s": (8, 4.0)}


def order_fn(cond):
    rows, _ = SHIELD[cond]
    if cond == "c3":
        return lambda n: 1 << (n + rows - 1).bit_length()
    if cond == "c3b":
        return lambda n: -(-(n + rows) // 8) * 8
    return lambda n: n + rows


def capture(args, run, prompts_path):
    binary = args.binary
    if binary is None:
        target = Path(os.environ.get("CARGO_TARGET_DIR", HERE.parent / "target"))
        subprocess.run(["cargo", "build", "--quiet", "-p", "gelo-attack"], cwd=HERE.parent, check=True)
        binary = target / "debug" / "gelo-attack"
    models_dir = Path(args.cache).parent / "models" if args.models_dir is None else Path(args.models_dir)
    for name in args.models:
        conds = PREFILL if args.full and name != "qwen" else ["c0", "c1", "c2", "c3"]
        if name in DECODERS:
            conds = conds + ["c2s"]
        cmd = [str(binary), "capture", "--model", str(models_dir / MODELS[name]), "--name", name, "--prompts",
               str(prompts_path), "--out", str(run), "--conditions", ",".join(conds), "--max-tokens",
               str(args.max_tokens), "--decode-tokens", str(args.decode_tokens), "--decode-prompts",
               str(args.decode_prompts), "--down-prompts", "0"]
        subprocess.run(["nice", "-n", "10"] + cmd, check=True)


def attack_model(args, root, prompts):
    pub = Public(root)
    texts = {i: p["text"] for i, p in enumerate(prompts)}
    groups = {}
    for i, p in enumerate(prompts):
        if p["family"] == "repeat":
            groups.setdefault(p["group"], []).append(i)
    L = args.limit
    res = {}  # attack -> label -> result

    def put(attack, label, fn):
        t = time.time()
        out = fn()
        out["seconds"] = round(time.time() - t, 2)
        if args.verbose:
            print(f"  {root.name} {label:6s} {attack:28s} {out.get('value')} ({out['seconds']} s)", file=sys.stderr)
        res.setdefault(attack, {})[label] = out

    c0_l0 = Site(root, "c0", "prefill", "l0")
    candidates = {}
    for i in range(len(c0_l0)):
        p, _, h, _, _ = c0_l0.block(i)
        candidates.setdefault(p, h)
    # The attacker's own plaintext runs of the public model: a typical final hidden state.
    c0_head = Site(root, "c0", "decode", "lm_head")
    reference = np.asarray(c0_head.H, dtype=np.float64).mean(axis=0) if c0_head.ok else None
    for label, phase, cond in COLUMNS:
        site_phase = "decode" if phase in ("decode", "lm_head") else "prefill"
        l0 = Site(root, cond, site_phase, "l0")
        deep = Site(root, cond, site_phase, "deep")
        if phase == "lm_head":
            head = Site(root, cond, "decode", "lm_head")
            if not head.ok:
                continue
            put("LM-head argmax", label, lambda: A.lm_head_attack(pub, head, L["nn"]))
            put("FastICA", label, lambda: A.bss_attack(pub, head, "fastica", L["ica"]))
            put("BSS→argmax (extra)", label, lambda: A.lm_head_bss_attack(pub, head, L["bss_nn"], reference))
            continue
        if not l0.ok:
            continue
        put("NN", label, lambda: A.nn_attack(pub, l0, L["nn"]))
        put("IMA", label, lambda: A.inversion_attack(pub, l0, L["ridge"]))
        if deep.ok:
            put("ISA", label, lambda: A.inversion_attack(pub, deep, L["ridge"]))
        put("FastICA", label, lambda: A.bss_attack(pub, l0, "fastica", L["ica"]))
        put("JADE", label, lambda: A.bss_attack(pub, l0, "jade", L["jade"]))
        if phase == "prefill":
            put("Anchor ICA", label, lambda: A.anchor_attack(pub, l0, L["ica"]))
            put("Multi-observation", label, lambda: A.multi_observation_attack(pub, l0, groups, *SHIELD[cond],
                                                                                  limit_groups=L["groups"]))
            put("Gram (column)", label, lambda: A.gram_attack(pub, l0, L["gram"]))
            put("Gram identification (extra)", label, lambda: A.gram_identify_attack(
                pub, l0, candidates, texts, *SHIELD[cond], order_fn(cond), L["gram"]))
        put("Row-space test (extra)", label, lambda: A.span_attack(pub, l0, L["span"]))
        put("BSS→NN (extra)", label, lambda: A.bss_nn_attack(pub, l0, L["bss_nn"]))
    return res


def fmt(v):
    if v is None:
        return "—"
    if isinstance(v, float) and (v < 0.001 and v != 0):
        return f"{v:.0e}"
    return f"{v:.3f}"


def table(results):
    lines = []
    for model, res in results.items():
        labels = [c[0] for c in COLUMNS if any(c[0] in r for r in res.values())]
        lines.append(f"\n{model}")
        head = f"  {'attack':28s}" + "".join(f"{l:>8s}" for l in labels)
        lines.append(head)
        for attack, row in res.items():
            lines.append(f"  {attack:28s}" + "".join(f"{fmt(row.get(l, {}).get('value')):>8s}" for l in labels))
            if attack in TOKEN_ATTACKS:
                lines.append(f"  {'  bag of tokens (extra)':28s}" + "".join(
                    f"{fmt(row.get(l, {}).get('order_free')):>8s}" for l in labels))
            if attack in ("FastICA", "JADE"):
                lines.append(f"  {'  random alignment':28s}" + "".join(
                    f"{fmt(row.get(l, {}).get('random')):>8s}" for l in labels))
            if attack == "Multi-observation":
                for key, name in (("single", "  one pass"), ("reused_mask", "  reused mask (simulated)"),
                                  ("intersection_dim", "  dim ∩ row spaces"), ("rank_h", "  rank H")):
                    lines.append(f"  {name:28s}" + "".join(f"{fmt(row.get(l, {}).get(key)):>8s}" for l in labels))
            if attack == "Gram (column)":
                for key, name in (("row_gram", "  row-Gram distance"), ("spectrum", "  spectrum distance")):
                    lines.append(f"  {name:28s}" + "".join(f"{fmt(row.get(l, {}).get(key)):>8s}" for l in labels))
            if attack.startswith("Gram identification"):
                lines.append(f"  {'  chance (length only)':28s}" + "".join(
                    f"{fmt(row.get(l, {}).get('chance')):>8s}" for l in labels))
    return "\n".join(lines)


def gates(results, calibration):
    """The issue's gates (CI) and the findings of the extra attacks."""
    out, findings = [], []

    def gate(name, ok, detail):
        out.append(dict(gate=name, ok=bool(ok), detail=detail))

    def v(res, attack, label, key="value"):
        return res.get(attack, {}).get(label, {}).get(key)

    gate("BSS implementations calibrated (synthetic Laplace rows, Haar mask: FastICA, JADE ≥ 0.85)",
         calibration["fastica"] >= 0.85 and calibration["jade"] >= 0.85,
         f"FastICA {calibration['fastica']:.3f}, JADE {calibration['jade']:.3f}")
    for model, res in results.items():
        for attack, labels in (("NN", ["C0", "C4·C0"]), ("IMA", ["C0"]), ("LM-head argmax", ["C5·C0"])):
            for l in labels:
                x = v(res, attack, l)
                if x is not None:
                    gate(f"{model}: control {attack} {l} ≥ 0.95", x >= 0.95, fmt(x))
        for attack in ("NN", "IMA", "ISA", "LM-head argmax"):
            for l in ["C2", "C3", "C3b", "C4", "C4·C3", "C5", "C5·C3"]:
                x = v(res, attack, l)
                if x is not None:
                    gate(f"{model}: {attack} {l} ≤ 0.10", x <= 0.10, fmt(x))
        for attack in ("FastICA", "JADE"):
            # "At the level of random alignment". On real hidden states ICA beats a random
            # rotation by a margin that is a property of the rows, not of the mask: on the
            # plaintext operand itself (C0, nothing to unmix) MiniLM's excess is 0.050 ± 0.003
            # (64 blocks), SmolLM2's −0.04. So the gate is: no further above random alignment
            # than on the plaintext rows (+ 0.02, several standard errors at CI size), and
            # never more than 0.10 above it (a separating ICA lands 0.4–0.6 above: decode
            # shapes, calibration).
            c0, c0r = v(res, attack, "C0"), v(res, attack, "C0", "random")
            for l in ("C2", "C3", "C3b"):
                x, r = v(res, attack, l), v(res, attack, l, "random")
                if x is None or c0 is None:
                    continue
                own = max(0.0, c0 - c0r)
                gate(f"{model}: {attack} {l} at random alignment (excess ≤ plaintext's {own:.3f} + 0.02, and ≤ 0.10)",
                     x - r <= own + 0.02 and x - r <= 0.10,
                     f"{fmt(x)} vs random {fmt(r)} (excess {x - r:+.3f}); C0 {fmt(c0)} vs random {fmt(c0r)} "
                     f"(excess {c0 - c0r:+.3f})")
        for attack, row in res.items():
            if attack.endswith("(extra)") or attack in ("Gram (column)", "Multi-observation"):
                continue
            for a, b in (("C2", "C3"), ("C2", "C3b"), ("C4", "C4·C3"), ("C5", "C5·C3")):
                x, y = v(res, attack, a), v(res, attack, b)
                if x is not None and y is not None:
                    # One-sided: HD₃ pads to a power of two with extra shield rows, so its
                    # numbers may sit lower than Haar's; parity means "no weaker".
                    gate(f"{model}: {attack} {b} no weaker than {a} (≤ {a} + 0.05)", y <= x + 0.05,
                         f"{fmt(y)} vs {fmt(x)} (Δ {y - x:+.3f})")
        x = v(res, "Gram (column)", "C1")
        if x is not None:
            gate(f"{model}: C1 shows the column-Gram leak (rel. error ≤ 1e-3)", x <= 1e-3, fmt(x))
        for l in ("C2", "C3", "C3b"):
            x = v(res, "Gram (column)", l)
            if x is not None:
                gate(f"{model}: shield closes the column-Gram leak at {l} (rel. error ≥ 0.5)", x >= 0.5, fmt(x))

        # Findings: the extra attacks and the shapes the gates do not cover.
        masked = ["C2", "C3", "C3b", "C4", "C4·C3", "C5", "C5·C3"] + SHARED
        for attack in ("Row-space test (extra)", "BSS→NN (extra)", "BSS→argmax (extra)"):
            for l in masked:
                x = v(res, attack, l)
                if x is not None and x > 0.10:
                    findings.append(f"{model}: {attack[:-8]} recovers {100 * x:.1f} % of tokens at {l}")
        for attack in TOKEN_ATTACKS:
            for l in masked:
                x = v(res, attack, l, "order_free")
                if x is not None and x > 0.10:
                    findings.append(f"{model}: {attack} as a bag of tokens recovers {100 * x:.1f} % of the "
                                    f"distinct tokens at {l}")
        for l in ["C2", "C3", "C3b"]:
            x, c = v(res, "Gram identification (extra)", l), v(res, "Gram identification (extra)", l, "chance")
            if x is not None and x > c + 0.10:
                findings.append(f"{model}: Gram identification picks the right prompt {100 * x:.1f} % of the time "
                                f"at {l} (chance {100 * c:.1f} %)")
        for attack in TOKEN_ATTACKS:
            for l in SHARED:
                x = v(res, attack, l)
                if x is not None and x > 0.10:
                    findings.append(f"{model}: {attack} recovers {100 * x:.1f} % of tokens at {l} "
                                    f"(shared decode masks; C4/C5 gate at 0.10)")
        for l in ["C4", "C4·C3", "C5", "C5·C3"] + SHARED:
            x, r = v(res, "FastICA", l), v(res, "FastICA", l, "random")
            if x is not None and x > r + 0.10:
                findings.append(f"{model}: FastICA separates the real row at {l}: |cos| {x:.3f} (random {r:.3f})")
        for l in ["C2", "C3", "C3b"]:
            x, single = v(res, "Multi-observation", l), v(res, "Multi-observation", l, "single")
            if x is not None and x > single + 0.05:
                findings.append(f"{model}: pooling fresh-mask passes of one prompt helps FastICA at {l}: "
                                f"|cos| {x:.3f} pooled vs {single:.3f} one pass")
        for l in ["C2", "C3", "C3b"]:
            row = res.get("Multi-observation", {}).get(l, {})
            if row.get("intersection_dim") is not None and row.get("h_energy_in_intersection", 0) > 0.9:
                findings.append(
                    f"{model}: repeated prompts at {l}: the passes' row spaces meet in a "
                    f"{row['intersection_dim']:.0f}-dim subspace holding {100 * row['h_energy_in_intersection']:.0f} % "
                    f"of H (rank {row['rank_h']:.0f}); fresh shield rows cancel out")
    return out, findings


def main():
    cache = Path(os.environ.get("GELO_CACHE", Path.home() / ".cache" / "gelo"))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--full", action="store_true", help="release size (≥ 512 prompts)")
    ap.add_argument("--prompts", type=int, help="corpus size")
    ap.add_argument("--models", default=None, help="comma-separated: minilm,smollm2,qwen")
    ap.add_argument("--cache", default=str(cache / "attack"))
    ap.add_argument("--models-dir", default=None)
    ap.add_argument("--data", default=str(HERE.parent.parent / "shared" / "data" / "scifact"))
    ap.add_argument("--binary", default=None, help="prebuilt gelo-attack (default: cargo build)")
    ap.add_argument("--skip-capture", action="store_true", help="attack an existing capture")
    ap.add_argument("--json", default=None, help="report JSON (default: <run>/report.json)")
    ap.add_argument("--verbose", action="store_true", help="print each attack as it finishes")
    ap.add_argument("--strict", action="store_true", help="findings of the extra attacks fail the run too")
    args = ap.parse_args()
    args.models = (args.models or "minilm,smollm2").split(",")
    size = args.prompts or (512 if args.full else 64)
    args.max_tokens = 32
    args.decode_tokens = 8
    args.decode_prompts = 128 if args.full else 16
    # BSS blocks: the ICA gates compare means over blocks, so CI takes enough of them for a
    # standard error of a few thousandths (64 prompts: every FastICA block, 32 for JADE).
    args.limit = ({"nn": None, "ridge": None, "ica": 128, "jade": 48, "bss_nn": 32, "gram": None, "span": 128, "groups": None}
                  if args.full else
                  {"nn": None, "ridge": None, "ica": 64, "jade": 32, "bss_nn": 4, "gram": None, "span": 16, "groups": 1})
    run = Path(args.cache) / ("full" if args.full else "ci")
    run.mkdir(parents=True, exist_ok=True)
    prompts = corpus.build(args.data, size, repeats=(4, 8) if args.full else (2, 4), similar=8 if args.full else 4)
    prompts_path = run / "prompts.jsonl"
    corpus.write(prompts_path, prompts)

    t0 = time.time()
    if not args.skip_capture:
        capture(args, run, prompts_path)
    t_capture = time.time() - t0
    calibration = A.ica_calibration()
    results = {m: attack_model(args, run / m, prompts) for m in args.models}
    t_total = time.time() - t0
    print(table(results))
    gate_list, findings = gates(results, calibration)
    failed = [g for g in gate_list if not g["ok"]]
    print(f"\nGates (the issue's; CI): {len(gate_list) - len(failed)} passed, {len(failed)} failed")
    for g in gate_list:
        print(f"  {'PASS' if g['ok'] else 'FAIL'}  {g['gate']}: {g['detail']}")
    print(f"\nFindings (extra attacks and shapes outside the gates): {len(findings)}")
    for f in findings:
        print(f"  FINDING  {f}")
    report = dict(
        date=time.strftime("%Y-%m-%d"), prompts=len(prompts), models=args.models, full=args.full,
        seconds=dict(capture=round(t_capture, 1), total=round(t_total, 1)), calibration=calibration,
        results=results, gates=gate_list, findings=findings,
    )
    path = Path(args.json) if args.json else run / "report.json"
    path.write_text(json.dumps(report, indent=1, default=lambda o: None if isinstance(o, float) and math.isnan(o) else o))
    print(f"\nreport: {path}  ({t_total:.0f} s, capture {t_capture:.0f} s)")
    bad = bool(failed) or (args.strict and findings)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
