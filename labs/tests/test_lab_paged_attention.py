"""Lab paged_attention: decode attention through block tables equals dense attention."""

import torch

from engine.model_executor.attention import gather_index, paged_attention_reference


def dense(q, keys, values, scale):
    """One query per sequence against its own contiguous K/V: [H, D] x [T, Hkv, D]."""
    group = q.shape[0] // keys.shape[1]
    k = keys.repeat_interleave(group, dim=1).transpose(0, 1)  # [H, T, D]
    v = values.repeat_interleave(group, dim=1).transpose(0, 1)
    weights = torch.softmax((k @ q[:, :, None]).squeeze(-1) * scale, dim=-1)  # [H, T]
    return (weights[:, None, :] @ v).squeeze(1)


def paged_case(lens, block_size=4, num_heads=4, num_kv_heads=2, head_dim=8, num_blocks=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    k_cache = torch.full((num_blocks, block_size, num_kv_heads, head_dim), float("nan"))  # unused slots hold NaN
    v_cache = torch.full_like(k_cache, float("nan"))
    order = torch.randperm(num_blocks, generator=g).tolist()
    max_blocks = max(-(-n // block_size) for n in lens) or 1
    tables = torch.zeros(len(lens), max_blocks, dtype=torch.int32)
    contexts = []
    for s, n in enumerate(lens):
        keys = torch.randn(n, num_kv_heads, head_dim, generator=g)
        values = torch.randn(n, num_kv_heads, head_dim, generator=g)
        for b in range(-(-n // block_size)):
            block = order.pop()
            tables[s, b] = block
            rows = slice(b * block_size, min(n, (b + 1) * block_size))
            k_cache[block, : rows.stop - rows.start] = keys[rows]
            v_cache[block, : rows.stop - rows.start] = values[rows]
        contexts.append((keys, values))
    q = torch.randn(len(lens), num_heads, head_dim, generator=g)
    return q, k_cache, v_cache, tables, torch.tensor(lens, dtype=torch.int32), contexts


def test_gather_index_translates_tables_to_slots():
    index = gather_index(torch.tensor([[3, 1]], dtype=torch.int32), torch.tensor([6], dtype=torch.int32), 4)
    assert index.slots.tolist() == [12, 13, 14, 15, 4, 5, 6, 7], "slot of position i = block_table[i // bs] * bs + i % bs"
    assert index.live.tolist() == [[True] * 6 + [False] * 2], "positions past the context are not live"


def test_equals_dense_attention_with_grouped_heads():
    q, k_cache, v_cache, tables, lens, contexts = paged_case([5, 13, 1, 8])
    out = paged_attention_reference(q, k_cache, v_cache, tables, lens, 8 ** -0.5)
    assert out.shape == q.shape and out.dtype == q.dtype
    for s, (keys, values) in enumerate(contexts):
        expected = dense(q[s], keys, values, 8 ** -0.5)
        assert torch.allclose(out[s], expected, atol=1e-5), f"sequence {s} (context {lens[s]}): differs from dense attention"


def test_slots_outside_the_context_never_leak():
    q, k_cache, v_cache, tables, lens, _ = paged_case([3, 6])
    out = paged_attention_reference(q, k_cache, v_cache, tables, lens, 0.3)
    assert torch.isfinite(out).all(), "NaN in cache slots past a context reached the output: mask (or zero) them"


def test_an_empty_context_gives_zeros():
    q, k_cache, v_cache, tables, lens, _ = paged_case([4, 4])
    lens[1] = 0
    out = paged_attention_reference(q, k_cache, v_cache, tables, lens, 0.3)
    assert torch.equal(out[1], torch.zeros_like(out[1])), "a padded row (context_lens == 0) outputs zeros"
