# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Lesson 5 — The PagedAttention decode kernel
#
# **Goal:** understand the three ideas inside the engine's Triton decode kernel — online softmax, grouped
# KV heads, split-K — run the kernel itself, and write a small version of it that reads a paged cache.
#
# A decode step gives each sequence one query per head. The kernel must compute
# softmax(**q** Kᵀ · scale) V over the sequence's whole context, whose K and V lie in blocks scattered
# over the pool. It never builds the full row of logits: it walks the context a tile at a time.

# %%
# Make `engine` and `kernels` importable when this notebook is opened from lessons/<lang>/ without `pip install -e .`
import pathlib
import sys

try:
    import engine  # noqa: F401
except ImportError:
    sys.path.insert(0, str(next(p for p in pathlib.Path.cwd().resolve().parents if (p / "engine").is_dir())))

import time

import matplotlib.pyplot as plt
import torch

import kernels  # on a machine without a GPU this switches Triton to its interpreter
from engine import paged_attention_reference
from visualize import program_grid, program_grid_figure

from visualize.i18n import t
from visualize.style import use_cjk_font

LANG = "en"  # the language of the charts and of the check's messages
use_cjk_font()  # so that 中文 chart labels are drawn, not boxes
print(t("lp5_interpreter", LANG, on=t("yes" if kernels.interpreted() else "no", LANG)))

# %% [markdown]
# ## 1. Online softmax
# softmax(x)ᵢ = exp(xᵢ − m) / Σⱼ exp(xⱼ − m), with m = max x so that no exponent overflows. Reading x in
# tiles, we keep three running values: the max **m** so far, the sum **l** of exp(x − m), and the
# weighted sum **acc** of values. When a tile raises the max from m to m′, everything accumulated is
# rescaled by α = exp(m − m′) (Milakov & Gimelshein 2018; FlashAttention).

# %%
torch.manual_seed(0)
x = torch.randn(48) * 3  # one query's logits over 48 context tokens
values = torch.randn(48, 8)
m, l, acc, history = torch.tensor(float("-inf")), torch.tensor(0.0), torch.zeros(8), []
for start in range(0, 48, 8):  # tiles of 8 tokens
    tile = x[start : start + 8]
    m_new = torch.maximum(m, tile.max())
    alpha = torch.exp(m - m_new)
    p = torch.exp(tile - m_new)
    l = l * alpha + p.sum()
    acc = acc * alpha + p @ values[start : start + 8]
    m = m_new
    history.append((m.item(), alpha.item()))
print(t("lp5_online", LANG, diff=(acc / l - torch.softmax(x, 0) @ values).abs().max().item()))

fig, ax = plt.subplots(figsize=(7, 2.8))
ax.plot(x, ".", color="gray", label="logits")
for i, (m_i, a) in enumerate(history):
    ax.hlines(m_i, 8 * i, 8 * i + 8, color="tab:red", label=t("lc_l5_running_max", LANG) if i == 0 else None)
    ax.axvline(8 * i, color="lightgray", lw=0.8)
    ax.annotate(f"α={a:.2f}", (8 * i + 4, x.max() + 1), ha="center", fontsize=8)
ax.set_xlabel(t("lc_l5_context_token", LANG))
ax.set_ylim(x.min() - 1, x.max() + 2)
ax.legend(fontsize=8, loc="lower right")
plt.show()

# %% [markdown]
# α is 1 when a tile does not raise the max, and 0 for the first tile (m starts at −∞). The result is
# exact: online softmax reorders the arithmetic, it does not approximate.
#
# ## 2. Grouped-query attention: one KV head serves a group of query heads
# SmolLM2 has 9 query heads and 3 KV heads: query head *h* reads KV head *h* // 3. The kernel loads a
# KV head's keys and values **once** for its whole group, dividing memory traffic by the group size.

# %%
num_heads, num_kv_heads = 9, 3
fig, ax = plt.subplots(figsize=(6, 1.8))
for h in range(num_heads):
    kv = h // (num_heads // num_kv_heads)
    ax.plot([h, 3 * kv + 1], [1, 0], color=f"C{kv}")
    ax.text(h, 1.08, f"q{h}", ha="center")
for kv in range(num_kv_heads):
    ax.text(3 * kv + 1, -0.2, t("lc_l5_kv_head", LANG, kv=kv), ha="center", color=f"C{kv}")
ax.set_ylim(-0.4, 1.3)
ax.set_axis_off()
plt.show()

# %% [markdown]
# ## 3. The Triton kernel, running
# A tiny paged cache: 3 sequences, blocks of 4 tokens, block tables pointing anywhere in a 16-block pool.
# On a CPU the kernel runs in Triton's interpreter (slow, so the sizes stay tiny); on a GPU the same code
# is compiled. We compare it with the torch reference `paged_attention_reference`.

# %%
num_blocks, block_size, head_dim = 16, 4, 16
heads, kv_heads = 6, 2
key_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim)
value_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim)
context_lens = torch.tensor([5, 11, 16], dtype=torch.int32)
block_tables = torch.tensor([[3, 0, 0, 0], [9, 1, 14, 0], [7, 12, 2, 5]], dtype=torch.int32)
query = torch.randn(3, heads, head_dim)
scale = head_dim**-0.5

want = paged_attention_reference(query, key_cache, value_cache, block_tables, context_lens, scale)
start = time.perf_counter()
got = kernels.paged_attention_decode(query, key_cache, value_cache, block_tables, context_lens, scale)
print(t("lp5_kernel", LANG, s=time.perf_counter() - start, diff=(got - want).abs().max()))

# %% [markdown]
# On a GPU each Triton **program** handles one (sequence, KV head) pair: it loads the group's queries,
# then walks the context gathering, for every token, its block id from the block table.

# %%
tables = [row[: -(-int(n) // block_size)].tolist() for row, n in zip(block_tables, context_lens)]
grid = program_grid([0, 1, 2], context_lens.tolist(), tables, block_size, heads, kv_heads)
program_grid_figure(grid, lang=LANG)
plt.show()

# %% [markdown]
# ## 4. Split-K
# With few sequences and long contexts there are too few programs to fill a GPU's cores. vLLM's
# `paged_attention_v2` (the FlashDecoding idea) cuts each context into partitions handled by separate
# programs; each writes a partial output with its own max *mᵢ* and sum *lᵢ*, and a reduce kernel merges
# them with weights *lᵢ* · exp(*mᵢ* − max *m*). Same answer, more parallelism.

# %%
for splits in (1, 2, 4):
    out = kernels.paged_attention_decode(query, key_cache, value_cache, block_tables, context_lens, scale, num_splits=splits)
    print(t("lp5_splits", LANG, splits=splits, diff=(out - want).abs().max()))
program_grid_figure(program_grid([0, 1, 2], context_lens.tolist(), tables, block_size, heads, kv_heads, num_splits=2), lang=LANG)
plt.show()

# %% [markdown]
# ## Exercise
# Complete `decode_one`: one sequence's decode attention, reading its paged cache **one block at a
# time** with an online softmax (the kernel's loop, in torch). Fill in the three `None`s. The check
# compares it with `paged_attention_reference` on the three sequences above, then with logits a hundred
# times larger, where a softmax without the running max overflows.

# %% tags=["exercise"]
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
        alpha = None  # TODO(student): factor that rescales l and acc from the old max to the new one
        p = None  # TODO(student): exp of this block's logits under the new max, [num_heads, n]
        l = l * alpha + p.sum(dim=1)
        acc = acc * alpha[:, None] + torch.einsum("hn,nhd->hd", p, v)
        m = m_new
    return None  # TODO(student): the normalised output


# %% tags=["check"]
def check():
    from visualize.i18n import t  # the check's messages, in the notebook's language
    for size, q in (("normal", query), ("100x larger", query * 100)):
        ref = paged_attention_reference(q, key_cache, value_cache, block_tables, context_lens, scale)
        try:
            mine = torch.stack([
                decode_one(q[s], key_cache, value_cache, block_tables[s].tolist(), int(context_lens[s]), scale)
                for s in range(len(context_lens))
            ])
        except Exception as e:
            return t("l5_fail_raised", LANG, error=f"{type(e).__name__}: {e}")
        error = (mine - ref).abs().max().item()
        if not error < 1e-4:
            return t("l5_fail_diff", LANG, size=t(f"l5_size_{size}", LANG), value=f"{error:.3g}")
    return t("l5_pass", LANG)


print(check())
