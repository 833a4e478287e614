def decode_one(q, key_cache, value_cache, block_table, context_len, scale):
    """q [num_heads, head_dim]; caches [num_blocks, block_size, num_kv_heads, head_dim];
    block_table: list of block ids; context_len: tokens. Returns [num_heads, head_dim]."""
    num_heads, head_dim = q.shape
    block_size, num_kv_heads = key_cache.shape[1], key_cache.shape[2]
    group = num_heads // num_kv_heads
    m = torch.full((num_heads,), float("-inf"))  # running max of the logits
    l = torch.zeros(num_heads)  # running sum of exp(logit - m)
    acc = torch.zeros(num_heads, head_dim)  # running sum of exp(logit - m) * v
    for i, block_id in enumerate(block_table):
        n = min(block_size, context_len - i * block_size)  # tokens of this block inside the context
        if n <= 0:
            break
        k = key_cache[block_id, :n].repeat_interleave(group, dim=1)  # [n, num_heads, head_dim]
        v = value_cache[block_id, :n].repeat_interleave(group, dim=1)
        s = torch.einsum("hd,nhd->hn", q, k) * scale  # [num_heads, n]
        m_new = torch.maximum(m, s.max(dim=1).values)
        alpha = torch.exp(m - m_new)  # exp(-inf) = 0 on the first block: nothing to rescale yet
        p = torch.exp(s - m_new[:, None])  # every exponent <= 0: no overflow
        l = l * alpha + p.sum(dim=1)
        acc = acc * alpha[:, None] + torch.einsum("hn,nhd->hd", p, v)
        m = m_new
    return acc / l[:, None]
