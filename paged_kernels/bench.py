"""Benchmark decode attention: ``python -m paged_kernels.bench`` (``--help`` for options).

What it measures. Decode attention is memory-bound: every step reads each sequence's whole K
and V once. So besides time we report *achieved bandwidth* = K/V bytes read / time, and on a
known GPU the fraction of its peak HBM bandwidth (H100 3.35 TB/s, H200 4.8 TB/s). Providers:

* ``triton-1pass``: :func:`paged_kernels.paged_attention_decode` with ``num_splits=1`` (vLLM v1 style);
* ``triton-splitk``: the same with split-K (automatic choice, at least 2 partitions; vLLM v2 /
  FlashDecoding);
* ``torch-sdpa``: ``scaled_dot_product_attention`` on a *contiguous* cache, a no-paging baseline;
* ``torch-gather``: :func:`engine.model_executor.attention.paged_attention_reference` (gathers blocks, then einsum);
* ``flash-attn``: ``flash_attn_with_kvcache`` with a block table, if flash-attn is installed.

All paged providers use a randomly permuted block table. Without a GPU the kernels run in
Triton's interpreter: the script then uses tiny fp32 sizes and says so; those numbers measure
Python overhead, not memory bandwidth.

``--engine-step`` times what the engine does per generated token with the default model under
the interpreter: 30 layers x decode (9 query heads, 3 KV heads, head_dim 64, batch 4,
context 256, fp32, block_size 16) and prints seconds per step.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import paged_kernels
from engine.model_executor.attention import paged_attention_reference

PEAK_BYTES_PER_S = {"H200": 4.8e12, "H100": 3.35e12}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def peak_bandwidth(device: torch.device) -> tuple[str, float | None]:
    if device.type != "cuda":
        return "cpu (Triton interpreter)", None
    name = torch.cuda.get_device_name(device)
    for key, peak in PEAK_BYTES_PER_S.items():  # H200 checked before H100
        if key in name:
            return name, peak
    return name, None


def make_inputs(batch, context, num_heads, num_kv_heads, head_dim, block_size, dtype, device, seed=0):
    """Paged caches with a random permuted block table, plus a query; every sequence has ``context`` tokens."""
    gen = torch.Generator().manual_seed(seed)
    blocks_per_seq = -(-context // block_size)
    num_blocks = batch * blocks_per_seq
    key_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=gen).to(device, dtype)
    value_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=gen).to(device, dtype)
    block_tables = torch.randperm(num_blocks, generator=gen).view(batch, blocks_per_seq).to(device, torch.int32)
    context_lens = torch.full((batch,), context, dtype=torch.int32, device=device)
    query = torch.randn(batch, num_heads, head_dim, generator=gen).to(device, dtype)
    return query, key_cache, value_cache, block_tables, context_lens


def time_fn(fn, device: torch.device, repeats: int) -> float:
    """Median seconds per call: triton.testing.do_bench (CUDA events) on GPU, perf_counter on CPU."""
    if device.type == "cuda":
        import triton.testing

        return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") / 1e3
    fn()  # warm-up (the interpreter parses the kernel on first use)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def providers(query, key_cache, value_cache, block_tables, context_lens, scale, context):
    """name -> zero-argument callable computing the decode attention."""
    num_heads, num_kv_heads = query.shape[1], key_cache.shape[2]
    out = {
        "triton-1pass": lambda: paged_kernels.paged_attention_decode(
            query, key_cache, value_cache, block_tables, context_lens, scale, num_splits=1),
    }
    splits = paged_kernels.paged_attention_decode.__globals__["_auto_num_splits"](
        query, query.shape[0], num_kv_heads, block_tables.shape[1] * key_cache.shape[1])
    splits = max(2, min(splits if splits > 1 else -(-context // 512), 64))
    out[f"triton-splitk({splits})"] = lambda: paged_kernels.paged_attention_decode(
        query, key_cache, value_cache, block_tables, context_lens, scale, num_splits=splits)
    out["torch-gather"] = lambda: paged_attention_reference(
        query, key_cache, value_cache, block_tables, context_lens, scale)

    # Contiguous-cache baseline: the same K/V laid out [batch, kv_heads, context, head_dim].
    batch, head_dim = query.shape[0], query.shape[2]
    k = key_cache[block_tables.long()].reshape(batch, -1, num_kv_heads, head_dim)[:, :context].transpose(1, 2).contiguous()
    v = value_cache[block_tables.long()].reshape(batch, -1, num_kv_heads, head_dim)[:, :context].transpose(1, 2).contiguous()
    q4 = query.unsqueeze(2)  # [batch, heads, 1, head_dim]

    def sdpa():
        return torch.nn.functional.scaled_dot_product_attention(q4, k, v, scale=scale, enable_gqa=num_heads != num_kv_heads)

    out["torch-sdpa"] = sdpa
    if query.is_cuda:
        try:
            from flash_attn import flash_attn_with_kvcache  # type: ignore[import-not-found]
        except ImportError:
            pass
        else:
            if key_cache.shape[1] % 256 == 0:  # flash-attn's paged KV needs block_size % 256 == 0
                out["flash-attn"] = lambda: flash_attn_with_kvcache(
                    query.unsqueeze(1), key_cache, value_cache, cache_seqlens=context_lens,
                    block_table=block_tables, softmax_scale=scale)
    return out


def run_table(args) -> list[dict]:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device_name, peak = peak_bandwidth(device)
    dtype = DTYPES[args.dtype]
    batches, contexts = args.batches, args.contexts
    if device.type == "cpu":
        print("NOTE: no CUDA device: kernels run in Triton's CPU interpreter. Sizes are shrunk and the")
        print("      dtype forced to fp32; times measure interpreter overhead, NOT memory bandwidth.\n")
        print("      Using the default model's heads (9 query / 3 KV, head_dim 64).\n")
        dtype = torch.float32
        batches, contexts = [1, 4], [64, 256]
        args.num_heads, args.num_kv_heads, args.head_dim = 9, 3, 64
    rows = []
    for batch, context in ((b, c) for b in batches for c in contexts):
        inputs = make_inputs(batch, context, args.num_heads, args.num_kv_heads, args.head_dim,
                             args.block_size, dtype, device)
        scale = args.head_dim ** -0.5
        kv_bytes = 2 * batch * context * args.num_kv_heads * args.head_dim * inputs[1].element_size()
        for name, fn in providers(*inputs, scale, context).items():
            seconds = time_fn(fn, device, args.repeats)
            gbps = kv_bytes / seconds / 1e9
            rows.append(dict(device=device_name, dtype=str(dtype).removeprefix("torch."), batch=batch,
                             context=context, provider=name, ms=seconds * 1e3, gb_per_s=gbps,
                             pct_peak=None if peak is None else 100 * kv_bytes / seconds / peak))
    return rows


def print_table(rows: list[dict]) -> None:
    if not rows:
        return
    print(f"device: {rows[0]['device']}   dtype: {rows[0]['dtype']}")
    print(f"{'batch':>5} {'context':>7} {'provider':<18} {'ms':>10} {'GB/s':>9} {'% peak':>7}")
    for r in rows:
        pct = "-" if r["pct_peak"] is None else f"{r['pct_peak']:.1f}"
        print(f"{r['batch']:>5} {r['context']:>7} {r['provider']:<18} {r['ms']:>10.3f} {r['gb_per_s']:>9.2f} {pct:>7}")


def engine_step(repeats: int = 3, layers: int = 30) -> float:
    """Median seconds for one decode step of the default model (``layers`` decode calls)."""
    inputs = make_inputs(4, 256, 9, 3, 64, 16, torch.float32, torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    scale = 64 ** -0.5

    def step():
        for _ in range(layers):
            paged_kernels.paged_attention_decode(*inputs, scale)
        if inputs[0].is_cuda:
            torch.cuda.synchronize()

    step()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m paged_kernels.bench", description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 64])
    parser.add_argument("--contexts", type=lambda s: [int(x) for x in s.split(",")], default=[512, 2048, 8192])
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--num-heads", type=int, default=32)
    parser.add_argument("--num-kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats on CPU (GPU uses do_bench)")
    parser.add_argument("--json", action="store_true", help="print results as JSON instead of a table")
    parser.add_argument("--engine-step", action="store_true",
                        help="time one 30-layer decode step of the default model (the Triton interpreter's speed on CPU)")
    args = parser.parse_args(argv)

    if args.engine_step:
        seconds = engine_step(args.repeats)
        mode = "Triton interpreter" if paged_kernels.interpreted() else torch.cuda.get_device_name()
        if args.json:
            print(json.dumps({"engine_step_seconds": seconds, "layers": 30, "mode": mode}))
        else:
            print(f"{mode}: {seconds:.3f} s per 30-layer decode step "
                  "(9 heads / 3 KV heads / head_dim 64, batch 4, context 256, fp32, block_size 16)")
        return
    rows = run_table(args)
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print_table(rows)


if __name__ == "__main__":
    main()
