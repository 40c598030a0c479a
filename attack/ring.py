"""The `dual-lpn` protection's operands: every linear's input row reaches the engine as
words over Z_{2^32}, `u = x_q + e·H mod 2^32` (x_q the int8 row, e a t-sparse secret, H the
public code; docs/SECURITY.md, "Computational hiding"). This module reads them for the
attacks, tests them against uniform words, and gates that every attack is at chance.

How the attacks read a word (each gets its best shot):
* `signed` (every attack): the word as a two's-complement int32. Without the mask (e = 0)
  this is exactly x_q, the activation row up to its scale (each row is read at unit RMS),
  so every attack of the harness applies unchanged; the control column LPN0 (the captured rows' x_q, sent as the executor
  would send them with e = 0) checks that the attacks read it.
* `byte` (the token attacks NN, IMA, ISA, LM-head argmax and the row-space test, best of
  both readings): the low byte as an int8. x_q lives in the low byte (the upper three are
  its sign extension), so a mask that left the low byte alone would leave x_q there.
* the unsigned value carries nothing `signed` does not (it differs by 2^32 on half of the
  range), and the bytes and bits one at a time are what the uniformity test reads.

Chance is what the same attack scores on uniform words of the same shapes (`uniform`,
drawn here), or 0 for token recovery."""

import json
from pathlib import Path

import numpy as np
from scipy import stats

import attacks as A
from data import Site

COND = "dual-lpn"
# The same capture with the mask taken off: x_q as words (the control).
CONTROL = "dual-lpn/e=0"
CONDITIONS = (COND, CONTROL)
LABELS = ["LPN", "LPN·dec", "LPN·head"]
CONTROL_LABELS = ["LPN0", "LPN0·head"]
COLUMNS = [("LPN", "prefill", COND), ("LPN·dec", "decode", COND), ("LPN·head", "lm_head", COND),
           ("LPN0", "prefill", CONTROL), ("LPN0·head", "lm_head", CONTROL)]
# What runs on the control: enough to show the readings carry x_q when it is there.
CONTROL_ATTACKS = {"NN", "IMA", "LM-head argmax", "Row-space test", "Uniformity"}
# Attacks whose result is a token recovery rate (chance ≈ 0): ≤ 0.10, as the production gate.
TOKEN = {"NN", "IMA", "ISA", "LM-head argmax", "Row-space test", "BSS→NN", "BSS→argmax", "Gram quadratic form",
         "Gram top eigenvectors", "Gram quadratic form (deep probe)", "Gram top eigenvectors (deep probe)",
         "Repeated content"}
# Token attacks read both ways; the rest read `signed`.
BOTH_READINGS = {"NN", "IMA", "ISA", "LM-head argmax", "Row-space test"}
# Aligned |cos| results (chance: the same attack on uniform words, + 0.02 as the ICA gates).
COSINE = {"FastICA", "JADE", "Anchor ICA", "Multi-observation"}
NULL = COSINE | {"Gram identification"}


def base(cond):
    return COND if cond in CONDITIONS else cond


def read(words, reading):
    """The words as numbers, each row scaled to unit RMS: x_q carries the arbitrary scale
    127/max|h| per row, which an attacker of the unmasked words would remove; uniform words
    have equal row norms to within 1/√d, so the scaling costs the masked reading nothing."""
    words = np.asarray(words, dtype=np.uint32)
    if reading == "signed":
        x = words.view(np.int32).astype(np.float64)
    elif reading == "byte":
        x = (words & 0xFF).astype(np.uint8).view(np.int8).astype(np.float64)
    else:
        raise ValueError(reading)
    rms = np.sqrt((x * x).mean(axis=1, keepdims=True))
    return x / np.where(rms > 0, rms, 1.0)


class RingSite(Site):
    """A `dual-lpn` site read one way: `U` is the reading of the words, `words` the words."""

    def __init__(self, root, cond, phase, site, reading="signed", words=None):
        super().__init__(root, COND, phase, site)
        if not self.ok:
            return
        self.condition, self.root, self.reading = cond, root, reading
        stem = f"{root}/{COND}/{phase}.{site}"
        self.Hq = np.load(f"{stem}.Hq.npy")
        if words is None:
            # e = 0: the int8 row sign-extended, what the engine would receive unmasked.
            words = self.Hq.astype(np.int32).view(np.uint32) if cond == CONTROL else np.asarray(self.U)
        self.words = words
        self.U = read(words, reading)

    def again(self, reading=None, words=None):
        return RingSite(self.root, self.condition, self.phase, self.site, reading or self.reading,
                        self.words if words is None else words)

    def uniform(self, seed=0):
        """The same shapes, uniform words: the chance level of an attack."""
        words = np.random.default_rng(seed).integers(0, 1 << 32, size=self.words.shape, dtype=np.uint32)
        return self.again(words=words)


def open_site(root, cond, phase, site):
    return RingSite(root, cond, phase, site) if cond in CONDITIONS else Site(root, cond, phase, site)


def best(fn, site, attack):
    """`fn(site)`; on a ring site the best of the readings the attack takes."""
    if not isinstance(site, RingSite) or attack not in BOTH_READINGS:
        return fn(site)
    runs = {r: fn(site.again(reading=r)) for r in ("signed", "byte")}
    key = lambda r: max(runs[r].get("value") or 0.0, runs[r].get("order_free") or 0.0)
    top = max(runs, key=key)
    return dict(runs[top], reading=top, readings={r: runs[r].get("value") for r in runs})


def with_null(fn, site, attack):
    """`fn(site)`; on the masked ring site also on uniform words (`uniform_*`)."""
    out = fn(site)
    if isinstance(site, RingSite) and site.condition == COND and attack in NULL:
        null = fn(site.uniform(seed=len(attack)))
        out["uniform"] = null.get("value")
        out.update({f"uniform_{k}": v for k, v in null.items() if k != "value" and isinstance(v, float)})
    return out


# ---------------------------------------------------------------------------------------
# Are the words uniform?
# ---------------------------------------------------------------------------------------

def _chi2(counts):
    counts = np.asarray(counts, dtype=np.float64)
    return float(stats.chisquare(counts).pvalue)


def _ks(pvalues):
    return float(stats.kstest(pvalues, "uniform").pvalue)


def _corr_p(x, y):
    """Σ_j n·r_j² over the columns (χ²_d if x and y are independent): its p-value."""
    x = x - x.mean(axis=0)
    y = y - y.mean(axis=0)
    den = np.sqrt((x * x).sum(0) * (y * y).sum(0))
    ok = den > 0
    r = (x * y).sum(0)[ok] / den[ok]
    return float(stats.chi2.sf(len(x) * (r * r).sum(), ok.sum())) if ok.any() else 1.0


def uniformity_pvalues(words, xq):
    """p-values of tests that try to tell `words` (rows × d) from uniform words, given the
    int8 rows `xq` they mask. Every p is uniform on (0, 1) for uniform words independent of
    xq."""
    w = np.asarray(words, dtype=np.uint32)
    x = np.asarray(xq, dtype=np.int32)
    n, d = w.shape
    p = {}
    flat = w.ravel()
    for b in range(4):  # each byte position over all words
        p[f"byte {b}"] = _chi2(np.bincount((flat >> (8 * b)) & 0xFF, minlength=256))
    ones = np.array([((flat >> b) & 1).sum() for b in range(32)], dtype=np.float64)
    z = (ones - flat.size / 2) / np.sqrt(flat.size / 4)
    for b in range(32):  # each bit's balance
        p[f"bit {b}"] = float(2 * stats.norm.sf(abs(z[b])))
    # Per-column bias: each column's low and top nibble against uniform, combined over the
    # columns by Kolmogorov–Smirnov on their p-values; each column's mean (as signed).
    for name, nib in (("low", w & 0xF), ("top", w >> 28)):
        col = [_chi2(np.bincount(nib[:, j], minlength=16)) for j in range(d)]
        p[f"column {name} nibble (KS over columns)"] = _ks(col)
        p[f"column {name} nibble (worst column)"] = min(1.0, min(col) * d)
    mean = w.view(np.int32).astype(np.float64).mean(0) / (2.0 ** 32 / np.sqrt(12 * n))
    p["column means"] = float(stats.chi2.sf((mean * mean).sum(), d))
    # Dependence on the plaintext: per column, across rows, as signed words and low bytes;
    # and the joint law of the low nibbles.
    p["correlation with x_q (signed)"] = _corr_p(read(w, "signed"), x.astype(np.float64))
    p["correlation with x_q (low byte)"] = _corr_p(read(w, "byte"), x.astype(np.float64))
    table = np.bincount(((w & 0xF).astype(np.int64) * 16 + (x & 0xF)).ravel(), minlength=256).reshape(16, 16)
    table = table[table.sum(1) > 0][:, table.sum(0) > 0]
    if min(table.shape) > 1:
        p["low nibble × x_q's low nibble"] = float(stats.chi2_contingency(table).pvalue)
    # Rows whose plaintext is identical (repeated prompts; a decoder's layer-0 row of a
    # repeated token): their difference must be uniform too.
    _, first, inverse = np.unique(x, axis=0, return_index=True, return_inverse=True)
    inverse = inverse.ravel()
    twins = np.flatnonzero(np.arange(n) != first[inverse])
    if len(twins):
        diff = (w[twins].astype(np.uint64) - w[first[inverse[twins]]].astype(np.uint64)) & 0xFFFFFFFF
        diff = diff.astype(np.uint32).ravel()
        for b in range(4):
            p[f"identical rows: difference byte {b}"] = _chi2(np.bincount((diff >> (8 * b)) & 0xFF, minlength=256))
    return p


def light_mask(xq, t, seed=1):
    """x_q + e·H mod 2^32 as the executor makes it (N = 4·d, e of exactly t nonzero
    uniform values), with a noise weight t far below the real one: what the test must catch."""
    rng = np.random.default_rng(seed)
    x = np.asarray(xq, dtype=np.int64)
    n, d = x.shape
    code = rng.integers(0, 1 << 32, size=(4 * d, d), dtype=np.uint64)
    acc = x.astype(np.uint64) & 0xFFFFFFFF
    for _ in range(t):
        pos = rng.integers(0, 4 * d, size=n)
        val = rng.integers(1, 1 << 32, size=(n, 1), dtype=np.uint64)
        acc = (acc + val * code[pos]) & 0xFFFFFFFF
    return acc.astype(np.uint32)


def uniformity_attack(site, calibrate=False):
    """The words against uniform: `value` is the smallest p-value of `uniformity_pvalues`
    times their number (Bonferroni; ≥ 0.001 passes). `calibrate`: the same on uniform words
    (must pass) and on a dual-LPN mask of weight 4 (must fail, the test's power)."""
    xq = site.Hq

    def adjusted(words):
        p = uniformity_pvalues(words, xq)
        worst = min(p, key=p.get)
        return min(1.0, p[worst] * len(p)), worst, p

    value, worst, p = adjusted(site.words)
    out = dict(value=value, worst=worst, tests=len(p), rows=int(len(xq)), pvalues=p)
    if calibrate:
        out["uniform_words"] = adjusted(site.uniform(seed=99).words)[0]
        out["mask_t4"] = adjusted(light_mask(xq, 4))[0]
    return out


def repeat_attack(pub, site, groups, limit_groups=None):
    """Repeated content, on the captured passes themselves: the Grams of every pass of
    one prompt (fresh e each) averaged, minus their mean under uniform words, scored by the
    quadratic form against the layer-0 table (bag of tokens), at 1 pass and at all."""
    by_prompt = {}
    for i in range(len(site)):
        by_prompt.setdefault(int(site.blocks[i][0]), i)
    tallies, used, passes = {}, 0, 0
    for g in list(groups.values())[:limit_groups]:
        obs = [site.block(by_prompt[p]) for p in g if p in by_prompt]
        if len(obs) < 2:
            continue
        used += 1
        passes = max(passes, len(obs))
        _, _, _, toks, p0 = obs[0]
        n, d = len(toks), obs[0][1].shape[1]
        table = A.layer0_table(pub, p0, n)
        uniform = n * np.eye(d)  # E[uᵀu] of a unit-RMS row of uniform words
        for k in (1, len(obs)):
            gram = sum(u.T @ u for _, u, _, _, _ in obs[:k]) / k - uniform
            q = A._quadform_scores(gram, table)
            top = np.argsort(-q)[:4 * n + 8]
            tallies.setdefault(1 if k == 1 else "all", A.Tally(pub)).add(toks, top, q[top], positional=False)
    if not used:
        return dict(value=None, note="no repeated prompts")
    one, every = tallies[1].result()["order_free"], tallies["all"].result()["order_free"]
    return dict(value=every, order_free=every, passes_1=one, passes_all=every, passes=passes, groups=used)


# ---------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------

def subrows(attack, row, labels, fmt):
    """Extra table rows: the chance level beside each attack that has one."""
    rows = []
    if attack in NULL and any("uniform" in row.get(l, {}) for l in labels):
        rows.append(("  uniform words", "uniform"))
    if attack == "Uniformity":
        rows += [("  calibration: uniform words", "uniform_words"), ("  calibration: mask of weight 4", "mask_t4")]
    if attack == "Repeated content" and any("passes_all" in row.get(l, {}) for l in labels):
        rows.append(("  all captured passes", "passes_all"))
    return [f"  {name:28s}" + "".join(f"{fmt(row.get(l, {}).get(key)):>8s}" for l in labels) for name, key in rows]


def exposure_gate(model, meta, gate):
    """Every linear call went to the engine as one ring operand (plus the public code)."""
    if meta is None:
        gate(f"{model}: dual-lpn captured", False, "no capture")
        return
    e = meta["exposure"]
    ok = e["model_linear_calls"] > 0 and e["engine_operands"] >= e["model_linear_calls"] + e["code_operands"]
    gate(f"{model}: dual-lpn hands the engine one ring operand per linear call", ok,
         f"{e['engine_operands']} operands ({e['code_operands']} of them the public code) for "
         f"{e['model_linear_calls']} linear calls over {e['model_linear_rows']} rows")


def gates(model, res, gate, fmt):
    """Every attack at chance on the dual-lpn operands, and the controls that show the
    attacks read the words when x_q is in them."""
    v = lambda a, l, k="value": res.get(a, {}).get(l, {}).get(k)
    for attack, row in res.items():
        for l in LABELS:
            if l not in row:
                continue
            r, x = row[l], row[l].get("value")
            name = f"{model}: dual-lpn {attack} {l}"
            read = f" (reading: {r['reading']}, {', '.join(f'{k} {fmt(y)}' for k, y in r['readings'].items())})" \
                if "readings" in r else ""
            if attack in TOKEN:
                # At most a tenth of the tokens, and never less than one: a decode site of
                # six tokens (SmolLM2's LPN·dec at CI size) reads 0.167 on one lucky hit,
                # which says nothing about the words.
                free, n = r.get("order_free"), r.get("tokens")
                bound = 0.10 if not n else max(0.10, 1.0 / n)
                gate(f"{name} ≤ 0.10 (one token where fewer than ten), bag of tokens too (at chance)",
                     x is not None and x <= bound and (free is None or free <= bound),
                     f"{fmt(x)}, bag of tokens {fmt(free)}{read}" + (f", {n} tokens" if n else ""))
            elif attack in COSINE:
                u = r.get("uniform")
                ok = x is not None and u is not None and x <= u + 0.02
                detail = f"{fmt(x)} vs uniform words {fmt(u)}"
                if attack == "Multi-observation":
                    one, u1, inter = r.get("single"), r.get("uniform_single"), r.get("h_energy_in_intersection")
                    ok = ok and None not in (one, u1, inter) and one <= u1 + 0.02 and inter <= 0.10
                    detail += f"; one pass {fmt(one)} vs {fmt(u1)}; H's energy in the passes' common span {fmt(inter)}"
                gate(f"{name} ≤ uniform words + 0.02 (at chance)", ok, detail)
            elif attack == "Gram identification":
                u, c = r.get("uniform"), r.get("chance")
                ok = None not in (x, u, c) and x <= max(u, c) + 0.10
                gate(f"{name} ≤ max(uniform words, chance) + 0.10 (at chance)", ok,
                     f"{fmt(x)} vs uniform words {fmt(u)}, chance {fmt(c)}")
            elif attack == "Gram (column)":
                gate(f"{name}: rel. error ≥ 0.5 (no column Gram)", x is not None and x >= 0.5, fmt(x))
            elif attack == "Uniformity":
                gate(f"{name}: indistinguishable from uniform words (Bonferroni p ≥ 0.001)",
                     x is not None and x >= 1e-3, f"p {fmt(x)} (worst: {r.get('worst')}, {r.get('tests')} tests, "
                                                    f"{r.get('rows')} rows)")
                if "mask_t4" in r:
                    gate(f"{model}: uniformity test calibrated (uniform words pass, a mask of weight 4 fails "
                         f"at p ≤ 1e-6)", r["uniform_words"] >= 1e-3 and r["mask_t4"] <= 1e-6,
                         f"uniform words {fmt(r['uniform_words'])}, weight 4 {fmt(r['mask_t4'])}")
            else:
                gate(f"{name} has a chance rule", False, "an attack this module does not classify")
    # The controls run wherever their masked column did. One int8 scale per row costs the
    # learned inverter and the LM head a few points where a row has outlier coordinates
    # (SmolLM2: IMA 0.93, LM-head argmax 0.96 on x_q, 1.000 on f32), hence their lower bars;
    # chance is 0 for both.
    for attack, label, key, bound, masked in (("NN", "LPN0", "value", 0.95, "LPN"),
                                              ("IMA", "LPN0", "value", 0.80, "LPN"),
                                              ("Row-space test", "LPN0", "order_free", 0.95, "LPN"),
                                              ("LM-head argmax", "LPN0·head", "value", 0.90, "LPN·head")):
        if masked in res.get(attack, {}):
            x = v(attack, label, key)
            gate(f"{model}: control {attack} {label} (words with e = 0) ≥ {bound}", x is not None and x >= bound,
                 fmt(x))
    for label, masked in zip(CONTROL_LABELS, ("LPN", "LPN·head")):
        if masked in res.get("Uniformity", {}):
            x = v("Uniformity", label)
            gate(f"{model}: control uniformity test rejects the words with e = 0 ({label}, p ≤ 1e-6)",
                 x is not None and x <= 1e-6, fmt(x))


def meta(root):
    """The dual-lpn capture's `meta.json`, or None."""
    path = Path(root) / COND / "meta.json"
    return json.loads(path.read_text()) if path.exists() else None
