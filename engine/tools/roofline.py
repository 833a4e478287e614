"""How far a decode step is from what the machine allows: the roofline model (Williams, Waterman and
Patterson, "Roofline", CACM 2009), for one decode step of the engine.

A step must at least read its bytes from memory and do its arithmetic, so it cannot be faster than

    roofline = max(bytes read / memory bandwidth, FLOPs / matmul peak)

- bytes read: every weight the step multiplies by (all of them, once per step whatever the batch: the
  layers' projections, the norms, the LM head; the embedding table only as the LM head when tied),
  plus each request's K and V over its whole context, in every layer (:func:`decode_step_cost`);
- FLOPs: 2 per multiply-add: batch x the weights' elements, and the attention's q.k and p.v over each
  context (4 x num_heads x head_dim per context token per layer);
- the bandwidth and the peak are measured on this machine when asked (:func:`measure_machine`): a
  STREAM-like copy of a buffer far larger than the caches, and one large matmul.

Both limits can be measured low, and then the roofline is no bound (steps were measured at 110-138%
of it in a fast hour here):
- a copy both reads and writes, a decode step only reads (weights and KV cache), and on this
  project's 2-core VM the two rates differ, either way, from one minute to the next (by the copy's
  count 42.5 against 45.1 GB/s for a read-only sum of the same buffer, and 69.7 against 43.3 GB/s, in
  one morning);
- torch's ``mm`` is MKL's sgemm, which takes a slower path on AMD CPUs: 165-188 GFLOP/s here, against
  376-421 GFLOP/s for the same matmul through oneDNN, torch's other CPU matmul library.
So both are measured a second way too (torch's sum over the copy's source; the matmul through
``F.linear`` on tensors in oneDNN's layout), and the report also gives each step's share of the
tighter roofline, with the faster bandwidth and the faster peak (``tight_share``). The first stays
the headline figure (STREAM copy and ``torch.mm``, the common definition). The matmul peak is measured in the model's dtype: a bf16
model's arithmetic runs at bf16's rate (AVX512-BF16 does twice fp32's multiply-adds per instruction),
so a float32 peak would be no bound for it.

``share = roofline / measured step time``: 100% would be a step that does nothing but what it must.
``python -m engine bench`` prints it for each decode step of the workload. The bound assumes the weights
come from memory: a model small enough to stay in the last-level cache between steps can beat it.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

import torch
from torch import nn
from torch.nn import functional as F


@dataclass
class MachinePeaks:
    """This machine's limits, measured (:func:`measure_machine`).

    Attributes:
        bandwidth_gb_s: STREAM "copy": (bytes read + bytes written) / s, in GB/s (1e9 bytes), the best of the runs.
        matmul_gflop_s: one ``n x n`` matmul in ``dtype``: 2 n^3 / s, in GFLOP/s, the best of the runs.
        threads: torch's intra-op threads when measured (the engine's).
        read_gb_s: a read-only stream over the copy's source (torch's sum): bytes read / s, in GB/s, the
            best of the runs; None: not measured.
        onednn_gflop_s: the same matmul through oneDNN (``F.linear`` on ``Tensor.to_mkldnn()`` copies), in GFLOP/s, the best of
            the runs; None: not measured, or torch has no oneDNN here.
        dtype: the matmuls' dtype ("float32", "bfloat16"): that of the model the peaks bound, whose
            arithmetic runs at its dtype's rate (bf16's ``_mm512_dpbf16_ps`` does twice fp32's
            multiply-adds per instruction: 391 against 149 GFLOP/s for ``torch.mm`` on this project's
            Zen 4 VM).
    """

    bandwidth_gb_s: float
    matmul_gflop_s: float
    threads: int
    read_gb_s: float | None = None
    onednn_gflop_s: float | None = None
    dtype: str = "float32"


def measure_machine(copy_mb: int = 256, matmul_n: int = 2048, repeats: int = 5, dtype: torch.dtype = torch.float32) -> MachinePeaks:
    """Measure memory bandwidth and matmul peak with torch's own operators, on its current threads; each
    also a second way (see the top of this module).

    Args:
        copy_mb: size of the copied buffer in MB (1e6 bytes); far above the last-level cache.
        matmul_n: the matmul is ``[n, n] @ [n, n]`` (``torch.mm``: MKL on x86 in float32; and through oneDNN),
            in bfloat16 halved while one would take over :data:`MATMUL_BUDGET_S` (emulated bfloat16).
        repeats: runs of each, after one warm-up; the best is kept (STREAM's convention: the machine
            can do at least that).
        dtype: the matmuls' dtype, the model's (float32 or bfloat16); the bandwidth is measured in float32
            (bytes are bytes).

    Raises:
        ValueError: a size or repeats below 1, or a dtype other than float32 and bfloat16.
    """
    if copy_mb < 1 or matmul_n < 1 or repeats < 1:
        raise ValueError(f"copy_mb, matmul_n and repeats must be >= 1, got {copy_mb}, {matmul_n}, {repeats}")
    if dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"dtype must be torch.float32 or torch.bfloat16, got {dtype}")
    src = torch.ones(copy_mb * 10**6 // 4)
    dst = torch.empty_like(src)
    copy_s = _best_time(lambda: dst.copy_(src), repeats)
    read_s = _best_time(src.sum, repeats)
    if dtype == torch.bfloat16:
        matmul_n = _affordable_n(matmul_n, dtype)
    a, b = torch.randn(matmul_n, matmul_n, dtype=dtype), torch.randn(matmul_n, matmul_n, dtype=dtype)
    matmul_s = _best_time(lambda: torch.mm(a, b), repeats)
    onednn_s = None
    if torch.backends.mkldnn.is_available():  # the same matmul on tensors in oneDNN's layout: F.linear runs oneDNN's
        a_onednn, b_onednn = a.to_mkldnn(), b.to_mkldnn()
        try:
            onednn_s = _best_time(lambda: F.linear(a_onednn, b_onednn), repeats)
        except RuntimeError:  # oneDNN's bfloat16 linear wants AVX-512 (BW, VL, DQ) or AVX-NE-CONVERT
            onednn_s = None
    flops = 2 * matmul_n**3
    return MachinePeaks(2 * src.nbytes / copy_s / 1e9, flops / matmul_s / 1e9, torch.get_num_threads(), src.nbytes / read_s / 1e9,
                        flops / onednn_s / 1e9 if onednn_s else None, str(dtype).replace("torch.", ""))


MATMUL_BUDGET_S = 0.25  # the longest one timed matmul may take


def _affordable_n(matmul_n: int, dtype: torch.dtype) -> int:
    """``matmul_n``, halved (not below 256) while one ``[n, n] @ [n, n]`` would take over
    :data:`MATMUL_BUDGET_S`, judged from a 256 matmul's time and n**3. A CPU without native bfloat16
    (no AVX512-BF16 or AMX) runs bfloat16 matmuls emulated, some 50x slower than float32: at 2048 one
    takes seconds, and the bench measures its peaks once per run."""
    probe = torch.randn(256, 256, dtype=dtype)
    torch.mm(probe, probe)
    t0 = time.perf_counter()
    torch.mm(probe, probe)
    t256 = time.perf_counter() - t0
    while matmul_n > 256 and t256 * (matmul_n / 256) ** 3 > MATMUL_BUDGET_S:
        matmul_n //= 2
    return matmul_n


def _best_time(run, repeats: int) -> float:
    run()  # warm-up: fresh pages, MKL's buffers
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return min(times)


@dataclass
class ModelCost:
    """What one decode step of a model costs, apart from its contexts.

    Attributes:
        weight_bytes: bytes of the weights every step reads (the embedding table only as a tied LM head).
        weight_macs_per_token: multiply-adds per token through the weights (the projections and the LM head).
        kv_bytes_per_context_token: K and V bytes read per context token, all layers.
        attention_flops_per_context_token: q.k and p.v FLOPs per context token, all layers, all heads.
        lm_head_macs: the LM head's share of ``weight_macs_per_token`` (a prefill computes it for each
            prompt's last token only).
    """

    weight_bytes: int
    weight_macs_per_token: int
    kv_bytes_per_context_token: int
    attention_flops_per_context_token: int
    lm_head_macs: int = 0


def model_cost(model: nn.Module) -> ModelCost:
    """The :class:`ModelCost` of an :class:`engine.model_executor.model.CausalLM` (its parameters' real dtype and sizes)."""
    embed = model.model.embed_tokens.weight
    params = [p for p in model.parameters() if p is not embed]  # the lookup reads only the batch's rows
    weight_bytes = sum(p.numel() * p.element_size() for p in params)
    macs = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    if model.tie_word_embeddings:  # the LM head is the embedding table, read whole by every step
        weight_bytes += embed.numel() * embed.element_size()
        macs += embed.numel()
    head = embed if model.tie_word_embeddings else model.lm_head.weight
    heads = model.config.num_attention_heads
    kv = 2 * model.num_layers * model.num_kv_heads * model.head_dim * embed.element_size()
    return ModelCost(weight_bytes, macs, kv, 4 * model.num_layers * heads * model.head_dim, head.numel())


def decode_step_cost(cost: ModelCost, context_lens: list[int]) -> tuple[int, int]:
    """(bytes read, FLOPs) of one decode step: one new token for each request, ``context_lens`` tokens each."""
    context = sum(context_lens)
    flops = 2 * len(context_lens) * cost.weight_macs_per_token + context * cost.attention_flops_per_context_token
    return cost.weight_bytes + context * cost.kv_bytes_per_context_token, flops


def prefill_step_flops(cost: ModelCost, prompts: list[tuple[int, int]]) -> int:
    """FLOPs of one prefill step: ``prompts`` holds each request's (tokens computed this step, context
    length after it). Every token goes through the layers' projections; the LM head runs once per request
    (its last token's logits); each new token at position p attends to the p + 1 tokens up to it (causal).
    """
    tokens = sum(n for n, _ in prompts)
    pairs = sum(n * (context - n) + n * (n + 1) // 2 for n, context in prompts)  # (query, key) pairs attended
    layer_macs = cost.weight_macs_per_token - cost.lm_head_macs
    return 2 * tokens * layer_macs + 2 * len(prompts) * cost.lm_head_macs + pairs * cost.attention_flops_per_context_token


def prefill_report(model: nn.Module, steps: list[tuple[float, list[tuple[int, int]]]], peaks: MachinePeaks) -> dict:
    """Each prefill step's measured time against the time its arithmetic takes at the matmul peak.

    A prefill is compute-bound (every weight is read once for hundreds of tokens), so its bound is
    FLOPs / peak; ``share = (FLOPs / peak) / measured``: the step's rate as a share of the peak, the
    figure GEMM libraries are judged by (BLIS, oneDNN). Against one large ``torch.mm`` (``share``) and
    the faster of it and oneDNN's (``tight_share``).

    Args:
        model: the engine's :class:`engine.model_executor.model.CausalLM`.
        steps: (measured ms, each request's (tokens computed, context length after the step)) per
            prefill step.
        peaks: from :func:`measure_machine`, in the model's dtype.

    Returns:
        ``{"steps": [{"requests", "tokens", "ms", "gflop", "gflop_s", "share", "tight_share"}],
        "best": the row of the highest share (None: no steps)}``; gflop in 1e9 FLOPs, gflop_s in 1e9/s.
    """
    cost = model_cost(model)
    rows = []
    for ms, prompts in steps:
        flops = prefill_step_flops(cost, prompts)
        rate = flops / (ms * 1e6)
        rows.append({"requests": len(prompts), "tokens": sum(n for n, _ in prompts), "ms": ms, "gflop": flops / 1e9, "gflop_s": rate,
                     "share": rate / matmul_gflop_s(peaks, False), "tight_share": rate / matmul_gflop_s(peaks, True)})
    return {"steps": rows, "best": max(rows, key=lambda r: r["share"]) if rows else None}


def format_prefill(report: dict, peaks: dict) -> str:
    """One line: the fastest prefill step's rate against the matmul peaks ("" when there was none)."""
    best = report.get("best")
    if not best:
        return ""
    onednn = f", {100 * best['tight_share']:.0f}% of the faster of it and oneDNN's" if peaks.get("onednn_gflop_s") else ""
    return (f"prefill step of {best['requests']} prompts ({best['tokens']} tokens, {best['gflop']:.1f} GFLOP): {best['ms']:.0f} ms, "
            f"{best['gflop_s']:.0f} GFLOP/s: {100 * best['share']:.0f}% of the torch.mm peak ({peaks['matmul_gflop_s']:.0f} GFLOP/s){onednn}")


def roofline_ms(nbytes: int, flops: int, peaks: MachinePeaks, tight: bool = False) -> float:
    """max(bytes / bandwidth, FLOPs / peak), in ms: with the copy's bandwidth and ``torch.mm``'s peak, or
    with ``tight`` the faster of each pair of measurements (where the second was measured)."""
    return 1e3 * max(nbytes / (bandwidth_gb_s(peaks, tight) * 1e9), flops / (matmul_gflop_s(peaks, tight) * 1e9))


def bandwidth_gb_s(peaks: MachinePeaks, tight: bool) -> float:
    """The copy's bandwidth, or with ``tight`` the faster of it and the read-only stream's, in GB/s."""
    return max(peaks.bandwidth_gb_s, peaks.read_gb_s or 0.0) if tight else peaks.bandwidth_gb_s


def matmul_gflop_s(peaks: MachinePeaks, tight: bool) -> float:
    """``torch.mm``'s peak, or with ``tight`` the faster of it and oneDNN's, in GFLOP/s."""
    return max(peaks.matmul_gflop_s, peaks.onednn_gflop_s or 0.0) if tight else peaks.matmul_gflop_s


def decode_report(model: nn.Module, steps: list[tuple[float, list[int]]], peaks: MachinePeaks) -> dict:
    """Each decode step's measured time against its roofline.

    Args:
        model: the engine's :class:`engine.model_executor.model.CausalLM`.
        steps: (measured ms, the requests' context lengths in tokens) per decode step.
        peaks: from :func:`measure_machine`.

    Returns:
        ``{"peaks": {...}, "weight_mb", "steps": [{"batch", "ms", "roofline_ms", "bound" ("memory" or
        "compute"), "share", "tight_share"}], "mean_share", "total_share", "mean_share_by_bound",
        "mean_tight_share"}``; mean_share is the mean of the steps' shares, total_share the sum of their
        rooflines over the sum of their times (both None: no steps), mean_share_by_bound the mean share of
        the memory-bound and of the compute-bound steps (``{"memory": ..., "compute": ...}``, a kind without
        steps left out). tight_share is a step's share of the tighter roofline (``roofline_ms(..., tight=True)``,
        see the top of this module), mean_tight_share their mean (None: no steps, or neither second
        measurement made). A compute-bound share above 100% says that the step beat the measured matmul
        peak (one large MKL matmul), not the machine.

    Raises:
        ValueError: the peaks were measured in another dtype than the model's parameters (a float32 peak
            is no bound for bfloat16 arithmetic).
    """
    dtype = str(next(model.parameters()).dtype).replace("torch.", "")
    if dtype != peaks.dtype:
        raise ValueError(f"the matmul peak was measured in {peaks.dtype} but the model computes in {dtype}: "
                         f"measure_machine(dtype=torch.{dtype})")
    cost = model_cost(model)
    rows = []
    for ms, lens in steps:
        nbytes, flops = decode_step_cost(cost, lens)
        limit = roofline_ms(nbytes, flops, peaks)
        memory_bound = nbytes / peaks.bandwidth_gb_s >= flops / peaks.matmul_gflop_s
        rows.append({"batch": len(lens), "ms": ms, "roofline_ms": limit, "bound": "memory" if memory_bound else "compute", "share": limit / ms,
                     "tight_share": roofline_ms(nbytes, flops, peaks, tight=True) / ms})
    mean = statistics.mean(r["share"] for r in rows) if rows else None
    measured = peaks.read_gb_s is not None or peaks.onednn_gflop_s is not None
    mean_tight = statistics.mean(r["tight_share"] for r in rows) if rows and measured else None
    total = sum(r["roofline_ms"] for r in rows) / sum(r["ms"] for r in rows) if rows else None
    by_bound = {kind: statistics.mean(r["share"] for r in rows if r["bound"] == kind)
                for kind in ("memory", "compute") if any(r["bound"] == kind for r in rows)}
    return {"peaks": asdict(peaks), "weight_mb": cost.weight_bytes / 1e6, "steps": rows, "mean_share": mean, "total_share": total,
            "mean_share_by_bound": by_bound, "mean_tight_share": mean_tight}


def format_report(report: dict, per_line: int = 6) -> str:
    """The report as text: the machine, then every step as ``batch: measured/roofline ms (share)``."""
    p = report["peaks"]
    read = f", {p['read_gb_s']:.1f} GB/s read-only (a sum)" if p.get("read_gb_s") else ""
    onednn = f", {p['onednn_gflop_s']:.0f} through oneDNN" if p.get("onednn_gflop_s") else ""
    lines = [
        f"roofline: memory {p['bandwidth_gb_s']:.1f} GB/s (STREAM copy){read}, matmul {p['matmul_gflop_s']:.0f} GFLOP/s "
        f"(torch.mm{onednn}; {p.get('dtype', 'float32')}, {p['threads']} threads), {report['weight_mb']:.0f} MB of weights read per step",
    ]
    if report["mean_share"] is None:
        return lines[0] + "; no decode steps"
    cells = [f"{s['batch']}: {s['ms']:.1f}/{s['roofline_ms']:.1f} ({100 * s['share']:.0f}%)" for s in report["steps"]]
    lines.append("decode steps, batch: measured/roofline ms (share of the roofline), in order:")
    lines += ["  " + "   ".join(cells[i : i + per_line]) for i in range(0, len(cells), per_line)]
    compute = sum(s["bound"] == "compute" for s in report["steps"])
    by_bound = report.get("mean_share_by_bound", {})
    kinds = ", ".join(f"{n} {kind}-bound" + (f" at {100 * by_bound[kind]:.0f}%" if kind in by_bound else "")
                      for kind, n in (("compute", compute), ("memory", len(cells) - compute)))
    lines.append(f"mean share of the roofline over {len(cells)} decode steps: {100 * report['mean_share']:.0f}% "
                 f"(all their rooflines over all their time: {100 * report['total_share']:.0f}%; {kinds})")
    if report.get("mean_tight_share") is not None:
        peaks = MachinePeaks(**p)
        lines.append(f"  against the tighter roofline, the faster of each pair ({bandwidth_gb_s(peaks, True):.1f} GB/s, "
                     f"{matmul_gflop_s(peaks, True):.0f} GFLOP/s): mean share {100 * report['mean_tight_share']:.0f}%")
    return "\n".join(lines)
