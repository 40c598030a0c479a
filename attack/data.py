"""Reading a capture: the operands the GPU saw, the ground truth kept for scoring, and the
model's public tables (what any attacker downloads with the open weights)."""

import json
from functools import cached_property
from pathlib import Path

import numpy as np


class Public:
    """A model's public side: embedding tables, norms, special tokens."""

    def __init__(self, root):
        self.dir = Path(root) / "public"
        self.meta = json.loads((self.dir / "public.json").read_text())
        self.bert = self.meta["arch"] == "bert"
        self.special = set(self.meta["special"])
        self.eps = float(self.meta["eps"])

    def _load(self, key):
        return np.load(self.dir / f"{key}.npy").astype(np.float32)

    @cached_property
    def embed(self):
        """The token embedding table (BERT: word embeddings): the IMA/ISA target."""
        return self._load("word" if self.bert else "embed")

    @cached_property
    def canonical(self):
        """Token id -> smallest id with an identical embedding row (such tokens cannot be
        told apart by anyone, so a guess of either counts)."""
        _, first, inverse = np.unique(self.embed, axis=0, return_index=True, return_inverse=True)
        return first[inverse.ravel()]

    @cached_property
    def lm_head(self):
        return self.embed if self.meta["tied_lm_head"] else self._load("lm_head")

    def gamma(self):
        """Layer 0's input norm scale."""
        return self._load("ln_weight" if self.bert else "norm_l0")

    def l0_rows(self, position=None):
        """The exact layer-0 operand row of every token: RMSNorm(E)·γ for decoders,
        LayerNorm(word + position + segment 0)·γ + β for BERT (at `position`)."""
        if not self.bert:
            return self._l0_decoder
        x = self.embed + self._load("position")[position] + self._load("token_type")[0]
        x = x - x.mean(axis=1, keepdims=True)
        x /= np.sqrt((x * x).mean(axis=1, keepdims=True) + self.eps)
        return x * self.gamma() + self._load("ln_bias")

    @cached_property
    def _l0_decoder(self):
        e = self.embed
        return e / np.sqrt((e * e).mean(axis=1, keepdims=True) + self.eps) * self.gamma()

    @cached_property
    def max_position(self):
        return self._load("position").shape[0] if self.bert else 1 << 30


class Site:
    """One phase/site of one condition: `U` per block (the attacker's view) and `H`,
    tokens (ground truth)."""

    def __init__(self, root, condition, phase, site):
        stem = Path(root) / condition / f"{phase}.{site}"
        self.ok = Path(f"{stem}.U.npy").exists()
        if not self.ok:
            return
        self.U = np.load(f"{stem}.U.npy", mmap_mode="r")
        self.H = np.load(f"{stem}.H.npy", mmap_mode="r")
        self.blocks = np.load(f"{stem}.blocks.npy")
        self.tokens = np.load(f"{stem}.tokens.npy")
        self.condition, self.phase, self.site = condition, phase, site

    def __len__(self):
        return len(self.blocks) if self.ok else 0

    def block(self, i):
        """(prompt, U_b [s×d], H_b [n×d], tokens [n], first position)."""
        p, _, u0, s, h0, n, pos0 = (int(v) for v in self.blocks[i])
        return (p, np.asarray(self.U[u0:u0 + s], dtype=np.float64), np.asarray(self.H[h0:h0 + n], dtype=np.float64),
                self.tokens[h0:h0 + n], pos0)

    def sample(self, limit, seed=0):
        """Indices of at most `limit` blocks, spread over the capture."""
        n = len(self)
        if limit is None or n <= limit:
            return list(range(n))
        return sorted(np.random.default_rng(seed).choice(n, size=limit, replace=False).tolist())
