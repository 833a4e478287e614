# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown] lang="en"
# # Lesson 5 — The PagedAttention decode kernel
#
# **Goal:** understand the three ideas inside the engine's Triton decode kernel — online softmax, grouped
# KV heads, split-K — run the kernel itself, and write a small version of it that reads a paged cache.
#
# A decode step gives each sequence one query per head. The kernel must compute
# softmax(**q** Kᵀ · scale) V over the sequence's whole context, whose K and V lie in blocks scattered
# over the pool. It never builds the full row of logits: it walks the context a tile at a time.

# %% [markdown] lang="zh"
# # 第 5 课　PagedAttention 解码内核
#
# **目标**：理解引擎的 Triton 解码内核（kernel）里的三个想法——在线 softmax（online softmax）、分组的 KV 头、split-K——亲手运行这个内核，并写一个读取分页缓存的简化版本。
#
# 在一个解码步中，每个序列的每个头只有一个查询。内核要在该序列的整个上下文上计算 softmax(**q** Kᵀ · `scale`) V，而这些 K 和 V 分散在池中各处的块里。内核从不构造完整的一行 logits：它一次处理上下文中的一小段（tile）。

# %%
# Make `engine` and `paged_kernels` importable when this notebook is opened from lessons/<lang>/ without `pip install -e .`
import pathlib
import sys

try:
    import engine  # noqa: F401
except ImportError:
    sys.path.insert(0, str(next(p for p in pathlib.Path.cwd().resolve().parents if (p / "engine").is_dir())))

import time

import matplotlib.pyplot as plt
import torch

import paged_kernels  # on a machine without a GPU this switches Triton to its interpreter
from engine import paged_attention_reference
from visualize import program_grid, program_grid_figure

from visualize.i18n import t
from visualize.style import use_cjk_font

LANG = "en"  # the language of the charts and of the check's messages
use_cjk_font()  # so that 中文 chart labels are drawn, not boxes
print(t("lp5_interpreter", LANG, on=t("yes" if paged_kernels.interpreted() else "no", LANG)))
if paged_kernels.unavailable_reason() is not None:  # no Triton here (it ships for Linux only)
    print(t("lp5_no_triton", LANG))

# %% [markdown] lang="en"
# ## 1. Online softmax
# softmax(x)ᵢ = exp(xᵢ − m) / Σⱼ exp(xⱼ − m), with m = max x so that no exponent overflows. Reading x in
# tiles, we keep three running values: the max **m** so far, the sum **l** of exp(x − m), and the
# weighted sum **acc** of values. When a tile raises the max from m to m′, everything accumulated is
# rescaled by α = exp(m − m′) (Milakov & Gimelshein 2018; FlashAttention).

# %% [markdown] lang="zh"
# ## 1. 在线 softmax
# softmax(x)ᵢ = exp(xᵢ − m) / Σⱼ exp(xⱼ − m)，其中 m = max x，保证指数不会溢出。按段读取 x 时，我们维护三个累积量：当前最大值（running max，即到目前为止见过的最大值）**m**、exp(x − m) 之和 **l**，以及值向量的加权和 **`acc`**。当某一段把最大值从 m 提高到 m′ 时，之前累积的一切都要乘以缩放因子 α = exp(m − m′)（Milakov & Gimelshein 2018；FlashAttention）。

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

# %% [markdown] lang="en"
# α is 1 when a tile does not raise the max, and 0 for the first tile (m starts at −∞). The result is
# exact: online softmax reorders the arithmetic, it does not approximate.
#
# ## 2. Grouped-query attention: one KV head serves a group of query heads
# SmolLM2 has 9 query heads and 3 KV heads: query head *h* reads KV head *h* // 3. The kernel loads a
# KV head's keys and values **once** for its whole group, dividing memory traffic by the group size.

# %% [markdown] lang="zh"
# 某一段没有抬高最大值时 α 为 1；第一段的 α 为 0（m 从 −∞ 开始）。结果是精确的：在线 softmax 只是重新安排了运算顺序，并不是近似。
#
# ## 2. 分组查询注意力：一个 KV 头服务一组查询头
# SmolLM2 有 9 个查询头、3 个 KV 头：第 *h* 个查询头读取第 *h* // 3 个 KV 头。内核为整组只加载**一次**该 KV 头的键和值，显存访问量因此降为原来的 1/组大小（此处为 1/3）。

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

# %% [markdown] lang="en"
# ## 3. The Triton kernel, running
# A tiny paged cache: 3 sequences, blocks of 4 tokens, block tables pointing anywhere in a 16-block pool.
# On a CPU the kernel runs in Triton's interpreter (slow, so the sizes stay tiny); on a GPU the same code
# is compiled. We compare it with the torch reference `paged_attention_reference`.

# %% [markdown] lang="zh"
# ## 3. 运行 Triton 内核
# 一个很小的分页缓存：3 个序列，每块 4 个 token，块表指向一个 16 块的池中的任意位置。在 CPU 上，内核运行在 Triton 的解释器（interpreter）里（很慢，所以规模保持极小）；在 GPU 上，同一份代码会被编译。我们把它和 torch 参考实现 `paged_attention_reference` 比较。

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
got = paged_kernels.paged_attention_decode(query, key_cache, value_cache, block_tables, context_lens, scale)
print(t("lp5_kernel", LANG, s=time.perf_counter() - start, diff=(got - want).abs().max()))

# %% [markdown] lang="en"
# On a GPU each Triton **program** handles one (sequence, KV head) pair: it loads the group's queries,
# then walks the context gathering, for every token, its block id from the block table.

# %% [markdown] lang="zh"
# 在 GPU 上，每个 Triton **程序**（program）处理一个（序列、KV 头）对：它加载该组的查询，然后遍历上下文，为每个 token 从块表中取出它所在的块号。

# %%
tables = [row[: -(-int(n) // block_size)].tolist() for row, n in zip(block_tables, context_lens)]
grid = program_grid([0, 1, 2], context_lens.tolist(), tables, block_size, heads, kv_heads)
program_grid_figure(grid, lang=LANG)
plt.show()

# %% [markdown] lang="en"
# ## 4. Split-K
# With few sequences and long contexts there are too few programs to fill a GPU's cores. vLLM's
# `paged_attention_v2` (the FlashDecoding idea) cuts each context into partitions handled by separate
# programs; each writes a partial output with its own max *mᵢ* and sum *lᵢ*, and a reduce kernel merges
# them with weights *lᵢ* · exp(*mᵢ* − max *m*). Same answer, more parallelism.

# %% [markdown] lang="zh"
# ## 4. Split-K
# 序列少、上下文长的时候，程序数量太少，填不满 GPU 的计算核心。vLLM 的 `paged_attention_v2`（采用了 FlashDecoding 的思路）把每个上下文切成若干分区（partition），由不同的程序处理；每个程序写出一个部分输出，附带自己的最大值 *mᵢ* 和求和 *lᵢ*，再由一个归约（reduce）内核以权重 *lᵢ* · exp(*mᵢ* − max *m*) 把它们合并。答案相同，并行度更高。

# %%
for splits in (1, 2, 4):
    out = paged_kernels.paged_attention_decode(query, key_cache, value_cache, block_tables, context_lens, scale, num_splits=splits)
    print(t("lp5_splits", LANG, splits=splits, diff=(out - want).abs().max()))
program_grid_figure(program_grid([0, 1, 2], context_lens.tolist(), tables, block_size, heads, kv_heads, num_splits=2), lang=LANG)
plt.show()

# %% [markdown] lang="en"
# ## Exercise
# Complete `decode_one`: one sequence's decode attention, reading its paged cache **one block at a
# time** with an online softmax (the kernel's loop, in torch). Fill in the three `None`s. The check
# compares it with `paged_attention_reference` on the three sequences above, then with logits a hundred
# times larger, where a softmax without the running max overflows.

# %% [markdown] lang="zh"
# ## 练习
# 补全 `decode_one`：单个序列的解码注意力，用在线 softmax **一次一个块**地读取它的分页缓存（也就是内核的循环，用 torch 写）。把三个 `None` 填上：
#
# - `alpha`：把 `l` 和 `acc` 从旧的当前最大值换算到新最大值 `m_new` 的缩放因子；
# - `p`：本块 logits 在新最大值下的 exp，形状 [num_heads, n]；
# - 返回值：归一化后的输出，形状 [num_heads, head_dim]。
#
# 检查单元格会在上面三个序列上把它与 `paged_attention_reference` 比较，然后再用放大一百倍的 logits 比较一次——不减去当前最大值的 softmax 在那时会溢出。

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

# %% [markdown] lang="en"
# ## Labs
# Write this lesson's parts of the engine yourself, graded in the engine: `triton_decode` (A Triton paged-attention decode kernel, 90 min). Copy the starter from `labs/starters/`, fill in the TODOs and run `python -m lessons grade <lab> --impl <your file>`; [the labs](../../docs/labs.md) explains each one.
# %% [markdown] lang="zh"
# ## 实验
# 亲手实现本课讲到的引擎部件，放进引擎中运行并评分：`triton_decode`（Triton 分页注意力解码内核，90 分钟）。从 `labs/starters/` 复制起始代码，完成其中的 TODO，然后运行 `python -m lessons grade <lab> --impl <你的文件>`；[实验说明](../../docs/labs.zh.md)逐一介绍每个实验。

# %% [markdown] lang="en"
# ## Self-check
# For discussion or an exam; the answers follow from this lesson.
# - **Warm-up.** Why can online softmax go through the context one tile at a time, without seeing every score first?
# - **Core.** For one decode query with a context of 4,096 tokens, head size 64 and float32, how many bytes of K and V does the kernel read? Why is that the number that sets its speed?
# - **Design.** When does split-K (several programs per sequence, then a reduction) pay, and when does it cost more than it saves?
# %% [markdown] lang="zh"
# ## 自测题
# 供讨论或考试使用；答案都可以从本课推出。
# - **热身。**为什么在线 softmax 可以一段一段地处理上下文，而不必先看到全部分数？
# - **核心。**一个解码查询，上下文 4,096 个 token，每头维数 64，float32：内核要读取多少字节的 K 和 V？为什么正是这个数决定了它的速度？
# - **设计。**split-K（每个序列用几个程序，最后再归约）什么时候划算？什么时候得不偿失？
