"""A step-time model: how long one scheduler step takes, from what it computes.

The simulator has no model to run, so it needs time from somewhere. One step of continuous batching
runs every scheduled token through the model's linear layers (which read all the weights once) and
through attention (which reads every cached K and V of every decoding sequence once). Each part is
a *roofline* (Williams et al., 2009): it takes the longer of its compute time (FLOPs / peak FLOP/s)
and its memory time (bytes / memory bandwidth):

    linear    = max(tokens * flops_per_token / peak_flops,  param_bytes / bandwidth)
    attention = max(pairs * attn_flops_per_pair / peak_flops,  kv_tokens * kv_bytes_per_token / bandwidth)
    step      = step_overhead + seqs * seq_overhead + linear + attention + kv_blocks * block_cost

- tokens: prefill tokens + one per decoding sequence;
- pairs: (query, key) pairs attention scores (a prefill of q new tokens ending at context c has
  q*c - q*(q-1)/2 of them; a decode with context c has c);
- kv_tokens: cached tokens the decodes read (their contexts; a prefill computes its K and V in
  place, and its attention is bound by its pairs);
- kv_blocks: KV blocks the paged kernel walks (0 for a contiguous kernel). ``block_cost`` is the
  price of indirection: block-table reads, a branch per block, variable lengths. PagedAttention
  paper §7.1 measured its kernel 20-26% slower than FasterTransformer's contiguous one; the presets
  put the 23% middle at block size 16 (block_cost = 0.23 * 16 * the memory time of one token's KV).

At batch 1 a decode is bound by reading the weights (OPT-13B: 26 GB at 1.555 TB/s, about 17 ms);
it stays there while the batch grows, until tokens * flops_per_token reaches the compute roof
(about 200 tokens on an A100): why batching is nearly free, and why memory is throughput.

Swapping (paper §4.5, §7.3): a step that swaps blocks between the GPU and the CPU also waits for
the copies, one per block, layer and K/V (vLLM's ``swap_blocks`` issues a ``cudaMemcpyAsync`` for
each), over PCIe:

    swap = swap_blocks * swap_copy + swap_slots * swap_token

- swap_copy: the fixed cost of one block's copies (2 * layers of them, ``copy_overhead`` each);
- swap_token: one token's K and V over the host link (kv_bytes_per_token / pcie_bandwidth).

Small blocks mean many small copies: the fixed costs dominate, and the link is poorly used.

A machine that runs compute and memory traffic one after the other (a CPU running PyTorch) is
better described by their *sum*; ``roofline=False`` adds the two sides instead of taking the max.
That is the form ``python -m engine calibrate`` fits to this machine (see ``engine/tools/calibrate.py``).

Times are in seconds. Presets describe a whole set-up (hardware + model + KV slots): the paper's
OPT-13B on one A100-40GB (15.7K slots, Table 1), Llama-3-8B on an H100, and this machine, fitted.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path

PAGED_KERNEL_SLOWDOWN = 0.23  # §7.1: 20-26% slower than a contiguous kernel
SLOWDOWN_BLOCK_SIZE = 16  # the block size at which that slowdown is put


@dataclass(frozen=True)
class Hardware:
    """Figures of one accelerator and its host. peak_flops: FLOP/s (dense, 16-bit); mem_bandwidth:
    bytes/s; step_overhead_s: fixed cost of one step (kernel launches, scheduling), s;
    seq_overhead_s: host work per scheduled sequence per step (block tables, sampling), s."""

    name: str
    peak_flops: float
    mem_bandwidth: float
    step_overhead_s: float
    seq_overhead_s: float = 0.0
    pcie_bandwidth: float = 0.0  # host <-> device, bytes/s one way (0: no swap cost modelled)
    copy_overhead_s: float = 0.0  # fixed cost of one host <-> device copy (launch + DMA set-up), s


@dataclass(frozen=True)
class ModelSpec:
    """Figures of one model: param_bytes (weights read per step), flops_per_token (2 * parameters:
    one multiply-add per weight), attn_flops_per_pair (4 * layers * query heads * head_dim: QK^T
    and PV, per query-key pair), kv_bytes_per_token (2 * layers * KV heads * head_dim * dtype bytes)."""

    name: str
    param_bytes: float
    flops_per_token: float
    attn_flops_per_pair: float
    kv_bytes_per_token: float
    num_layers: int = 0


@dataclass(frozen=True)
class StepShape:
    """What one step computes (the cost model's input).

    Attributes:
        num_prefills: sequences prefilled.
        prefill_tokens: new tokens computed by prefills (tokens).
        prefill_pairs: (query, key) pairs of the prefills' causal attention.
        num_decodes: sequences decoding one token.
        decode_context: the decodes' context lengths summed (tokens read from the KV cache).
        kv_blocks: KV blocks the paged attention kernel reads: every scheduled sequence's blocks,
            ceil(context / block_size) each (0 for a contiguous kernel).
        swap_blocks: blocks copied between the GPU and the CPU pool this step, either way.
        swap_slots: the token slots of those blocks (swap_blocks * block_size: whole blocks move).
        cached_context: tokens that prefill-shaped work reads from the KV cache before its own new
            tokens (a speculative verification's context); 0 where a prefill is taken to compute
            its K and V in place.
    """

    num_prefills: int = 0
    prefill_tokens: int = 0
    prefill_pairs: int = 0
    num_decodes: int = 0
    decode_context: int = 0
    kv_blocks: int = 0
    swap_blocks: int = 0
    swap_slots: int = 0
    cached_context: int = 0

    @property
    def num_tokens(self) -> int:
        return self.prefill_tokens + self.num_decodes

    @classmethod
    def of_batch(cls, prefills: list[tuple[int, int]], decode_context_lens: list[int], block_size: int | None) -> StepShape:
        """From a batch: ``prefills`` as (new tokens, context length after them) pairs, each decode's
        context length (tokens, its new one included), and the paged block size (None: contiguous).

        Raises:
            ValueError: a prefill with new tokens outside 1..context, or a context < 1.
        """
        for q, c in prefills:
            if not 1 <= q <= c:
                raise ValueError(f"a prefill of {q} new tokens with context {c}: need 1 <= new <= context")
        if any(c < 1 for c in decode_context_lens):
            raise ValueError("decode context lengths must be >= 1")
        contexts = [c for _, c in prefills] + list(decode_context_lens)
        blocks = sum(-(-c // block_size) for c in contexts) if block_size else 0
        return cls(
            num_prefills=len(prefills),
            prefill_tokens=sum(q for q, _ in prefills),
            prefill_pairs=sum(prefill_pairs(q, c) for q, c in prefills),
            num_decodes=len(decode_context_lens),
            decode_context=sum(decode_context_lens),
            kv_blocks=blocks,
        )


def prefill_pairs(new_tokens: int, context_len: int) -> int:
    """Causal (query, key) pairs of ``new_tokens`` queries ending at position ``context_len``:
    query i (1-based among the context) sees i keys, so sum_{i=c-q+1}^{c} i."""
    return new_tokens * context_len - new_tokens * (new_tokens - 1) // 2


@dataclass(frozen=True)
class CostModel:
    """Time coefficients of one set-up (seconds per unit), and how they combine.

    Attributes:
        name: what it describes.
        step_overhead_s: per step. seq_overhead_s: per scheduled sequence (host-side work).
        weights_s: reading the weights once (param_bytes / bandwidth).
        token_s: linear-layer compute of one token (flops_per_token / peak_flops).
        pair_s: attention compute of one (query, key) pair.
        kv_token_s: moving one token's K and V (kv_bytes_per_token / bandwidth).
        block_s: the paged kernel's cost per KV block read.
        roofline: True = max(compute, memory) per operation (an accelerator); False = their sum.
        swap_copy_s: the fixed cost of copying one block to or from the CPU (all its per-layer copies).
        swap_token_s: one token's K and V over the host link.
    """

    name: str
    step_overhead_s: float
    weights_s: float
    token_s: float
    pair_s: float
    kv_token_s: float
    block_s: float
    seq_overhead_s: float = 0.0
    roofline: bool = True
    swap_copy_s: float = 0.0
    swap_token_s: float = 0.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name.endswith("_s") and not (value >= 0 and math.isfinite(value)):
                raise ValueError(f"cost model {self.name!r}: {f.name} must be a finite time >= 0 s, got {value}")

    @classmethod
    def from_figures(cls, hardware: Hardware, model: ModelSpec, paged_slowdown: float = PAGED_KERNEL_SLOWDOWN,
                     slowdown_block_size: int = SLOWDOWN_BLOCK_SIZE) -> CostModel:
        """The roofline coefficients of ``model`` on ``hardware``; ``block_s`` makes a paged decode's
        attention ``paged_slowdown`` slower than a contiguous one at ``slowdown_block_size``."""
        kv_token_s = model.kv_bytes_per_token / hardware.mem_bandwidth
        return cls(
            name=f"{model.name} on {hardware.name}",
            step_overhead_s=hardware.step_overhead_s,
            weights_s=model.param_bytes / hardware.mem_bandwidth,
            token_s=model.flops_per_token / hardware.peak_flops,
            pair_s=model.attn_flops_per_pair / hardware.peak_flops,
            kv_token_s=kv_token_s,
            block_s=paged_slowdown * slowdown_block_size * kv_token_s,
            seq_overhead_s=hardware.seq_overhead_s,
            swap_copy_s=2 * model.num_layers * hardware.copy_overhead_s,
            swap_token_s=model.kv_bytes_per_token / hardware.pcie_bandwidth if hardware.pcie_bandwidth else 0.0,
        )

    @classmethod
    def fixed(cls, step_ms: float) -> CostModel:
        """Every step lasts ``step_ms`` ms, whatever it computes (the simulator's old clock)."""
        if not step_ms > 0:
            raise ValueError(f"step_ms must be > 0 ms, got {step_ms}")
        return cls(f"fixed {step_ms:g} ms per step", step_ms / 1e3, 0.0, 0.0, 0.0, 0.0, 0.0)

    def linear_time(self, num_tokens: int) -> float:
        compute, memory = num_tokens * self.token_s, self.weights_s
        return max(compute, memory) if self.roofline else compute + memory

    def attention_time(self, pairs: int, kv_tokens: int) -> float:
        compute, memory = pairs * self.pair_s, kv_tokens * self.kv_token_s
        return max(compute, memory) if self.roofline else compute + memory

    def step_time(self, shape: StepShape) -> float:
        """Seconds one step of ``shape`` takes (the module docstring's formula)."""
        seqs = shape.num_prefills + shape.num_decodes
        pairs = shape.prefill_pairs + shape.decode_context
        return (self.step_overhead_s + seqs * self.seq_overhead_s + self.linear_time(shape.num_tokens)
                + self.attention_time(pairs, shape.decode_context + shape.cached_context) + shape.kv_blocks * self.block_s
                + self.swap_time(shape.swap_blocks, shape.swap_slots))

    def swap_time(self, num_blocks: int, num_slots: int) -> float:
        """Seconds to copy ``num_blocks`` blocks of ``num_slots`` token slots in all between the GPU
        and the CPU pool, one way (paper §7.3)."""
        return num_blocks * self.swap_copy_s + num_slots * self.swap_token_s

    def recompute_time(self, num_tokens: int, block_size: int | None = None) -> float:
        """Seconds that recomputing ``num_tokens`` tokens (one preempted request's prefill) takes on
        its own, without the step's fixed overhead: the alternative to swapping them (paper §7.3)."""
        shape = StepShape.of_batch([(num_tokens, num_tokens)], [], block_size)
        return self.step_time(shape) - self.step_overhead_s

    def load_beats_recompute(self, num_tokens: int, block_size: int) -> bool:
        """Is loading a cached prefix of ``num_tokens`` tokens back from the CPU tier (whole blocks of
        ``block_size`` over PCIe, :meth:`swap_time`) faster than recomputing it (:meth:`recompute_time`)?
        The prefix cache's CPU tier (``engine/core/kv_offload.py``) asks the question SGLang's
        hierarchical cache and vLLM's KV offloading answer by measurement."""
        num_blocks = -(-num_tokens // block_size)
        return self.swap_time(num_blocks, num_blocks * block_size) < self.recompute_time(num_tokens, block_size)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> CostModel:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass(frozen=True)
class Setup:
    """A preset: a cost model, the KV pool it serves from (token slots) and its longest request."""

    key: str
    cost_model: CostModel
    kv_slots: int
    max_model_len: int
    description: str


# Host links: PCIe 4.0 x16 (A100) and 5.0 x16 (H100), 32 and 64 GB/s one way. The fixed cost of one
# small cudaMemcpyAsync (launch + DMA set-up) is taken as 5 us: an assumption of this model, not a
# measured figure (it is what makes small blocks expensive to swap, paper §7.3).
COPY_OVERHEAD_S = 5e-6
A100_40GB = Hardware("A100-40GB", peak_flops=312e12, mem_bandwidth=1.555e12, step_overhead_s=1e-3,
                     pcie_bandwidth=32e9, copy_overhead_s=COPY_OVERHEAD_S)
H100_SXM = Hardware("H100-SXM", peak_flops=989e12, mem_bandwidth=3.35e12, step_overhead_s=1e-3,
                    pcie_bandwidth=64e9, copy_overhead_s=COPY_OVERHEAD_S)
# OPT-13B: 40 layers, hidden 5120, 40 heads of 128, fp16; 13B parameters.
OPT_13B = ModelSpec("OPT-13B", param_bytes=26e9, flops_per_token=26e9, attn_flops_per_pair=4 * 40 * 5120,
                    kv_bytes_per_token=2 * 40 * 5120 * 2, num_layers=40)
# Llama-3-8B: 32 layers, 32 query heads and 8 KV heads of 128, bf16; 8.03B parameters.
LLAMA_3_8B = ModelSpec("Llama-3-8B", param_bytes=16.06e9, flops_per_token=16.06e9, attn_flops_per_pair=4 * 32 * 32 * 128,
                       kv_bytes_per_token=2 * 32 * 8 * 128 * 2, num_layers=32)

THIS_MACHINE = "this-machine"
CALIBRATION_FILE = "cost_model_this_machine.json"


# What the paper's system achieved rather than the A100's peak: 60% of the FLOP/s and 75% of the
# bandwidth (typical of fp16 GEMMs and decode kernels at these sizes), plus host work (2023 vLLM's
# Python scheduler, block tables, sampling): 6 ms per step and 0.28 ms per sequence. The two host
# figures are fitted to Figure 13's two vLLM batches by Little's law (requests in flight = rate x
# time per request): ShareGPT 30.42 at 2 req/s = 15 s for 338 output tokens = 45 ms per step at
# batch 30; Alpaca 132.44 at 30 req/s = 4.4 s for 58 tokens = 75 ms per step at batch 132. This
# model gives 45 ms and 71 ms. Every other number reproduce-paper prints is a prediction.
A100_40GB_ACHIEVED = Hardware("A100-40GB (achieved)", peak_flops=0.6 * 312e12, mem_bandwidth=0.75 * 1.555e12,
                              step_overhead_s=6e-3, seq_overhead_s=0.28e-3, pcie_bandwidth=0.75 * 32e9,
                              copy_overhead_s=COPY_OVERHEAD_S)


def _gpu_setups() -> dict[str, Setup]:
    # H100-80GB: 90% of its memory for weights + KV (vLLM's gpu_memory_utilization), weights 16.06 GB.
    h100_slots = int((0.9 * 80e9 - LLAMA_3_8B.param_bytes) // LLAMA_3_8B.kv_bytes_per_token)
    return {
        "a100-opt-13b": Setup("a100-opt-13b", CostModel.from_figures(A100_40GB, OPT_13B), 15_700, 2048,
                              "OPT-13B on one A100-40GB at peak figures, the paper's main set-up (Table 1: 12 GB of KV, 15.7K slots)"),
        "a100-opt-13b-achieved": Setup(
            "a100-opt-13b-achieved", CostModel.from_figures(A100_40GB_ACHIEVED, OPT_13B), 15_700, 2048,
            "OPT-13B on one A100-40GB at achieved figures (60% FLOP/s, 75% bandwidth, 6 ms per step + 0.28 ms "
            "per sequence of host work): the paper's runs"),
        "h100-llama-3-8b": Setup("h100-llama-3-8b", CostModel.from_figures(H100_SXM, LLAMA_3_8B), h100_slots, 8192,
                                 f"Llama-3-8B on one H100-80GB ({h100_slots:,} KV slots at 90% memory use)"),
    }


SETUPS = tuple(_gpu_setups()) + (THIS_MACHINE,)


def calibration_path() -> Path:
    """Where ``python -m engine calibrate`` keeps this machine's fit (the user cache)."""
    from engine.user_cache import cache_dir

    return cache_dir() / CALIBRATION_FILE


def get_setup(key: str) -> Setup:
    """A preset by key (``SETUPS``).

    Raises:
        ValueError: an unknown key, or "this-machine" before ``python -m engine calibrate`` ran.
    """
    gpu = _gpu_setups()
    if key in gpu:
        return gpu[key]
    if key != THIS_MACHINE:
        raise ValueError(f"unknown cost-model preset {key!r}; choose from {', '.join(SETUPS)}")
    path = calibration_path()
    if not path.exists():
        raise ValueError(f"no calibration of this machine yet ({path} is missing): run `python -m engine calibrate` first")
    data = json.loads(path.read_text())
    return Setup(THIS_MACHINE, CostModel.from_json(data["cost_model"]), data["kv_slots"], data["max_model_len"],
                 data.get("description", "this machine, fitted"))


PS_PER_S = 10**12


@dataclass(frozen=True)
class PicosecondCost:
    """A :class:`CostModel` in integer picoseconds, so that the simulator's clock sums exactly: a
    stretch of k decode steps costs the same whether it is summed step by step or in closed form.
    (Coefficients are rounded to 1 ps; the smallest, pair_ps on an H100, is about 530 ps.)"""

    step_ps: int
    seq_ps: int
    weights_ps: int
    token_ps: int
    pair_ps: int
    kv_ps: int
    block_ps: int
    roofline: bool
    swap_copy_ps: int = 0
    swap_token_ps: int = 0

    @classmethod
    def of(cls, model: CostModel) -> PicosecondCost:
        def ps(seconds: float) -> int:
            return round(seconds * PS_PER_S)

        return cls(ps(model.step_overhead_s), ps(model.seq_overhead_s), ps(model.weights_s), ps(model.token_s),
                   ps(model.pair_s), ps(model.kv_token_s), ps(model.block_s), model.roofline,
                   ps(model.swap_copy_s), ps(model.swap_token_s))

    def _combine(self, compute: int, memory: int) -> int:
        return max(compute, memory) if self.roofline else compute + memory

    def step(self, shape: StepShape) -> int:
        """Picoseconds of one step (as :meth:`CostModel.step_time`)."""
        linear = self._combine(shape.num_tokens * self.token_ps, self.weights_ps)
        attention = self._combine((shape.prefill_pairs + shape.decode_context) * self.pair_ps,
                                  (shape.decode_context + shape.cached_context) * self.kv_ps)
        return (self.step_ps + (shape.num_prefills + shape.num_decodes) * self.seq_ps + linear + attention
                + shape.kv_blocks * self.block_ps + shape.swap_blocks * self.swap_copy_ps + shape.swap_slots * self.swap_token_ps)

    def decode_steps(self, k: int, num_decodes: int, context_sum: int, block_sum: int) -> int:
        """Picoseconds of k decode-only steps of ``num_decodes`` sequences, given their contexts and
        KV blocks summed over the k steps. Equals the sum of :meth:`step` over them: with no prefill,
        both sides of the attention roofline are proportional to the context."""
        linear = num_decodes * self.token_ps  # combined with the weights' read as in _combine, without a call per stretch
        linear = max(linear, self.weights_ps) if self.roofline else linear + self.weights_ps
        return k * (self.step_ps + num_decodes * self.seq_ps + linear) + self._context_ps * context_sum + self.block_ps * block_sum

    @functools.cached_property
    def _context_ps(self) -> int:
        """Picoseconds per token of decode context: its attention pairs and its KV read, combined."""
        return self._combine(self.pair_ps, self.kv_ps)


# --- Speculative decoding (Leviathan et al., 2023, §3.1; engine/spec_decode/) ----------------------


def expected_tokens_per_step(alpha: float, k: int) -> float:
    """Tokens a sequence gains per speculative step with k drafts, each accepted with probability
    ``alpha`` independently, until the first rejection: 1 + alpha + ... + alpha^k =
    (1 - alpha^(k+1)) / (1 - alpha) (k + 1 at alpha = 1: every draft and the bonus token).

    Raises:
        ValueError: alpha outside [0, 1] or k < 0.
    """
    if not 0 <= alpha <= 1:
        raise ValueError(f"acceptance rate alpha must be in [0, 1], got {alpha}")
    if k < 0:
        raise ValueError(f"k must be >= 0 draft tokens, got {k}")
    return float(k + 1) if alpha == 1 else (1 - alpha ** (k + 1)) / (1 - alpha)


def speculative_step_shape(batch: int, context_len: int, k: int, block_size: int | None) -> StepShape:
    """A verification step: each of ``batch`` sequences with ``context_len`` tokens cached scores
    its newest token and k drafts, k + 1 query tokens over its paged context (the prefill path)."""
    if k == 0:
        return StepShape.of_batch([], [context_len + 1] * batch, block_size)
    shape = StepShape.of_batch([(k + 1, context_len + k + 1)] * batch, [], block_size)
    return dataclasses.replace(shape, cached_context=batch * context_len)
