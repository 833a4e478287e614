"""Test cases for decode attention kernels (Triton's, the engine's CPU kernel): paged KV caches built to
catch addressing bugs. Block tables are random permutations (never the identity), passed as views into a
wider tensor whose extra columns point at NaN blocks, and every cache slot outside the live contexts holds
NaN, so a kernel that reads past a context or past its table produces NaN.
"""

from __future__ import annotations

import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.float16: dict(atol=2e-3, rtol=2e-3),
       torch.bfloat16: dict(atol=1.6e-2, rtol=1.6e-2)}


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def make_paged_kv(ctx_lens, block_size, num_kv_heads, head_dim, dtype, seed=0, spare_blocks=3, value_scale=1.0, device=DEVICE):
    """Caches full of NaN except the live context slots; permuted, padded block tables.

    Returns ``key_cache, value_cache, block_tables (a non-contiguous view), context_lens``.
    """
    gen = torch.Generator().manual_seed(seed)
    blocks_per_seq = [cdiv(c, block_size) for c in ctx_lens]
    used = sum(blocks_per_seq)
    num_blocks = used + spare_blocks
    perm = torch.randperm(num_blocks, generator=gen)
    if torch.equal(perm, torch.arange(num_blocks)):
        perm = perm.roll(1)
    max_blocks = max(max(blocks_per_seq), 1)
    # Wider than needed: columns past a sequence's blocks and past the view point at NaN blocks.
    spare = perm[used:]
    wide = spare[torch.randint(0, spare_blocks, (len(ctx_lens), max_blocks + 2), generator=gen)].to(torch.int32)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    key_cache = torch.full(shape, float("nan"), dtype=dtype)
    value_cache = torch.full(shape, float("nan"), dtype=dtype)
    nxt = 0
    for s, (ctx, nb) in enumerate(zip(ctx_lens, blocks_per_seq)):
        ids = perm[nxt : nxt + nb]
        nxt += nb
        wide[s, 1 : 1 + nb] = ids.to(torch.int32)
        for i in range(ctx):
            b, o = int(ids[i // block_size]), i % block_size
            key_cache[b, o] = (torch.randn(num_kv_heads, head_dim, generator=gen) * value_scale).to(dtype)
            value_cache[b, o] = torch.randn(num_kv_heads, head_dim, generator=gen).to(dtype)
    block_tables = wide[:, 1 : 1 + max_blocks]
    assert len(ctx_lens) < 2 or not block_tables.is_contiguous()  # one row: torch calls any view contiguous
    context_lens = torch.tensor(ctx_lens, dtype=torch.int32)
    return (key_cache.to(device), value_cache.to(device), block_tables.to(device), context_lens.to(device))


def packed_query(num_tokens, num_heads, num_kv_heads, head_dim, dtype, seed=1, scale=1.0, device=DEVICE):
    """Query sliced out of a packed QKV projection output: row stride > num_heads * head_dim."""
    gen = torch.Generator().manual_seed(seed)
    qkv = torch.randn(num_tokens, (num_heads + 2 * num_kv_heads) * head_dim, generator=gen) * scale
    q = qkv.to(dtype).to(device)[:, : num_heads * head_dim].view(num_tokens, num_heads, head_dim)
    assert num_tokens < 2 or not q.is_contiguous()  # one row: torch calls any view contiguous
    return q


def assert_decode_output(out, ref, query, ctx_lens, tol=None):
    """A decode kernel's output against the reference's: query's shape and dtype, no NaN from outside
    a context, zeros for an empty context, values within ``tol`` (default :data:`TOL` for the dtype)."""
    assert out.shape == query.shape and out.dtype == query.dtype
    assert not torch.isnan(out).any(), "NaN leaked from a cache slot outside a context"
    for s, c in enumerate(ctx_lens):
        if c == 0:
            assert torch.all(out[s] == 0), "a padded row (context_len 0) must be zeros"
    torch.testing.assert_close(out.float(), ref.float(), **(tol or TOL[query.dtype]))
