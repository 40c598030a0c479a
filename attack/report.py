"""GELO attack harness: capture what the GPU sees, attack it, print the table, check the
gates, write the JSON. Exits non-zero when a gate fails or did not run.

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
import ring as R  # noqa: E402
from data import Public, Site  # noqa: E402

MODELS = {
    "minilm": "all-minilm-l6-v2",
    "smollm2": "smollm2-135m-instruct.gguf",
    "qwen": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
}
# `prod` is the executor a model service builds by default (protocol::Protection::default),
# whatever it is; the c-conditions are the controls and the opt-in masked scheme.
PROD = "prod"
PREFILL = ["c0", "c1", "c2", "c3", "c3b"]
MASKED = ["c2", "c3", "c3b"]
# Columns of the table: (label, phase, condition).
COLUMNS = [("Prod", "prefill", PROD), ("Prod·dec", "decode", PROD), ("Prod·head", "lm_head", PROD),
           ("C0", "prefill", "c0"), ("C1", "prefill", "c1"), ("C2", "prefill", "c2"), ("C3", "prefill", "c3"),
           ("C3b", "prefill", "c3b"), ("C4·C0", "decode", "c0"), ("C4·C1", "decode", "c1"), ("C4", "decode", "c2"),
           ("C4·C3", "decode", "c3"), ("C4s", "decode", "c2s"), ("C5·C0", "lm_head", "c0"), ("C5·C1", "lm_head", "c1"),
           ("C5", "lm_head", "c2"), ("C5·C3", "lm_head", "c3"), ("C5s", "lm_head", "c2s")] + R.COLUMNS
PROD_LABELS = ["Prod", "Prod·dec", "Prod·head"]
# Shared decode-step masks (opt-in, `--decode-masks shared`): a decoder's decode steps under
# one mask for all sequences of the step.
SHARED = ["C4s", "C5s"]
DECODERS = ("smollm2", "qwen")
DECODER_MODELS = DECODERS
TOKEN_ATTACKS = ("NN", "IMA", "ISA", "LM-head argmax")
# (shield rows, energy) of each condition: the attacker knows the scheme. `prod` is read only
# if the production default ever hands the engine operands (then it is the masked default).
SHIELD = {"c0": (0, 0.0), "c1": (0, 0.0), "c2": (8, 4.0), "c3": (8, 4.0), "c3b": (8, 4.0), "c2s": (8, 4.0),
          PROD: (8, 4.0), R.COND: (0, 0.0), R.CONTROL: (0, 0.0)}
# What runs on each kind of site; a captured condition whose site is missing scores None
# for each (a gate that did not run fails).
L0_ATTACKS = ["NN", "IMA", "FastICA", "JADE", "Gram quadratic form", "Gram top eigenvectors", "Row-space test",
              "BSS→NN"]
PREFILL_ATTACKS = ["Anchor ICA", "Multi-observation", "Repeated content", "Gram (column)", "Gram identification"]
DEEP_ATTACKS = ["ISA", "Gram quadratic form (deep probe)", "Gram top eigenvectors (deep probe)"]
HEAD_ATTACKS = ["LM-head argmax", "FastICA", "BSS→argmax"]


def order_fn(cond):
    rows, _ = SHIELD[cond]
    if cond == "c3":
        return lambda n: 1 << (n + rows - 1).bit_length()
    if cond == "c3b":
        return lambda n: -(-(n + rows) // 8) * 8
    return lambda n: n + rows


def conditions(args, name):
    conds = [PROD] + (PREFILL if args.full and name != "qwen" else ["c0", "c1", "c2", "c3"]) + [R.COND]
    return conds + ["c2s"] if name in DECODERS else conds


def exposure(root):
    """What the production default handed the engine (`meta.json` of its capture)."""
    path = Path(root) / PROD / "meta.json"
    if not path.exists():
        return None
    meta = json.loads(path.read_text())
    return dict(meta["exposure"], engine_weights=meta["engine_weights"], passes=meta["passes"])


def capture(args, run, prompts_path):
    binary = args.binary
    if binary is None:
        target = Path(os.environ.get("CARGO_TARGET_DIR", HERE.parent / "target"))
        subprocess.run(["cargo", "build", "--quiet", "-p", "gelo-attack"], cwd=HERE.parent, check=True)
        binary = target / "debug" / "gelo-attack"
    models_dir = Path(args.cache).parent / "models" if args.models_dir is None else Path(args.models_dir)
    for name in args.models:
        conds = conditions(args, name)
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
        if label in R.CONTROL_LABELS and attack not in R.CONTROL_ATTACKS:
            return
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
    captured = set(conditions(args, root.name))
    # A learned probe for the deep site: each token's mean deep state over the attacker's
    # own plaintext runs (C0, training prompts only); scored on the other prompts.
    is_test = lambda p: bool(A._h(p, 91) < 300)  # the inversion attacks' split
    c0_deep = Site(root, "c0", "prefill", "deep")
    train = {int(b[0]) for b in c0_deep.blocks if not is_test(int(b[0]))} if c0_deep.ok else set()
    probe, probe_ids = A.token_means(pub, c0_deep, train) if c0_deep.ok else (None, [])
    probe_vocab = {int(t) for t in probe_ids}
    # The attacker's own plaintext second moments (training prompts), per phase and site.
    moments = {}
    for ph in ("prefill", "decode"):
        for st in ("l0", "deep"):
            c0 = Site(root, "c0", ph, st)
            moments[ph, st] = A.second_moment(c0, lambda p: not is_test(p)) if c0.ok else None

    def missing(label, attacks, why):
        for a in attacks:
            res.setdefault(a, {}).setdefault(label, dict(value=None, note=why))

    for label, phase, cond in COLUMNS:
        if R.base(cond) not in captured or (phase != "prefill" and root.name not in DECODERS):
            continue
        if cond == PROD and (exposure(root) or {}).get("engine_operands", 1) == 0:
            continue  # nothing reached the engine: gated on the exposure (gates())
        rows, energy = SHIELD[cond]
        site_phase = "decode" if phase in ("decode", "lm_head") else "prefill"
        l0 = R.open_site(root, cond, site_phase, "l0")
        deep = R.open_site(root, cond, site_phase, "deep")
        # A dual-lpn site: the best of its readings for the token attacks, and the same
        # attack on uniform words beside those whose chance level is not 0 (ring.py).
        best = lambda attack, site, fn: R.best(fn, site, attack)
        null = lambda attack, site, fn: R.with_null(fn, site, attack)
        if phase == "lm_head":
            head = R.open_site(root, cond, "decode", "lm_head")
            if not head.ok:
                missing(label, HEAD_ATTACKS, "no LM-head capture")
                continue
            put("LM-head argmax", label,
                lambda: best("LM-head argmax", head, lambda s: A.lm_head_attack(pub, s, L["nn"])))
            put("FastICA", label, lambda: null("FastICA", head, lambda s: A.bss_attack(pub, s, "fastica", L["ica"])))
            put("BSS→argmax", label, lambda: A.lm_head_bss_attack(pub, head, L["bss_dec"], reference))
            if cond in R.CONDITIONS:
                put("Uniformity", label, lambda: R.uniformity_attack(head))
            continue
        if not l0.ok:
            missing(label, L0_ATTACKS + (PREFILL_ATTACKS if phase == "prefill" else []), "no layer-0 capture")
            continue
        put("NN", label, lambda: best("NN", l0, lambda s: A.nn_attack(pub, s, L["nn"])))
        put("IMA", label, lambda: best("IMA", l0, lambda s: A.inversion_attack(pub, s, L["ridge"])))
        # The plaintext moments are in activation units; a ring operand's are not.
        m0, md = (None, None) if cond in R.CONDITIONS else (moments[site_phase, "l0"], moments[site_phase, "deep"])
        if deep.ok and probe is not None:
            put("ISA", label, lambda: best("ISA", deep, lambda s: A.inversion_attack(pub, s, L["ridge"])))
            put("Gram quadratic form (deep probe)", label, lambda: A.gram_quadform_attack(
                pub, deep, rows, energy, L["quad"], table_fn=lambda p0, n: probe, ids=probe_ids,
                allowed=lambda t: t in probe_vocab, keep=is_test, baseline=md))
            put("Gram top eigenvectors (deep probe)", label, lambda: A.gram_eigvec_attack(
                pub, deep, rows, energy, L["quad"], table_fn=lambda p0, n: probe, ids=probe_ids,
                allowed=lambda t: t in probe_vocab, keep=is_test, baseline=md))
        else:
            missing(label, DEEP_ATTACKS, "no deep capture")
        put("FastICA", label, lambda: null("FastICA", l0, lambda s: A.bss_attack(pub, s, "fastica", L["ica"])))
        put("JADE", label, lambda: null("JADE", l0, lambda s: A.bss_attack(pub, s, "jade", L["jade"])))
        put("Gram quadratic form", label, lambda: A.gram_quadform_attack(pub, l0, rows, energy, L["quad"],
                                                                          keep=is_test, baseline=m0))
        put("Gram top eigenvectors", label, lambda: A.gram_eigvec_attack(pub, l0, rows, energy, L["quad"],
                                                                         keep=is_test, baseline=m0))
        if phase == "prefill":
            put("Anchor ICA", label, lambda: null("Anchor ICA", l0, lambda s: A.anchor_attack(pub, s, L["ica"])))
            put("Multi-observation", label, lambda: null("Multi-observation", l0, lambda s: A.multi_observation_attack(
                pub, s, groups, rows, energy, limit_groups=L["groups"])))
            # The masked scheme's P passes are simulated from H under its shield law; a
            # dual-lpn pass has no such law, so its captured passes are averaged instead.
            put("Repeated content", label, lambda: R.repeat_attack(pub, l0, groups, L["accum"])
                if cond in R.CONDITIONS else A.accumulation_attack(pub, l0, groups, rows, energy,
                                                                   limit_groups=L["accum"], baseline=m0))
            put("Gram (column)", label, lambda: A.gram_attack(pub, l0, L["gram"]))
            put("Gram identification", label, lambda: null("Gram identification", l0, lambda s: A.gram_identify_attack(
                pub, s, candidates, texts, rows, energy, order_fn(cond), L["gram"])))
        if cond in R.CONDITIONS:
            calibrate = cond == R.COND and phase == "prefill"
            put("Uniformity", label, lambda: R.uniformity_attack(l0, calibrate=calibrate))
        put("Row-space test", label, lambda: best("Row-space test", l0, lambda s: A.span_attack(pub, s, L["span"])))
        put("BSS→NN", label, lambda: A.bss_nn_attack(pub, l0, L["bss_nn" if phase == "prefill" else "bss_dec"]))
    return res


def fmt(v):
    if v is None:
        return "—"
    if isinstance(v, float) and (v < 0.001 and v != 0):
        return f"{v:.0e}"
    return f"{v:.3f}"


def table(results, exposures):
    lines = []
    for model, res in results.items():
        if model in exposures:
            e = exposures[model]
            lines.append(f"\n{model}, production default: " + (
                "no capture" if e is None else
                f"the engine received {e['engine_operands']} operands and {e['engine_weights']} weights; the model "
                f"made {e['model_linear_calls']} linear calls over {e['model_linear_rows']} activation rows"))
        labels = [c[0] for c in COLUMNS if any(c[0] in r for r in res.values())]
        lines.append(f"\n{model}")
        head = f"  {'attack':28s}" + "".join(f"{l:>8s}" for l in labels)
        lines.append(head)
        for attack, row in res.items():
            lines.append(f"  {attack:28s}" + "".join(f"{fmt(row.get(l, {}).get('value')):>8s}" for l in labels))
            if attack in TOKEN_ATTACKS:
                lines.append(f"  {'  bag of tokens':28s}" + "".join(
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
            if attack == "Repeated content":
                for p in (1, 16, 256):
                    lines.append(f"  {f'  {p} passes':28s}" + "".join(
                        f"{fmt(row.get(l, {}).get(f'passes_{p}')):>8s}" for l in labels))
            if attack.startswith("Gram identification"):
                lines.append(f"  {'  chance (length only)':28s}" + "".join(
                    f"{fmt(row.get(l, {}).get('chance')):>8s}" for l in labels))
            lines.extend(R.subrows(attack, row, labels, fmt))
    return "\n".join(lines)


# The masked scheme's (opt-in) behaviour as docs/SECURITY.md states it: (attack, key, labels,
# bound, direction). "≤": the attack fails (at most the bound); "≥": the documented leak is
# there (at least the bound; the harness's attacks work, and the doc's table is current).
# Attacks whose numbers do not order the mask families (distances, shapes, leaks that both
# families have in full).
PARITY_EXEMPT = {"Gram (column)", "Multi-observation", "Row-space test", "BSS→NN", "BSS→argmax", "Gram identification",
                 "Repeated content", "Gram quadratic form", "Gram top eigenvectors", "Gram quadratic form (deep probe)",
                 "Gram top eigenvectors (deep probe)"}
MASKED_LABELS = ["C2", "C3", "C3b", "C4", "C4·C3", "C5", "C5·C3"]
DOCUMENTED = [
    ("NN", "value", MASKED_LABELS, 0.10, "≤"),
    ("IMA", "value", MASKED_LABELS, 0.10, "≤"),
    ("ISA", "value", MASKED_LABELS, 0.10, "≤"),
    ("LM-head argmax", "value", MASKED_LABELS, 0.10, "≤"),
    ("Row-space test", "order_free", ["C2", "C3", "C3b", "C4", "C4·C3", "C4s"], 0.90, "≥"),
    ("BSS→NN", "value", ["C4", "C4·C3"], 0.90, "≥"),
    ("BSS→NN", "value", ["C4s"], 0.60, "≥"),
    ("BSS→argmax", "value", ["C5", "C5·C3"], 0.40, "≥"),
    ("BSS→argmax", "value", ["C5s"], 0.15, "≥"),
    ("Gram quadratic form", "value", ["C2", "C3", "C4", "C4·C3"], 0.15, "≥"),
    ("Gram quadratic form (deep probe)", "value", ["C2", "C3", "C4", "C4·C3"], 0.15, "≥"),
    ("FastICA", "value", ["C4", "C4·C3", "C5", "C5·C3"], 0.90, "≥"),
    ("Gram identification", "value", ["C2", "C3", "C3b"], 0.90, "≥"),
]


def gates(results, calibration, exposures, lpn_meta):
    """Every attack is a gate, on every model: on the production default (the engine must
    receive nothing, or the attacks run on what it got and must fail), on the plaintext
    controls (the attacks work), and on the opt-in masked scheme (its behaviour as
    docs/SECURITY.md states it). A result that is missing fails."""
    out = []

    def gate(name, ok, detail):
        out.append(dict(gate=name, ok=bool(ok), detail=detail))

    def v(res, attack, label, key="value"):
        return res.get(attack, {}).get(label, {}).get(key)

    gate("BSS implementations calibrated (synthetic Laplace rows, Haar mask: FastICA, JADE ≥ 0.85)",
         calibration["fastica"] >= 0.85 and calibration["jade"] >= 0.85,
         f"FastICA {calibration['fastica']:.3f}, JADE {calibration['jade']:.3f}")
    for model, res in results.items():
        # 1. Every attack that was due ran.
        for attack, row in res.items():
            for label, r in row.items():
                if r.get("value") is None:
                    gate(f"{model}: {attack} {label} ran", False, r.get("note", "no result"))

        # 2. The production default.
        e = exposures.get(model)
        gate(f"{model}: production default captured", e is not None and e["model_linear_calls"] > 0,
             "no capture" if e is None else f"{e['model_linear_calls']} linear calls, {e['model_linear_rows']} rows")
        blind = e is not None and e["engine_operands"] == 0 and e["engine_weights"] == 0
        for attack, row in res.items():
            ctrl = [(l, r["value"]) for l, r in row.items() if l in ("C0", "C1", "C4·C0", "C5·C0") and
                    r.get("value") is not None]
            ctrl_txt = ", ".join(f"{l} {fmt(x)}" for l, x in ctrl) or "none"
            prod = [(l, row[l].get("value")) for l in PROD_LABELS if l in row]
            if blind:
                gate(f"{model}: {attack} on the production default has no input", True,
                     f"the engine received 0 of {e['model_linear_calls']} operands and no weight "
                     f"(its controls: {ctrl_txt})")
            elif prod:
                gate(f"{model}: {attack} on the production default ≤ 0.10",
                     all(x is not None and x <= 0.10 for _, x in prod),
                     ", ".join(f"{l} {fmt(x)}" for l, x in prod))
            elif e is not None:
                gate(f"{model}: {attack} on the production default ran", False,
                     f"the engine received {e['engine_operands']} operands that no attack read")
        if e is not None:
            gate(f"{model}: the production default hands the engine no operand and no weight", blind,
                 f"operands {e['engine_operands']}, weights {e['engine_weights']}")

        # 3. Plaintext controls: the attacks work where the data allow it.
        for attack, labels, bound in (("NN", ["C0", "C4·C0"], 0.95), ("IMA", ["C0"], 0.95),
                                      ("LM-head argmax", ["C5·C0"], 0.95), ("Row-space test", ["C0", "C1"], 0.95),
                                      ("Gram identification", ["C1"], 0.95), ("Gram quadratic form", ["C0"], 0.20),
                                      ("Gram quadratic form", ["C4·C0"], 0.95),
                                      ("Gram quadratic form (deep probe)", ["C0"], 0.30)):
            # Bag-of-tokens chance for the Gram tests is n/V (under 0.001 here): 0.20 is a
            # working attack. SmolLM2's prefill rows share a few heavy directions (γ), so its
            # exact-Gram control is 0.27 at 32 rows and 1.0 at the decode shape.
            for l in labels:
                if model not in DECODER_MODELS and l.startswith(("C4", "C5")):
                    continue
                x = v(res, attack, l) if attack != "Row-space test" else v(res, attack, l, "order_free")
                gate(f"{model}: control {attack} {l} ≥ {bound}", x is not None and x >= bound, fmt(x))
        x = v(res, "Gram (column)", "C1")
        gate(f"{model}: control C1 shows the column-Gram leak (rel. error ≤ 1e-3)", x is not None and x <= 1e-3, fmt(x))

        # 4. The opt-in masked scheme, as documented.
        for attack, key, labels, bound, way in DOCUMENTED:
            for l in labels:
                if l not in res.get(attack, {}):
                    continue  # the attack does not apply there, or a column this run did not capture
                x = v(res, attack, l, key)
                ok = x is not None and (x <= bound if way == "≤" else x >= bound)
                gate(f"{model}: masked {attack} {l} {way} {bound} (documented)", ok, fmt(x))
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
                if l not in res.get(attack, {}):
                    continue
                own = max(0.0, c0 - c0r) if c0 is not None else 0.0
                ok = x is not None and r is not None and x - r <= own + 0.02 and x - r <= 0.10
                gate(f"{model}: masked {attack} {l} at random alignment (excess ≤ plaintext's {own:.3f} + 0.02, "
                     f"and ≤ 0.10; documented)", ok, f"{fmt(x)} vs random {fmt(r)}")
        for attack, row in res.items():
            if attack in PARITY_EXEMPT:
                continue
            for a, b in (("C2", "C3"), ("C2", "C3b"), ("C4", "C4·C3"), ("C5", "C5·C3")):
                x, y = v(res, attack, a), v(res, attack, b)
                if x is not None and y is not None:
                    # One-sided: HD₃ pads to a power of two with extra shield rows, so its
                    # numbers may sit lower than Haar's; parity means "no weaker".
                    gate(f"{model}: masked {attack} {b} no weaker than {a} (≤ {a} + 0.05; documented)",
                         y <= x + 0.05, f"{fmt(y)} vs {fmt(x)} (Δ {y - x:+.3f})")
        for l in ("C2", "C3", "C3b"):
            if l in res.get("Gram (column)", {}):
                x = v(res, "Gram (column)", l)
                gate(f"{model}: masked shield hides the exact column Gram at {l} (rel. error ≥ 0.5; documented)",
                     x is not None and x >= 0.5, fmt(x))
        ctrl, x = v(res, "Repeated content", "C1", "passes_1"), v(res, "Repeated content", "C2", "passes_256")
        gate(f"{model}: masked repeated content: 256 passes of one prompt cancel the shield (≥ exact-Gram C1 − 0.05; "
             f"documented)", x is not None and ctrl is not None and x >= ctrl - 0.05, f"{fmt(x)} vs C1 {fmt(ctrl)}")
        x = v(res, "Multi-observation", "C2", "h_energy_in_intersection")
        gate(f"{model}: masked repeated passes' row spaces meet in span(H), ≥ 0.9 of its energy (documented)",
             x is not None and x >= 0.9, fmt(x))

        # 5. The dual-lpn protection (opt-in): every attack at chance, its controls working.
        R.exposure_gate(model, lpn_meta.get(model), gate)
        R.gates(model, res, gate, fmt)
    return out


def main():
    cache = Path(os.environ.get("GELO_CACHE", Path.home() / ".cache" / "gelo"))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--full", action="store_true", help="release size (≥ 512 prompts)")
    ap.add_argument("--prompts", type=int, help="corpus size")
    ap.add_argument("--models", default=None, help="comma-separated: minilm,smollm2,qwen")
    ap.add_argument("--cache", default=str(cache / "attack"))
    ap.add_argument("--models-dir", default=None)
    ap.add_argument("--data", default=str(corpus.DEFAULT_DATA),
                    help="prompt text: attack/data/scifact-prompts.json (default) or a BEIR SciFact folder")
    ap.add_argument("--binary", default=None, help="prebuilt gelo-attack (default: cargo build)")
    ap.add_argument("--skip-capture", action="store_true", help="attack an existing capture")
    ap.add_argument("--json", default=None, help="report JSON (default: <run>/report.json)")
    ap.add_argument("--verbose", action="store_true", help="print each attack as it finishes")
    args = ap.parse_args()
    args.models = (args.models or "minilm,smollm2").split(",")
    size = args.prompts or (512 if args.full else 64)
    args.max_tokens = 32
    args.decode_tokens = 8
    args.decode_prompts = 128 if args.full else 32
    # BSS blocks: the ICA gates compare means over blocks, so CI takes enough of them for a
    # standard error of a few thousandths (64 prompts: every FastICA block, 32 for JADE).
    args.limit = ({"nn": None, "ridge": None, "ica": 128, "jade": 48, "bss_nn": 32, "gram": None, "span": 128, "groups": None,
                   "quad": 200, "accum": 8, "bss_dec": 64}
                  if args.full else
                  {"nn": None, "ridge": None, "ica": 64, "jade": 32, "bss_nn": 4, "gram": None, "span": 16, "groups": 1,
                   "quad": 40, "accum": 4, "bss_dec": 32})
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
    exposures = {m: exposure(run / m) for m in args.models}
    t_total = time.time() - t0
    print(table(results, exposures))
    lpn_meta = {m: R.meta(run / m) for m in args.models}
    gate_list = gates(results, calibration, exposures, lpn_meta)
    failed = [g for g in gate_list if not g["ok"]]
    print(f"\nGates: {len(gate_list) - len(failed)} passed, {len(failed)} failed")
    for g in gate_list:
        print(f"  {'PASS' if g['ok'] else 'FAIL'}  {g['gate']}: {g['detail']}")
    report = dict(
        date=time.strftime("%Y-%m-%d"), prompts=len(prompts), models=args.models, full=args.full,
        seconds=dict(capture=round(t_capture, 1), total=round(t_total, 1)), calibration=calibration,
        exposures=exposures, results=results, gates=gate_list,
    )
    path = Path(args.json) if args.json else run / "report.json"
    path.write_text(json.dumps(report, indent=1, default=lambda o: None if isinstance(o, float) and math.isnan(o) else o))
    print(f"\nreport: {path}  ({t_total:.0f} s, capture {t_capture:.0f} s)")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
