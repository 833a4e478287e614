"""``python -m engine bench-cpu``: the engine's CPU kernels against the torch code they replace, on one model.

For each batch size (rows = requests in a decode step) it times what one decode step of the model
does with them, on the model's real weights:

- ``matmul``: every matrix multiply of a step (each layer's 7 projections and the LM head), through
  :func:`engine.cpu.ops.small_batch_linear` (on the weights packed at load) and through ``F.linear`` (MKL, as transformers does);
- ``norm_rope``: each layer's two residual adds + RMSNorms and its RoPE on q and k, through
  :func:`engine.cpu.ops.add_rms_norm` / :func:`engine.cpu.ops.rotary_embedding` and through the torch
  code of engine/model_executor/model.py;
- ``attention``: each layer's decode attention over its own KV pool, through
  :func:`engine.cpu.ops.paged_attention_decode` and through the torch reference (gather, then SDPA).

The two sides alternate ``repeats`` times and medians are reported (this is a shared machine: one
pass can be 30% off). ``python -m engine bench`` measures what they do to a whole workload.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
from torch.nn import functional as F

from engine.cpu import ops as cpu_ops
from engine.model_executor.attention import paged_attention_reference, plan_step
from engine.llm import LLM
from engine.model_executor.model import Linear, apply_rotary


def run_cpu_bench(model: str | None = None, rows: tuple[int, ...] = (1, 4, 8, 16, 32, 64), repeats: int = 7, context: int = 128) -> dict:
    """Time the CPU kernels against torch for one decode step of ``model`` at each row count.

    Returns:
        ``{"model", "weights_mb", "layers", "repeats", "matmul_simd" ("avx512", "avx2" or "generic", see
        :func:`engine.cpu.ops.matmul_simd`), "isa" (:func:`engine.cpu.ops.isa_report`), "matmul_ms": {rows: {"kernel", "torch"}},
        "norm_rope_ms": {rows: {"kernel", "torch"}}, "context", "attention_ms": {rows: {"kernel", "torch"}}}``;
        times are medians in ms per decode step; attention: ``context`` tokens per row, every layer on its own pool.

    Raises:
        ValueError: a row count below 1, or repeats < 1.
        RuntimeError: the kernels cannot be built on this machine (a warning gives the compiler's error).
    """
    if repeats < 1:
        raise ValueError(f"--repeats must be at least 1, got {repeats}")
    if not rows or min(rows) < 1:
        raise ValueError(f"--rows must be at least 1, got {list(rows)}")
    llm = LLM(model, cpu_kernels=True, num_gpu_blocks=16)
    net = llm.engine.runner.model
    if not cpu_ops.load_kernel():
        raise RuntimeError("the engine's CPU kernels could not be built here (the warning above says why)")
    head = net.model.embed_tokens if net.tie_word_embeddings else net.lm_head
    weights = [m.weight.detach() for m in net.modules() if isinstance(m, Linear)] + [head.weight.detach()]
    packed = cpu_ops.pack_weights(weights)  # the engine's own packed copies (shared), as its layers use them
    layer = net.model.layers[0]
    attn, norm = layer.self_attn, layer.input_layernorm
    hidden = net.config.hidden_size
    matmul_ms, norm_rope_ms, attention_ms = {}, {}, {}
    generator = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for r in rows:
            inputs = {k: torch.randn(r, k, generator=generator) for k in {w.shape[1] for w in weights}}

            def kernel_matmuls() -> None:
                for w, p in zip(weights, packed):
                    cpu_ops.small_batch_linear(inputs[w.shape[1]], w, p)

            def torch_matmuls() -> None:
                for w in weights:
                    F.linear(inputs[w.shape[1]], w)

            matmul_ms[r] = _alternate({"kernel": kernel_matmuls, "torch": torch_matmuls}, repeats)
            x, residual = torch.randn(2, r, hidden, generator=generator)
            q = torch.randn(r, attn.num_heads, attn.head_dim, generator=generator)
            k = torch.randn(r, attn.num_kv_heads, attn.head_dim, generator=generator)
            cos, sin = net.rotary_emb(torch.arange(r) + 100, torch.float32)

            def fused() -> None:
                for _ in range(net.num_layers):
                    cpu_ops.add_rms_norm(x, residual, norm.weight, norm.eps)
                    cpu_ops.rotary_embedding(q, k, cos, sin)
                    cpu_ops.add_rms_norm(x, residual, norm.weight, norm.eps)

            def plain() -> None:
                for _ in range(net.num_layers):
                    norm._norm(x + residual)
                    apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
                    norm._norm(x + residual)

            norm_rope_ms[r] = _alternate({"kernel": fused, "torch": plain}, repeats)
            attention_ms[r] = _decode_attention(net, r, context, repeats, generator)
    return {
        "model": llm.engine.model_name, "weights_mb": sum(w.numel() * w.element_size() for w in weights) / 1e6,
        "layers": net.num_layers, "repeats": repeats, "matmul_simd": cpu_ops.matmul_simd(), "isa": cpu_ops.isa_report(),
        "matmul_ms": matmul_ms, "norm_rope_ms": norm_rope_ms, "context": context, "attention_ms": attention_ms,
    }


def _decode_attention(net, rows: int, context: int, repeats: int, generator: torch.Generator) -> dict[str, float]:
    """Decode attention of one step, every layer on its own pool: ``rows`` sequences of ``context`` tokens in
    shuffled 16-slot blocks, through the kernel and through the torch reference (with its per-step plan)."""
    blocks = -(-context // 16)
    shape = (rows * blocks, 16, net.num_kv_heads, net.head_dim)
    pools = [(torch.randn(shape, generator=generator), torch.randn(shape, generator=generator)) for _ in range(net.num_layers)]
    tables = torch.randperm(rows * blocks, generator=generator).view(rows, blocks).to(torch.int32)
    lens = torch.full((rows,), context, dtype=torch.int32)
    q = torch.randn(rows, net.config.num_attention_heads, net.head_dim, generator=generator)
    scale = net.head_dim**-0.5

    def kernel() -> None:
        for kc, vc in pools:
            cpu_ops.paged_attention_decode(q, kc, vc, tables, lens, scale)

    def reference() -> None:
        plan = plan_step(torch.zeros(rows, dtype=torch.int64), tables, lens, 16)
        for kc, vc in pools:
            paged_attention_reference(q, kc, vc, tables, lens, scale, plan=plan)

    return _alternate({"kernel": kernel, "torch": reference}, repeats)


def _alternate(sides: dict[str, Callable[[], None]], repeats: int) -> dict[str, float]:
    """Median ms of each side over ``repeats`` alternating passes, after one warm-up pass each."""
    times: dict[str, list[float]] = {name: [] for name in sides}
    for name, fn in sides.items():
        fn()
    for _ in range(repeats):
        for name, fn in sides.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: 1e3 * statistics.median(v) for name, v in times.items()}


def format_cpu_bench(r: dict) -> str:
    lines = [
        f"{r['model']}: one decode step, by rows (requests in the step); medians of {r['repeats']} alternating passes, ms",
        f"measured on: {cpu_ops.describe_isa(r['isa'])}",
        f"{'rows':>5}  {'matmuls: kernel':>15}  {'F.linear':>9}  {'speed-up':>8}   {'norm+RoPE: kernel':>17}  {'torch':>7}  {'speed-up':>8}"
        f"   {'attention: kernel':>17}  {'torch':>7}  {'speed-up':>8}",
    ]
    for rows, mm in r["matmul_ms"].items():
        nr, at = r["norm_rope_ms"][rows], r["attention_ms"][rows]
        lines.append(
            f"{rows:>5}  {mm['kernel']:>15.1f}  {mm['torch']:>9.1f}  {mm['torch'] / mm['kernel']:>7.2f}x"
            f"   {nr['kernel']:>17.2f}  {nr['torch']:>7.2f}  {nr['torch'] / nr['kernel']:>7.2f}x"
            f"   {at['kernel']:>17.2f}  {at['torch']:>7.2f}  {at['torch'] / at['kernel']:>7.2f}x"
        )
    lines.append(
        f"matmuls: {r['weights_mb']:.0f} MB of fp32 weights read per step; "
        f"norm+RoPE: {r['layers']} layers x (2 residual adds + RMSNorms, RoPE on q and k); "
        f"attention: {r['layers']} layers of decode attention, {r['context']} tokens of context per row"
    )
    if r["matmul_simd"] not in cpu_ops.MATMUL_ISAS:
        lines.append("this CPU has no AVX2: the matmul kernel is built generic, and the engine multiplies with F.linear here")
    return "\n".join(lines)
