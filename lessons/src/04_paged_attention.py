# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown] lang="en"
# # Lesson 4 — PagedAttention: blocks, block tables, slots
#
# **Goal:** follow how the engine stores each request's KV cache in fixed-size blocks scattered over one
# shared pool, and read a token's physical place off its request's block table.
#
# The idea comes from virtual memory in operating systems (PagedAttention paper, §4.1–4.3):
#
# | operating system | PagedAttention |
# |---|---|
# | page | **block**: the K and V of `block_size` consecutive tokens |
# | a process's virtual pages | a request's **logical blocks** 0, 1, 2, … |
# | physical page frames | **physical blocks** of the KV pool |
# | page table | **block table**: logical block → physical block |
#
# A request takes a new block only when its last one is full, and any free block will do, so there is
# no reservation and no external fragmentation; the only waste is the unfilled tail of each request's
# last block.

# %% [markdown] lang="zh"
# # 第 4 课　PagedAttention：块、块表与槽位
#
# **目标**：跟踪引擎如何把每个请求的 KV 缓存存放在固定大小的块里，这些块分散在同一个共享池中；并学会从请求的块表里读出某个 token 的物理位置。
#
# 这个想法来自操作系统的虚拟内存（PagedAttention 论文 §4.1–4.3）：
#
# | 操作系统 | PagedAttention |
# |---|---|
# | 页（page） | **块**（block）：连续 `block_size` 个 token 的 K 和 V |
# | 进程的虚拟页 | 请求的**逻辑块**（logical block）0、1、2…… |
# | 物理页框 | KV 池中的**物理块**（physical block） |
# | 页表（page table） | **块表**（block table）：逻辑块 → 物理块 |
#
# 请求只有在最后一个块写满时才申请新块，而且任何空闲块都可以用，所以既没有预留（reservation），也没有外部碎片（external fragmentation）；唯一的浪费是每个请求最后一个块里没填满的部分。

# %%
# Make `engine` importable when this notebook is opened from lessons/<lang>/ without `pip install -e .`
import pathlib
import sys

try:
    import engine  # noqa: F401
except ImportError:
    sys.path.insert(0, str(next(p for p in pathlib.Path.cwd().resolve().parents if (p / "engine").is_dir())))

import matplotlib.pyplot as plt

from engine import LLM, SamplingParams
from engine.core.block_pool import BlockAllocator
from engine.report import ALLOCATE, FREE, WRITE
from visualize import block_tables_figure, pool_map_figure

from visualize.i18n import t
from visualize.style import use_cjk_font

LANG = "en"  # the language of the charts and of the check's messages
use_cjk_font()  # so that 中文 chart labels are drawn, not boxes

# %% [markdown] lang="en"
# ## 1. A small pool, three requests
# Tiny blocks (4 tokens) and a tiny pool (24 blocks) keep the pictures readable. `shuffle_blocks=True`
# hands blocks out in a random order, so that a request's blocks visibly land anywhere in the pool.

# %% [markdown] lang="zh"
# ## 1. 一个小池子，三个请求
# 用很小的块（4 个 token）和很小的池（24 个块），图才看得清。`shuffle_blocks=True` 让空闲块以随机顺序分出去，这样可以直观地看到一个请求的块落在池中的任意位置。

# %%
llm = LLM(block_size=4, num_gpu_blocks=24, shuffle_blocks=True)
eng = llm.engine
block_size = eng.config.block_size
prompts = ["Tell me a story about a cat.", "What is 2 + 2?", "Name three colours of the rainbow, please."]
params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in (14, 6, 10)]
reports = []
outputs = llm.generate(prompts, params, on_step=reports.append)
for o in outputs:
    print(t("lp4_request_tokens", LANG, rid=o.request_id, prompt=len(o.prompt_token_ids), generated=len(o.token_ids)))

# %% [markdown] lang="en"
# After the prefill, each request holds just enough blocks for its prompt. Each colour is one request;
# the filled part of a block is the share of its 4 slots that hold token states; a black border marks
# blocks touched during the step.

# %% [markdown] lang="zh"
# 预填充之后，每个请求持有的块刚好够放下它的提示词。每种颜色代表一个请求；块中填充的部分表示 4 个槽位中存有 token 状态的比例；黑色边框标出这一步中被改动过的块。

# %%
first = reports[0]
pool_map_figure(first, block_size, lang=LANG, columns=12)
plt.show()
block_tables_figure(first, block_size, lang=LANG)
plt.show()
for snap in first.block_tables:
    print(t("lp4_block_table", LANG, rid=snap.request_id, table=snap.block_table, filled=snap.filled))

# %% [markdown] lang="en"
# ## 2. Watching the block tables grow
# During decode a request adds one token per step; every `block_size` tokens it needs one more block.
# When a request finishes, all its blocks return to the free list and can serve anyone.

# %% [markdown] lang="zh"
# ## 2. 观察块表的增长
# 解码时请求每步增加一个 token；每增加 `block_size` 个 token 就需要一个新块。请求结束时，它的所有块都回到空闲列表（free list），可以分给任何请求。

# %%
fig, ax = plt.subplots(figsize=(7, 3))
for rid in range(len(prompts)):
    held = [next((len(s.block_table) for s in r.block_tables if s.request_id == rid), 0) for r in reports]
    ax.step(range(len(reports)), held, where="post", label=f"{t('request', LANG)} {rid}")
ax.step(range(len(reports)), [eng.num_blocks - r.memory.free // block_size for r in reports], "k:", where="post", label=t("lc_blocks_in_use", LANG))
ax.set_xlabel(t("lc_step", LANG))
ax.set_ylabel(t("lc_blocks", LANG))
ax.legend(fontsize=8)
plt.show()

# %%
done = next(r for r in reports if 1 in r.finished)  # the step request 1 finishes
fig, (a1, a2) = plt.subplots(2, 1, figsize=(7, 3.6))
pool_map_figure(reports[done.step - first.step - 1], block_size, lang=LANG, columns=12, ax=a1)
pool_map_figure(done, block_size, lang=LANG, columns=12, ax=a2)
plt.tight_layout()
plt.show()
print(t("lp4_freed_step", LANG, blocks=[e.block_id for e in done.events if e.kind == FREE]))

# %% [markdown] lang="en"
# ## 3. Slot mapping
# The pool is one long array of **slots**, `block_size` per block. Position *p* of a request lives in
#
# - logical block `p // block_size`, at offset `p % block_size`;
# - physical block `block_table[p // block_size]`;
# - slot `physical block × block_size + offset`.
#
# Each step the engine writes the new tokens' K and V to their slots (`slot_mapping`, the input of the
# cache-write kernel) and reports every write as a `WRITE` event.

# %% [markdown] lang="zh"
# ## 3. 槽位映射（slot mapping）
# KV 池可以看成一个很长的**槽位**（slot）数组，每个块有 `block_size` 个槽位。请求中位置 *p*（从 0 起算）上的 token 存放在：
#
# - 逻辑块 `p // block_size`，块内偏移 `p % block_size`；
# - 物理块 `block_table[p // block_size]`；
# - 槽位 `物理块 × block_size + 偏移`。
#
# 每一步，引擎把新 token 的 K 和 V 写入各自的槽位（即 `slot_mapping`，缓存写入内核的输入），并把每次写入记录为一个 `WRITE` 事件。

# %%
for e in reports[1].events:
    if e.kind == WRITE:
        print(t("lp4_write", LANG, rid=e.request_id, position=e.position, block=e.block_id, slot=e.slot))
print(t("lp4_allocated_step", LANG, blocks=[(e.request_id, e.logical_index, e.block_id) for e in reports[1].events if e.kind == ALLOCATE]))

# %% [markdown] lang="en"
# ## 4. The allocator
# Under the block tables is a plain free list with a reference count per block (`BlockAllocator`):
# `allocate` pops the front, `free` appends to the back. Reference counts above 1 are how blocks are
# shared between requests (copy-on-write, prefix caching; paper §4.4).

# %% [markdown] lang="zh"
# ## 4. 分配器（allocator）
# 块表之下是一个普通的空闲列表，每个块带一个引用计数（reference count）：这就是 `BlockAllocator`。`allocate` 从列表头部取块，`free` 把块放回列表尾部。引用计数大于 1 表示块被多个请求共享（写时复制（copy-on-write）、前缀缓存（prefix caching）；论文 §4.4）。

# %%
pool = BlockAllocator(num_blocks=6)
a, b, c = pool.allocate(), pool.allocate(), pool.allocate()
print(t("lp4_took", LANG, blocks=(a, b, c), free=list(pool.free_blocks)))
pool.free(b)
print(t("lp4_freed", LANG, block=b, free=list(pool.free_blocks)))
pool.incref(a)
print(t("lp4_shared", LANG, block=a, ref=pool.ref_counts[a]))
pool.free(a)
print(t("lp4_one_owner_frees", LANG, ref=pool.ref_counts[a], free=list(pool.free_blocks)))

# %% [markdown] lang="en"
# ## 5. How much is wasted?
# `StepReport.memory` sorts every slot of the pool into the paper's categories. For the paged allocator
# only *internal fragmentation* (the unfilled slots of last blocks) is ever wasted, less than one block
# per request.

# %% [markdown] lang="zh"
# ## 5. 浪费了多少？
# `StepReport.memory` 把池中的每个槽位归入论文中的几类。对分页分配器来说，唯一会浪费的是**内部碎片**（internal fragmentation，即最后一个块中未填满的槽位），每个请求不到一个块。

# %%
allocated = [r.memory.allocated for r in reports]
used = [r.memory.token_states for r in reports]
fig, ax = plt.subplots(figsize=(7, 2.8))
ax.bar(range(len(reports)), used, label=t("lc_token_states", LANG))
ax.bar(range(len(reports)), [a - u for a, u in zip(allocated, used)], bottom=used, label=t("lc_internal_fragmentation", LANG))
ax.set_xlabel(t("lc_step", LANG))
ax.set_ylabel(t("lc_slots", LANG))
ax.legend(fontsize=8)
plt.show()
print(t("lp4_worst_step", LANG, wasted=max(a - u for a, u in zip(allocated, used)), n=len(prompts), block_size=block_size))

# %% [markdown] lang="en"
# ## Exercise
# Below is request 0's block table in the last step it was alive. During the run, the engine wrote the
# K and V of its token at `position` into the pool. Compute that physical `slot` from `table` and
# `block_size` alone.

# %% [markdown] lang="zh"
# ## 练习
# 下面是请求 0 在它存活的最后一步时的块表。运行过程中，引擎把它在 `position` 位置的 token 的 K 和 V 写进了池中。请只用 `table` 和 `block_size` 算出这个物理槽位 `slot`。

# %%
table = [s.block_table for r in reports for s in r.block_tables if s.request_id == 0][-1]
position = 13
print("block_size =", block_size, " table =", table, " position =", position)

# %% tags=["exercise"]
slot = None  # TODO(student)

# %% tags=["check"]
def check():
    from visualize.i18n import t  # the check's messages, in the notebook's language
    written = [e.slot for r in reports for e in r.events if e.kind == WRITE and e.request_id == 0 and e.position == position]
    if slot is None:
        return t("l4_fail_none", LANG)
    if slot != written[0]:
        return t("l4_fail_slot", LANG, slot=slot, position=position)
    return t("l4_pass", LANG, position=position, block=table[position // block_size], slot=slot)


print(check())

# %% [markdown] lang="en"
# ## Labs
# Write this lesson's parts of the engine yourself, graded in the engine: `block_pool` (The block pool: allocate, free, free-list order, refcounts, 40 min), `slot_mapping` (Block tables and slot mapping, 30 min), `append_slot` (Appending a token: when a new block is needed, 30 min), `paged_attention` (Paged attention in torch, 60 min), `bug_refcount` (Find the bug, 30 min), `bug_slot` (Find the bug, 20 min). Copy the starter from `labs/starters/`, fill in the TODOs and run `python -m lessons grade <lab> --impl <your file>`; [the labs](../../docs/labs.md) explains each one.
# %% [markdown] lang="zh"
# ## 实验
# 亲手实现本课讲到的引擎部件，放进引擎中运行并评分：`block_pool`（块池：分配、释放、空闲列表顺序与引用计数，40 分钟）、`slot_mapping`（块表与槽位映射，30 分钟）、`append_slot`（追加 token：何时需要新块，30 分钟）、`paged_attention`（用 torch 写分页注意力，60 分钟）、`bug_refcount`（找错误：块池，30 分钟）、`bug_slot`（找错误：槽位映射，20 分钟）。从 `labs/starters/` 复制起始代码，完成其中的 TODO，然后运行 `python -m lessons grade <lab> --impl <你的文件>`；[实验说明](../../docs/labs.zh.md)逐一介绍每个实验。

# %% [markdown] lang="en"
# ## Self-check
# For discussion or an exam; the answers follow from this lesson.
# - **Warm-up.** What is the difference between a logical block and a physical block?
# - **Core.** With block size 16, a request's block table is [7, 2, 9]. Which slot holds its token at position 37?
# - **Design.** Paged allocation leaves at most one partly filled block per request. What does that bound internal fragmentation to, and what does a larger block size gain and cost?
# %% [markdown] lang="zh"
# ## 自测题
# 供讨论或考试使用；答案都可以从本课推出。
# - **热身。**逻辑块和物理块有什么区别？
# - **核心。**块大小为 16，一个请求的块表是 [7, 2, 9]。它在位置 37 的 token 存在哪个槽位？
# - **设计。**分页分配让每个请求最多留下一个未填满的块。这把内部碎片限制在多少以内？更大的块大小带来什么好处，又付出什么代价？
