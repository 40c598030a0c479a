"""Predicted speed of each hiding candidate against the sealed CPU path.

A first-order model: every product, table read and transfer is charged at a stated rate,
and the pieces of one forward pass run one after another (one sequence is a dependency
chain: a layer's masked input exists only after the previous layer's output is unmasked).
The rates are assumptions, not measurements; `Hardware` names each with its default, and
every one can be changed from the command line.

Work per linear, for R rows of input width d and fused output width m (q/k/v share their
input, and so do gate/up, so each shares one mask):

* sealed: R·d·m int8 MACs on the CPU, the weights (d·m bytes) streamed once per batch.
* LWE with a public hint (SimplePIR-style): the TEE computes s·A (n·d) and s·(A·W) (n·m)
  per row as int8 × 64-bit products, eight byte-sliced int8 MACs each; A and A·W (64-bit,
  n·(d+m)·8 bytes) stream once per batch; the GPU does eight byte-sliced int8 GEMMs.
* LWE with the hint computed by the GPU under ring LWE (HintlessPIR / YPIR / Tiptoe
  style): the TEE encrypts s under ring LWE and decrypts the hint, about
  2ℓ·(n+m)·log2(N_r) modular products per row, plus the structured s·A (d·log2 n·3);
  the GPU computes the hint homomorphically, 2ℓ·n·m modular products per row times a
  key-switching overhead, on its CUDA cores (a pointwise product has no GEMM for tensor
  cores), and the masked product on tensor cores.
* dual LPN over Z_{2^32}: the TEE reads t rows of H (d words) and t rows of H·W (m words)
  per row at secret positions and multiplies them by 32-bit noise values: t·(d+m) 32-bit
  MACs; over a batch every table row touched is read once (at most N = c·d rows); the GPU
  does four byte-sliced int8 GEMMs.
* dual LPN with the masks precomputed in idle time: only the additions, R·(d+m) — the
  latency a request sees when the TEE has spare time to prepare masks ahead of it; under
  sustained load the mask work returns and the previous column applies.

Work common to every protection stays on the TEE: attention (QKᵀ and AV, causal halved),
norms and activations, the KV cache reads at decode.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, fields

from . import params


@dataclass
class Hardware:
    # The TEE: 16 vCPUs of an AMD EPYC Zen 4 SEV-SNP guest. AVX-512 VNNI peaks near 64 int8
    # MACs per cycle per core (about 3 TMAC/s at 3 GHz); llama.cpp-class int8 kernels reach
    # roughly a third of that: 1 TMAC/s = 2,000 GOPS.
    cpu_int8_gops: float = 2000.0
    cpu_mem_gbs: float = 100.0  # sustained DRAM bandwidth of the guest (memory encryption included)
    cpu_i32_mac_cost: float = 6.0  # a 32-bit multiply-add (vpmulld + vpaddd) in int8-MAC times
    cpu_modmul_cost: float = 16.0  # a 64-bit modular multiply-add (NTT, ring LWE) in int8-MAC times
    cpu_attn_gops: float = 1000.0  # attention in f16/f32
    cpu_elem_gops: float = 200.0  # norms, activations, residuals
    # The GPU: an H100, 990 TOPS int8 dense, of which GEMMs reach about 60 %.
    gpu_int8_tops: float = 990.0
    gpu_efficiency: float = 0.6
    gpu_mem_gbs: float = 3350.0  # HBM3
    gpu_modmul_gops: float = 6000.0  # 30-bit modular products on CUDA cores (33.5 TOPS int32 / ~5 ops)
    link_gbs: float = 50.0  # PCIe Gen5 x16, effective, through the CVM's shared bounce buffers
    call_latency_us: float = 20.0  # launch + transfer set-up + synchronisation, per linear call

    @property
    def cpu_macs(self) -> float:
        return self.cpu_int8_gops * 1e9 / 2

    @property
    def gpu_macs(self) -> float:
        return self.gpu_int8_tops * 1e12 / 2 * self.gpu_efficiency


@dataclass(frozen=True)
class Model:
    name: str
    hidden: int
    layers: int
    ffn: int
    q_heads: int
    kv_heads: int
    head_dim: int
    vocab: int  # 0: an encoder without an LM head
    gated: bool
    causal: bool

    def groups(self) -> list[tuple[int, int]]:
        """(input width d, fused output width m) of each linear of one layer."""
        q, kv = self.q_heads * self.head_dim, self.kv_heads * self.head_dim
        up = self.ffn * (2 if self.gated else 1)
        return [(self.hidden, q + 2 * kv), (q, self.hidden), (self.hidden, up), (self.ffn, self.hidden)]

    def input_widths(self) -> list[int]:
        return sorted({d for d, _ in self.groups()})


MODELS = [
    Model("MiniLM-L6", 384, 6, 1536, 12, 12, 32, 0, False, False),
    Model("BERT-base", 768, 12, 3072, 12, 12, 64, 0, False, False),
    Model("Qwen2.5-0.5B", 896, 24, 4864, 14, 2, 64, 151936, True, True),
    Model("Qwen3-1.7B", 2048, 28, 6144, 16, 8, 128, 151936, True, True),
    Model("Qwen3-8B", 4096, 36, 12288, 32, 8, 128, 151936, True, True),
]


@dataclass(frozen=True)
class Cell:
    label: str
    seqs: int  # sequences in the batch
    rows: int  # rows per sequence this step (prefill length, or 1 at decode)
    context: int  # tokens already in the KV cache (decode)


def cells(m: Model) -> list[Cell]:
    if m.vocab == 0:
        return [Cell("32×256", 32, 256, 0)]
    return [Cell("prefill 512", 1, 512, 0), Cell("decode B=1", 1, 1, 512), Cell("decode B=8", 8, 1, 512)]


# --- work shared by every protection ------------------------------------------------------


def common_time(m: Model, c: Cell, hw: Hardware) -> float:
    R = c.seqs * c.rows
    q = m.q_heads * m.head_dim
    if c.context == 0:
        pairs = c.rows * c.rows * (0.5 if m.causal else 1.0)
        attn = 2 * c.seqs * pairs * q * m.layers / (hw.cpu_attn_gops * 1e9 / 2)
    else:
        macs = 2 * R * c.context * q * m.layers
        kv_bytes = 2 * R * c.context * m.kv_heads * m.head_dim * 2 * m.layers
        attn = max(macs / (hw.cpu_attn_gops * 1e9 / 2), kv_bytes / (hw.cpu_mem_gbs * 1e9))
    elem = R * m.layers * (20 * m.hidden + 5 * m.ffn) / (hw.cpu_elem_gops * 1e9)
    return attn + elem


def _head_rows(m: Model, c: Cell) -> int:
    # Prefill needs logits for the last position only; decode for every row.
    if m.vocab == 0:
        return 0
    return c.seqs if c.context == 0 else c.seqs * c.rows


def _linears(m: Model, c: Cell):
    R = c.seqs * c.rows
    for _ in range(m.layers):
        for d, out in m.groups():
            yield R, d, out
    if m.vocab:
        yield _head_rows(m, c), m.hidden, m.vocab


# --- per-linear times ---------------------------------------------------------------------


def sealed_linear(R: int, d: int, out: int, hw: Hardware) -> float:
    return max(R * d * out / hw.cpu_macs, d * out / (hw.cpu_mem_gbs * 1e9))


def _gpu(R: int, d: int, out: int, slices: int, word: int, hw: Hardware) -> float:
    gemm = max(slices * R * d * out / hw.gpu_macs, d * out / (hw.gpu_mem_gbs * 1e9))
    link = R * (d + out) * word / (hw.link_gbs * 1e9)
    return gemm + link + hw.call_latency_us * 1e-6


def lpn_linear(R: int, d: int, out: int, t: int, expansion: int, hw: Hardware, online_only=False) -> float:
    own = 2 * R * (d + out) * 4 / (hw.cpu_mem_gbs * 1e9)  # write the masked input, read the product
    if online_only:
        tee = max(R * (d + out) * hw.cpu_i32_mac_cost / 4 / hw.cpu_macs, own)
    else:
        compute = R * t * (d + out) * hw.cpu_i32_mac_cost / hw.cpu_macs
        table_rows = min(expansion * d, R * t)
        memory = table_rows * (d + out) * 4 / (hw.cpu_mem_gbs * 1e9) + own
        tee = max(compute, memory)
    return tee + _gpu(R, d, out, 4, 4, hw)


def lwe_hint_linear(R: int, d: int, out: int, n: int, hw: Hardware) -> float:
    compute = 8 * R * n * (d + out) / hw.cpu_macs
    memory = (n * (d + out) * 8 + 2 * R * (d + out) * 8) / (hw.cpu_mem_gbs * 1e9)
    return max(compute, memory) + _gpu(R, d, out, 8, 8, hw)


HE_LIMBS = 5  # ~150-bit ciphertext modulus in 30-bit primes: plaintext 2^64 times the noise growth of n·2^64
HE_RING = 8192
HE_KEYSWITCH_OVERHEAD = 1.5


def he_hint_linear(R: int, d: int, out: int, n: int, hw: Hardware) -> float:
    log_ring = math.log2(HE_RING)
    tee_mods = R * (3 * d * math.log2(n) + 2 * HE_LIMBS * (n + out) * log_ring)
    tee = tee_mods * hw.cpu_modmul_cost / hw.cpu_macs
    # The hint's plaintext matrix A·W sits in the GPU's memory in NTT form (ℓ 32-bit words per
    # entry) and is read once per batch.
    hint = max(
        2 * HE_LIMBS * R * n * out * HE_KEYSWITCH_OVERHEAD / (hw.gpu_modmul_gops * 1e9),
        n * out * HE_LIMBS * 4 / (hw.gpu_mem_gbs * 1e9),
    )
    gemm = max(8 * R * d * out / hw.gpu_macs, d * out / (hw.gpu_mem_gbs * 1e9))
    link = R * (8 * d + 8 * out + 16 * HE_LIMBS * (n + out)) / (hw.link_gbs * 1e9)
    return tee + hint + gemm + link + hw.call_latency_us * 1e-6


# --- whole passes --------------------------------------------------------------------------


@dataclass
class Choice:
    """Per-model parameters: LPN code expansion c = N/d and weight t per input width; LWE n."""

    expansion: int
    lpn_t: dict[int, int]
    lwe_n: int


def choose(m: Model, expansion: int, noise: str = "uniform") -> Choice:
    widths = m.input_widths()
    t = {d: params.dual_lpn_t(d, expansion, noise=noise)[0] for d in widths}
    n = params.lwe_hint_n(max(widths))[0]
    return Choice(expansion, t, n)


def pass_times(m: Model, c: Cell, hw: Hardware, ch: Choice) -> dict[str, float]:
    common = common_time(m, c, hw)
    out = {k: common for k in ("sealed", "lwe-hint", "he-hint", "dual-lpn", "dual-lpn-online")}
    for R, d, w in _linears(m, c):
        if R == 0:
            continue
        out["sealed"] += sealed_linear(R, d, w, hw)
        out["lwe-hint"] += lwe_hint_linear(R, d, w, ch.lwe_n, hw)
        out["he-hint"] += he_hint_linear(R, d, w, ch.lwe_n, hw)
        out["dual-lpn"] += lpn_linear(R, d, w, ch.lpn_t[d], ch.expansion, hw)
        out["dual-lpn-online"] += lpn_linear(R, d, w, ch.lpn_t[d], ch.expansion, hw, online_only=True)
    return out


def tee_per_row(m: Model, ch: Choice) -> dict[str, float]:
    """Operations the TEE does per activation row over one forward pass (int8 MACs for
    sealed; the candidates' own units), for the tables' "TEE per row" column."""
    sealed = sum(d * w for d, w in m.groups()) * m.layers
    lwe_ops = sum(ch.lwe_n * (d + w) for d, w in m.groups()) * m.layers
    lpn_ops = sum(ch.lpn_t[d] * (d + w) for d, w in m.groups()) * m.layers
    return {"sealed": sealed, "lwe-hint": lwe_ops, "dual-lpn": lpn_ops}


def lpn_table_bytes(m: Model, ch: Choice) -> float:
    """H·W for every linear (N×m words) and H for every input width (N×d words)."""
    hw_tab = sum(ch.expansion * d * w * 4 for d, w in m.groups()) * m.layers
    if m.vocab:
        hw_tab += ch.expansion * m.hidden * m.vocab * 4
    h_tab = sum(ch.expansion * d * d * 4 for d in m.input_widths())
    return hw_tab + h_tab


def lwe_table_bytes(m: Model, ch: Choice) -> float:
    per = sum(ch.lwe_n * w * 8 for _, w in m.groups()) * m.layers
    if m.vocab:
        per += ch.lwe_n * m.vocab * 8
    return per + sum(ch.lwe_n * d * 8 for d in m.input_widths())


def int8_weight_bytes(m: Model) -> float:
    return sum(d * w for d, w in m.groups()) * m.layers + m.hidden * m.vocab


COLUMNS = ["lwe-hint", "he-hint", "dual-lpn", "dual-lpn-online"]


def table(hw: Hardware, expansion: int, noise: str = "uniform") -> str:
    lines = []
    head = f"{'model':<14}{'cell':<13}{'sealed ms':>10}" + "".join(f"{c:>17}" for c in COLUMNS)
    lines.append(head)
    for m in MODELS:
        ch = choose(m, expansion, noise)
        for c in cells(m):
            t = pass_times(m, c, hw, ch)
            row = f"{m.name:<14}{c.label:<13}{t['sealed'] * 1e3:>10.1f}"
            for col in COLUMNS:
                row += f"{t[col] * 1e3:>9.1f} ({t['sealed'] / t[col]:>4.2f}×)"
            lines.append(row)
    return "\n".join(lines)


def model_summary(expansion: int, noise: str = "uniform") -> str:
    lines = [
        f"{'model':<14}{'LPN t by d':<34}{'LWE n':>6}{'int8 W GB':>10}{'LPN tables GB':>14}"
        f"{'LWE tables GB':>14}{'TEE/row sealed':>15}{'LWE':>8}{'LPN':>8}"
    ]
    for m in MODELS:
        ch = choose(m, expansion, noise)
        per = tee_per_row(m, ch)
        ts = ", ".join(f"{d}:{ch.lpn_t[d]}" for d in m.input_widths())
        lines.append(
            f"{m.name:<14}{ts:<34}{ch.lwe_n:>6}{int8_weight_bytes(m) / 1e9:>10.2f}"
            f"{lpn_table_bytes(m, ch) / 1e9:>14.1f}{lwe_table_bytes(m, ch) / 1e9:>14.1f}"
            f"{per['sealed'] / 1e6:>14.1f}M{per['lwe-hint'] / per['sealed']:>7.2f}×{per['dual-lpn'] / per['sealed']:>7.3f}×"
        )
    return "\n".join(lines)


def add_hardware_args(ap: argparse.ArgumentParser) -> None:
    for f in fields(Hardware):
        ap.add_argument("--" + f.name.replace("_", "-"), type=float, default=f.default)


def hardware_from(ns: argparse.Namespace) -> Hardware:
    return Hardware(**{f.name: getattr(ns, f.name) for f in fields(Hardware)})
