"""The attacks. Each takes what the untrusted GPU saw (`U` per sequence block), the model's
public tables, and — for scoring only — the ground truth, and returns a small dict whose
`value` is the headline number (token recovery rate, or aligned |cosine|).

Token recovery is scored two ways:
* positional (`value`, what the token gates use, as the AloePri harness did): row r
  of a block is guessed as the token of activation row r — the attack treats the rows it
  sees as if they were the plaintext rows;
* bag of tokens (`order_free`): the block's guesses, ranked by the attack's own
  confidence, top n distinct (n = activation rows, which the attacker infers from the
  operand's row count); recall of the block's distinct content tokens. Order is lost but
  the words are not: a mask that only permuted rows would fail the first and not this.
  Reported as its own row.
Special tokens ([CLS], [SEP], BOS, EOS) are never scored: they carry no prompt content.
"""

import warnings

import numpy as np
from scipy.optimize import linear_sum_assignment
from scipy.stats import ortho_group
from sklearn.decomposition import FastICA
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import RidgeCV
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from jade import jade

warnings.filterwarnings("ignore", category=ConvergenceWarning)
warnings.filterwarnings("ignore", message=".*n_components is too large.*")


def unit(x):
    x = np.asarray(x, dtype=np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-30)


def centered_unit(x):
    x = np.asarray(x, dtype=np.float64)
    return unit(x - x.mean(axis=1, keepdims=True))


# ---------------------------------------------------------------------------------------
# Scoring
# ---------------------------------------------------------------------------------------

class Tally:
    """Token recovery over many blocks, both scorings."""

    def __init__(self, pub):
        self.pub, self.pos_hit, self.pos_n, self.free_hit, self.free_n = pub, 0, 0, 0, 0

    def content(self, tokens, allowed=None):
        keep = [t for t in tokens if int(t) not in self.pub.special]
        if allowed is not None:
            keep = [t for t in keep if allowed(int(t))]
        return keep

    def add(self, tokens, guesses, conf, allowed=None, positional=True):
        """`tokens`: true tokens of the block's activation rows; `guesses`, `conf`: one per
        row the attacker saw (or per recovered component)."""
        canon = self.pub.canonical
        if positional:
            for r, t in enumerate(tokens):
                if int(t) in self.pub.special or (allowed is not None and not allowed(int(t))):
                    continue
                self.pos_n += 1
                self.pos_hit += int(r < len(guesses) and canon[int(guesses[r])] == canon[int(t)])
        truth = {int(canon[int(t)]) for t in self.content(tokens, allowed)}
        if not truth:
            return
        picked = []
        for i in np.argsort(-np.asarray(conf)):
            g = int(canon[int(guesses[i])])
            if g in self.pub.special or g in picked:
                continue
            picked.append(g)
            if len(picked) == len(tokens):
                break
        self.free_n += len(truth)
        self.free_hit += len(truth & set(picked))

    def result(self, **extra):
        pos = self.pos_hit / self.pos_n if self.pos_n else None
        free = self.free_hit / self.free_n if self.free_n else None
        value = pos if pos is not None else free
        return dict(value=value, positional=pos, order_free=free, tokens=self.free_n, **extra)


def aligned_cosine(h, comps):
    """Mean over the true rows of |corr| with the component Hungarian-matched to each."""
    c = np.abs(centered_unit(h) @ centered_unit(comps).T)
    r, k = linear_sum_assignment(-c)
    return float(c[r, k].mean())


# ---------------------------------------------------------------------------------------
# Nearest neighbour against the public tables
# ---------------------------------------------------------------------------------------

def nn_l0(pub, rows, positions, centered=False, chunk=1024):
    """Best token (and its |cosine|) for each row among the exact layer-0 rows of every
    token (BERT: at the row's assumed position). `centered`: compare centered vectors up
    to sign (for ICA components, which lose their mean and sign)."""
    rows = np.asarray(rows)
    guess = np.zeros(len(rows), dtype=np.int64)
    conf = np.zeros(len(rows), dtype=np.float32)
    prep = centered_unit if centered else unit
    groups = [(None, np.arange(len(rows)))] if not pub.bert else [
        (p, np.flatnonzero(positions == p)) for p in np.unique(positions)]
    for p, idx in groups:
        table = prep(pub.l0_rows(p)).astype(np.float32)
        for s in range(0, len(idx), chunk):
            part = idx[s:s + chunk]
            sims = prep(rows[part]).astype(np.float32) @ table.T
            if centered:
                sims = np.abs(sims)
            guess[part] = sims.argmax(axis=1)
            conf[part] = sims.max(axis=1)
    return guess, conf


def nn_attack(pub, site, limit=None):
    """NN: each operand row against the public layer-0 table (row r taken as position r)."""
    tally = Tally(pub)
    blocks = [site.block(i) for i in site.sample(limit)]
    rows = np.concatenate([u for _, u, _, _, _ in blocks])
    pos = np.concatenate([np.minimum(p0 + np.arange(len(u)), pub.max_position - 1) for _, u, _, _, p0 in blocks])
    guess, conf = nn_l0(pub, rows, pos)
    at = 0
    for _, u, _, toks, _ in blocks:
        tally.add(toks, guess[at:at + len(u)], conf[at:at + len(u)])
        at += len(u)
    return tally.result(blocks=len(blocks))


def lm_head_attack(pub, site, limit=None):
    """The LM-head operand row-wise: each row's logits against the public head, argmax."""
    tally = Tally(pub)
    w = pub.lm_head
    for i in site.sample(limit):
        _, u, _, toks, _ = site.block(i)
        logits = u.astype(np.float32) @ w.T
        z = (logits.max(1) - logits.mean(1)) / (logits.std(1) + 1e-30)
        tally.add(toks, logits.argmax(1), z)
    return tally.result()


# ---------------------------------------------------------------------------------------
# Learned inversion (IMA at layer 0, ISA deep)
# ---------------------------------------------------------------------------------------

def _h(x, salt):
    return (np.asarray(x, dtype=np.uint64) * np.uint64(2654435761) + np.uint64(salt)) % np.uint64(1000)


def inversion_attack(pub, site, limit=None):
    """Ridge regression operand row → token embedding, trained on the attacker's own
    labelled captures of the same condition (their prompts, their vocabulary: the test
    prompts and test tokens are disjoint from training by prompt and by token id), then
    nearest neighbour over the whole embedding table."""
    idx = site.sample(limit)
    test_vocab = lambda t: _h(t, 17) < 200  # ~20 % of token ids
    blocks = [site.block(i) for i in idx]
    train_x, train_t, test = [], [], []
    for p, u, h, toks, _ in blocks:
        is_test = _h(p, 91) < 300  # ~30 % of prompts
        if is_test:
            test.append((u, toks))
            continue
        for r, t in enumerate(toks):
            if int(t) not in pub.special and not test_vocab(int(t)) and r < len(u):
                train_x.append(u[r])
                train_t.append(int(t))
    if len(train_x) < 8 or not test:
        return dict(value=None, note="too few rows")
    train_x, train_t = np.asarray(train_x), np.asarray(train_t)
    table = unit(pub.embed)
    # Target: for RMSNorm models the embedding's direction, which is exactly linear in the
    # operand (RMSNorm divides each row by its own scale); for BERT the raw word vector
    # (LayerNorm also subtracts the mean and adds β, and the raw target fits better).
    best = "raw" if pub.bert else "unit"
    targets = {"raw": pub.embed[train_t], "unit": table[train_t]}
    model = make_pipeline(StandardScaler(), RidgeCV(alphas=np.logspace(-2, 5, 8)))
    model.fit(train_x, targets[best])
    tally = Tally(pub)
    for u, toks in test:
        pred = unit(model.predict(u)) @ table.T
        tally.add(toks, pred.argmax(1), pred.max(1), allowed=lambda t: bool(test_vocab(t)))
    return tally.result(train_rows=len(train_x), alpha=float(model[-1].alpha_), target=best)


# ---------------------------------------------------------------------------------------
# Blind source separation
# ---------------------------------------------------------------------------------------

def fastica(x, m, seed=0):
    ica = FastICA(n_components=m, whiten="unit-variance", fun="logcosh", max_iter=400, tol=1e-4, random_state=seed)
    return ica.fit_transform(np.asarray(x, dtype=np.float64).T).T


def rank(x):
    s = np.linalg.svd(np.asarray(x, dtype=np.float64), compute_uv=False)
    return int((s > s[0] * 1e-6).sum()) if len(s) else 0


def random_rotation(x, m, rng):
    """The no-information baseline: whitened x under a random rotation ("random
    alignment": what ICA would return if it learned nothing)."""
    from jade import whiten
    z, _ = whiten(np.asarray(x, dtype=np.float64), m)
    return ortho_group.rvs(len(z), random_state=rng) @ z if len(z) > 1 else z


def bss_attack(pub, site, method="fastica", limit=None, max_components=48):
    """FastICA or JADE on each block's U; Hungarian-aligned |cos| to the true rows."""
    rng = np.random.default_rng(5)
    cos, base = [], []
    for i in site.sample(limit, seed=3):
        _, u, h, _, _ = site.block(i)
        m = min(rank(u), max_components)
        if m < 1:
            continue
        comps = fastica(u, m) if method == "fastica" else jade(u.astype(np.float64), m)
        cos.append(aligned_cosine(h, comps))
        base.append(aligned_cosine(h, random_rotation(u, m, rng)))
    return dict(value=float(np.mean(cos)) if cos else None, random=float(np.mean(base)) if base else None,
                blocks=len(cos))


def anchor_attack(pub, site, limit=None, fraction=0.25):
    """BSS with anchors: the attacker knows the plaintext of the first quarter of each
    block's rows (a known template or system prompt). Each anchor h_a = a·U for the unknown
    row a of Aᵀ, so least squares gives those rows; projecting them out of U leaves a mixture
    of the remaining rows and shields, which FastICA separates."""
    cos = []
    for i in site.sample(limit, seed=4):
        _, u, h, _, _ = site.block(i)
        n = len(h)
        k = max(1, int(round(fraction * n)))
        if n - k < 1:
            continue
        w, *_ = np.linalg.lstsq(u.T, h[:k].T, rcond=None)  # s × k
        q, _ = np.linalg.qr(w)
        rest = u - q @ (q.T @ u)
        m = rank(rest)
        if m < 1:
            continue
        cos.append(aligned_cosine(h[k:], fastica(rest, min(m, 48))))
    return dict(value=float(np.mean(cos)) if cos else None, blocks=len(cos), anchors=fraction)


def bss_nn_attack(pub, site, limit=None):
    """BSS→NN: unmix U with FastICA, then look every component up (up to sign and scale)
    in the public layer-0 table (BERT: at every position the block covers). At decode
    shapes a block is one real row and Gaussian shield rows: ICA singles out the only
    non-Gaussian source."""
    blocks = []
    for i in site.sample(limit, seed=6):
        _, u, _, toks, p0 = site.block(i)
        m = min(rank(u), 48)
        if m >= 1:
            comps = fastica(u, m) if m > 1 else u - u.mean(1, keepdims=True)
            blocks.append((toks, p0, comps))
    if not blocks:
        return dict(value=None)
    rows = np.concatenate([c for _, _, c in blocks])
    owner = np.concatenate([np.full(len(c), b) for b, (_, _, c) in enumerate(blocks)])
    best_g, best_c = np.zeros(len(rows), dtype=np.int64), np.full(len(rows), -1.0)
    if pub.bert:
        # Each table is built once per position; a component is tried at the positions of
        # its own block.
        lo = np.array([blocks[b][1] for b in owner])
        hi = lo + np.array([len(blocks[b][0]) for b in owner])
        for p in range(int(lo.min()), int(hi.max())):
            idx = np.flatnonzero((lo <= p) & (p < hi))
            g, c = nn_l0(pub, rows[idx], np.full(len(idx), p), centered=True)
            better = c > best_c[idx]
            best_g[idx[better]], best_c[idx[better]] = g[better], c[better]
    else:
        best_g, best_c = nn_l0(pub, rows, None, centered=True)
    tally = Tally(pub)
    for b, (toks, _, _) in enumerate(blocks):
        sel = owner == b
        tally.add(toks, best_g[sel], best_c[sel], positional=False)
    return tally.result()


def lm_head_bss_attack(pub, site, limit=None, reference=None):
    """BSS at the LM-head shape: FastICA on U, then the component (and sign) closest to a
    typical final hidden state — `reference`, the mean of final hidden states the attacker
    computes by running the public model on its own text — is taken as the hidden row, and
    its logits against the public head name the next token. Without a reference, the most
    peaked logits decide."""
    tally = Tally(pub)
    w = pub.lm_head
    for i in site.sample(limit, seed=7):
        _, u, _, toks, _ = site.block(i)
        m = rank(u)
        if m > 1:
            # The unmixing applied to U itself, not to its centred copy: logits need the
            # row's mean, which centring throws away.
            ica = FastICA(n_components=m, whiten="unit-variance", fun="logcosh", max_iter=400, tol=1e-4,
                          random_state=0).fit(np.asarray(u, dtype=np.float64).T)
            comps = ica.components_ @ u
        else:
            comps = u
        cands = np.concatenate([comps, -comps]).astype(np.float32)
        logits = cands @ w.T
        if reference is None:
            score = (logits.max(1) - logits.mean(1)) / (logits.std(1) + 1e-30)
        else:
            score = unit(cands) @ unit(reference[None, :])[0]
        tally.add(toks, logits.argmax(1), score, positional=False)
    return tally.result()


# ---------------------------------------------------------------------------------------
# The row-space test
# ---------------------------------------------------------------------------------------

def span_attack(pub, site, limit=None):
    """Row-space membership. U = A·[H; S] with A invertible, so every row of H lies in the
    row space of U (dimension s, usually far below d). At layer 0 the rows are known
    functions of the token: test every vocabulary entry for membership and keep the best.
    BERT's LayerNorm adds per-row shift and scale, and the position: span(U) is widened by
    the directions γ, β, γ⊙segment and γ⊙position_p (p < n), then the word vector γ⊙w_v is
    tested."""
    tally = Tally(pub)
    gamma = pub.gamma()
    if pub.bert:
        cand = unit(pub.embed * gamma)
        extra_fixed = [gamma, pub._load("ln_bias"), gamma * pub._load("token_type")[0]]
        pos_table = pub._load("position")
    else:
        cand = unit(pub.embed * gamma)
    margins = []
    for i in site.sample(limit, seed=8):
        _, u, _, toks, p0 = site.block(i)
        basis = [u]
        if pub.bert:
            n = len(toks)
            basis.append(np.stack(extra_fixed))
            basis.append(gamma * pos_table[p0:p0 + n])
        b = np.concatenate(basis).astype(np.float64)
        q, sv, _ = np.linalg.svd(b.T, full_matrices=False)
        q = q[:, sv > sv[0] * 1e-7].astype(np.float32)
        frac = np.linalg.norm(cand @ q, axis=1)
        order = np.argsort(-frac)[:4 * len(toks) + 8]
        tally.add(toks, order, frac[order], positional=False)
        truth = [int(t) for t in toks if int(t) not in pub.special]
        if truth:
            others = np.ones(len(frac), bool)
            others[truth] = False
            margins.append((float(frac[truth].mean()), float(frac[others].max())))
    out = tally.result()
    if margins:
        out["true_fraction"] = float(np.mean([a for a, _ in margins]))
        out["best_other_fraction"] = float(np.mean([b for _, b in margins]))
    return out


# ---------------------------------------------------------------------------------------
# Gram structure
# ---------------------------------------------------------------------------------------

def gram_attack(pub, site, limit=None):
    """What the Gram matrices give away.
    * column Gram: ‖UᵀU − HᵀH‖/‖HᵀH‖ (0 = the engine sees HᵀH exactly: the C1 leak);
    * row Gram: ‖G_U/‖G_U‖ − G_H/‖G_H‖‖ on the first n rows (the seed's fingerprint
      distance: 0 = identical, √2 = unrelated);
    * spectrum: distance between the normalized top-n eigenvalues of UUᵀ and HHᵀ
      (invariant to any orthogonal mask: 0 without shield rows)."""
    col, row, spec = [], [], []
    for i in site.sample(limit):
        _, u, h, _, _ = site.block(i)
        n = len(h)
        gh = np.linalg.norm(h.T @ h)
        uh = np.linalg.norm(h @ u.T) ** 2
        diff2 = np.linalg.norm(u @ u.T) ** 2 + gh ** 2 - 2 * uh
        col.append(np.sqrt(max(diff2, 0.0)) / gh)
        gu_n, gh_n = (u @ u.T)[:n, :n], h @ h.T
        row.append(np.linalg.norm(gu_n / np.linalg.norm(gu_n) - gh_n / np.linalg.norm(gh_n)))
        eu = np.sort(np.linalg.eigvalsh(u @ u.T))[::-1][:n]
        eh = np.sort(np.linalg.eigvalsh(h @ h.T))[::-1]
        spec.append(np.linalg.norm(eu / np.linalg.norm(eu) - eh / np.linalg.norm(eh)))
    return dict(value=float(np.mean(col)), row_gram=float(np.mean(row)), spectrum=float(np.mean(spec)))


def gram_identify_attack(pub, site, candidates, texts, shield_rows, energy, order, limit=None):
    """Prompt identification by column Gram: the attacker holds a list of candidate
    prompts, computes each one's layer-0 states with the public model, and picks the one
    whose HᵀH (plus the expected shield term) is nearest to the observed UᵀU. Only
    candidates whose length gives the observed operand height are considered.
    `candidates`: {prompt: H}. Returns identification accuracy and its chance level."""
    cand_ids = list(candidates)
    hs = [candidates[c] for c in cand_ids]
    norms = [np.linalg.norm(h @ h.T) ** 2 for h in hs]
    hits, chance, n_eval = 0, 0.0, 0
    for i in site.sample(limit, seed=9):
        p, u, _, _, _ = site.block(i)
        s = len(u)
        uu2 = np.linalg.norm(u @ u.T) ** 2
        u2 = np.linalg.norm(u) ** 2
        d = u.shape[1]
        best, best_j, consistent = np.inf, None, set()
        for j, h, g2 in zip(cand_ids, hs, norms):
            n = len(h)
            if order(n) != s:
                continue
            consistent.add(texts[j])
            k = s - n if shield_rows else 0
            lam = k * (energy * np.linalg.norm(h, axis=1).mean()) ** 2 / d
            # ‖UᵀU − HᵀH − λI‖², expanded so that no d×d matrix is formed.
            dist = uu2 + g2 + lam * lam * d - 2 * np.linalg.norm(h @ u.T) ** 2 - 2 * lam * u2 \
                + 2 * lam * np.linalg.norm(h) ** 2
            if dist < best:
                best, best_j = dist, j
        if best_j is None:
            continue
        n_eval += 1
        hits += int(texts[best_j] == texts[p])
        chance += 1.0 / max(len(consistent), 1)
    return dict(value=hits / n_eval if n_eval else None, chance=chance / n_eval if n_eval else None, blocks=n_eval)


# ---------------------------------------------------------------------------------------
# Several observations of the same content
# ---------------------------------------------------------------------------------------

def multi_observation_attack(pub, site, groups, shield_rows, energy, limit_groups=None):
    """Groups of passes over identical prompts (each pass with its own fresh mask).
    * single: FastICA on one pass;
    * pooled: FastICA on the passes' operands side by side ([U_1 | U_2 | …]), which is one
      mixture only if the mask repeated (freshness must make pooling useless);
    * reused (simulated control): the same pooling when one Haar mask and fresh shield
      rows are applied to every pass, as a protocol that reused masks would;
    * intersection: the row spaces of the passes meet in span(H) — the shield rows are
      fresh and drop out — measured as the dimension of the common subspace and the share
      of H's energy inside it."""
    rng = np.random.default_rng(11)
    by_prompt = {}
    for i in range(len(site)):
        p = int(site.blocks[i][0])
        by_prompt.setdefault(p, i)
    single, pooled, reused, inter_dim, inter_energy, n_rows = [], [], [], [], [], []
    for g in list(groups.values())[:limit_groups]:
        obs = [site.block(by_prompt[p]) for p in g if p in by_prompt]
        if len(obs) < 2 or len({len(o[1]) for o in obs}) != 1:
            continue
        us = [o[1] for o in obs]
        h = obs[0][2]
        s, n, d = len(us[0]), len(h), us[0].shape[1]
        m = min(rank(us[0]), 48)
        single.append(aligned_cosine(h, fastica(us[0], m)))
        comps = fastica(np.concatenate(us, axis=1), m)
        pooled.append(aligned_cosine(h, comps[:, :d]))
        a = ortho_group.rvs(s, random_state=rng) if s > 1 else np.ones((1, 1))
        sim = []
        for o in obs:
            hh = o[2]
            shield = rng.standard_normal((s - n, d))
            shield *= (energy * np.linalg.norm(hh, axis=1).mean() / np.linalg.norm(shield, axis=1, keepdims=True)) \
                if shield_rows and s > n else 0.0
            sim.append(a @ np.concatenate([hh, shield]))
        comps = fastica(np.concatenate(sim, axis=1), m)
        reused.append(aligned_cosine(h, comps[:, :d]))
        proj = np.zeros((d, d))
        for u in us:
            q, sv, _ = np.linalg.svd(u.T, full_matrices=False)
            q = q[:, sv > sv[0] * 1e-7]
            proj += q @ q.T
        vals, vecs = np.linalg.eigh(proj / len(us))
        common = vecs[:, vals > 1 - 1e-4]
        inter_dim.append(common.shape[1])
        n_rows.append(rank(h))
        inter_energy.append(float(np.linalg.norm(h @ common) / np.linalg.norm(h)))
    if not single:
        return dict(value=None, note="no repeated prompts")
    return dict(value=float(np.mean(pooled)), single=float(np.mean(single)), reused_mask=float(np.mean(reused)),
                intersection_dim=float(np.mean(inter_dim)), rank_h=float(np.mean(n_rows)),
                h_energy_in_intersection=float(np.mean(inter_energy)), groups=len(single), passes=len(obs))


def ica_calibration(n=12, d=384, seed=2026):
    """The BSS implementations on the case they are built for: independent Laplace rows
    under a Haar mask. Shows the attacks work when the data allow it."""
    rng = np.random.default_rng(seed)
    s = rng.laplace(size=(n, d))
    x = ortho_group.rvs(n, random_state=rng) @ s
    return dict(fastica=aligned_cosine(s, fastica(x, n)), jade=aligned_cosine(s, jade(x, n)))


# ---------------------------------------------------------------------------------------
# The column Gram's quadratic form and its top eigenvectors (docs/SECURITY.md, "What the
# GPU can learn"): with a Haar mask the view is a function of UᵀU = HᵀH + SᵀS alone.
# ---------------------------------------------------------------------------------------

def shield_lambda(u, n, shield_rows, energy):
    """E[SᵀS] = λ·I for the masked scheme's shield law (k Gaussian rows, each scaled to
    energy × the mean row norm of H), with that norm estimated from what the attacker sees:
    ‖U‖² = ‖H‖² + k·energy²·m² and ‖H‖² ≈ n·m²."""
    k = len(u) - n if shield_rows else 0
    if k <= 0:
        return 0.0
    m2 = float(np.linalg.norm(u) ** 2) / (n + k * energy ** 2)
    return k * energy ** 2 * m2 / u.shape[1]


def layer0_table(pub, p0=0, n=1):
    """Candidate rows for layer 0: the exact operand row of every token (BERT: at the
    block's middle position, LayerNorm rows move little with the position)."""
    return unit(pub.l0_rows(min(p0 + n // 2, pub.max_position - 1)))


def token_means(pub, site, train):
    """A learned probe for a deep layer: each token's mean hidden state over the attacker's
    own plaintext runs of the public model (`site` of the control condition, blocks of the
    prompts in `train` only). Returns (table of unit rows, token id of each row)."""
    sums, counts = {}, {}
    for i in range(len(site)):
        p, _, h, toks, _ = site.block(i)
        if p not in train:
            continue
        for row, t in zip(h, toks):
            t = int(t)
            if t in pub.special:
                continue
            sums[t] = sums.get(t, 0.0) + row
            counts[t] = counts.get(t, 0) + 1
    ids = np.array(sorted(sums), dtype=np.int64)
    if len(ids) == 0:
        return None, ids
    return unit(np.stack([sums[t] / counts[t] for t in ids])), ids


def second_moment(site, keep):
    """E[h hᵀ] over the rows of the attacker's own plaintext runs (`site` of the control
    condition, blocks whose prompt passes `keep`): the Gram a typical row adds. Subtracting
    n·E[h hᵀ] from an observed Gram removes the directions every prompt shares (decoders'
    embeddings have a few dominant ones), so what stays is what this prompt adds."""
    acc, rows = None, 0
    for i in range(len(site)):
        p, _, h, _, _ = site.block(i)
        if not keep(p):
            continue
        acc = h.T @ h if acc is None else acc + h.T @ h
        rows += len(h)
    return None if acc is None else acc / rows


def _quadform_scores(g, table, chunk=8192):
    out = np.empty(len(table), dtype=np.float32)
    g = g.astype(np.float32)
    for s in range(0, len(table), chunk):
        x = table[s:s + chunk]
        out[s:s + chunk] = np.einsum("ij,ij->i", x @ g, x)
    return out


def _excess_grams(pub, site, shield_rows, energy, limit, seed, keep, baseline):
    """Per sampled block (prompts passing `keep`): its true tokens, first position, row count
    n and the Gram the prompt adds, UᵀU − E[SᵀS] − n·E[hhᵀ] (the last term from the
    attacker's own plaintext runs, `baseline`, when given)."""
    for i in site.sample(limit, seed=seed):
        p, u, _, toks, p0 = site.block(i)
        if keep is not None and not keep(p):
            continue
        n = len(toks)
        g = u.T @ u - shield_lambda(u, n, shield_rows, energy) * np.eye(u.shape[1])
        if baseline is not None:
            g -= n * baseline
        yield toks, p0, n, g


def gram_quadform_attack(pub, site, shield_rows, energy, limit=None, table_fn=None, ids=None, allowed=None,
                         keep=None, baseline=None):
    """Quadratic form x̂ᵀ(UᵀU − E[SᵀS] − n·E[hhᵀ])x̂ against every candidate row x̂; the
    block's n (inferred from its height) best distinct tokens are the guess (bag of tokens).
    A true token adds ‖h‖²; the shield's noise gives SNR = d/(energy²·√(2k)) per operand at
    layer 0 (docs/SECURITY.md, §3)."""
    table_fn = table_fn or (lambda q0, m: layer0_table(pub, q0, m))
    tally = Tally(pub)
    for toks, p0, n, g in _excess_grams(pub, site, shield_rows, energy, limit, 21, keep, baseline):
        q = _quadform_scores(g, table_fn(p0, n))
        top = np.argsort(-q)[:4 * n + 8]
        guesses = top if ids is None else ids[top]
        tally.add(toks, guesses, q[top], allowed=allowed, positional=False)
    return tally.result()


def gram_eigvec_attack(pub, site, shield_rows, energy, limit=None, table_fn=None, ids=None, allowed=None,
                       keep=None, baseline=None):
    """Top-n eigenvectors of the same excess Gram, each matched (|cosine|) to its nearest
    candidate row; the eigenvectors are guessed tokens ranked by that cosine (bag of tokens)."""
    table_fn = table_fn or (lambda q0, m: layer0_table(pub, q0, m))
    tally = Tally(pub)
    for toks, p0, n, g in _excess_grams(pub, site, shield_rows, energy, limit, 22, keep, baseline):
        vals, vecs = np.linalg.eigh(g)
        top = vecs[:, np.argsort(-vals)[:n]].T.astype(np.float32)
        sims = np.abs(top @ table_fn(p0, n).T)
        best = sims.argmax(axis=1)
        guesses = best if ids is None else ids[best]
        tally.add(toks, guesses, sims.max(axis=1), allowed=allowed, positional=False)
    return tally.result()


def accumulation_attack(pub, site, groups, shield_rows, energy, passes=(1, 16, 256), limit_groups=None, seed=23,
                        baseline=None):
    """Repeated content: the same prompt (one system prompt) through P passes, each with a
    fresh mask and fresh shield rows. The Haar mask drops out of every UᵀU, so the attacker
    averages the P Grams, HᵀH + mean(SₚᵀSₚ), and the shield noise falls as 1/√P. The mask
    does not enter UᵀU, so the P passes are drawn with the scheme's shield law (the row
    count of the captured operand, energy × the mean row norm) on the captured H; the
    quadratic-form column checks that law against real captures at P = 1. Returns the
    quadratic-form recovery (bag of tokens) per P."""
    rng = np.random.default_rng(seed)
    by_prompt = {}
    for i in range(len(site)):
        by_prompt.setdefault(int(site.blocks[i][0]), i)
    out = {}
    tallies = {p: Tally(pub) for p in passes}
    used = 0
    for g in list(groups.values())[:limit_groups]:
        if g[0] not in by_prompt:
            continue
        _, u, h, toks, p0 = site.block(by_prompt[g[0]])
        n, d = len(h), h.shape[1]
        k = len(u) - n if shield_rows else 0
        table = layer0_table(pub, p0, n)
        norm = energy * np.linalg.norm(h, axis=1).mean()
        used += 1
        for p in passes:
            gram = h.T @ h - (0 if baseline is None else n * baseline)
            if k > 0:
                s = rng.standard_normal((p * k, d))
                s *= norm / np.linalg.norm(s, axis=1, keepdims=True)
                gram = gram + (s.T @ s) / p - (k * norm ** 2 / d) * np.eye(d)
            q = _quadform_scores(gram, table)
            top = np.argsort(-q)[:4 * n + 8]
            tallies[p].add(toks, top, q[top], positional=False)
    if not used:
        return dict(value=None, note="no repeated prompts")
    for p in passes:
        out[f"passes_{p}"] = tallies[p].result()["order_free"]
    out["value"] = out[f"passes_{passes[-1]}"]
    out["groups"] = used
    return out
