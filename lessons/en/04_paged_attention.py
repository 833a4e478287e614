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

# %% [markdown]
# ## 1. A small pool, three requests
# Tiny blocks (4 tokens) and a tiny pool (24 blocks) keep the pictures readable. `shuffle_blocks=True`
# hands blocks out in a random order, so that a request's blocks visibly land anywhere in the pool.

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

# %% [markdown]
# After the prefill, each request holds just enough blocks for its prompt. Each colour is one request;
# the filled part of a block is the share of its 4 slots that hold token states; a black border marks
# blocks touched during the step.

# %%
first = reports[0]
pool_map_figure(first, block_size, lang=LANG, columns=12)
plt.show()
block_tables_figure(first, block_size, lang=LANG)
plt.show()
for snap in first.block_tables:
    print(t("lp4_block_table", LANG, rid=snap.request_id, table=snap.block_table, filled=snap.filled))

# %% [markdown]
# ## 2. Watching the block tables grow
# During decode a request adds one token per step; every `block_size` tokens it needs one more block.
# When a request finishes, all its blocks return to the free list and can serve anyone.

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

# %% [markdown]
# ## 3. Slot mapping
# The pool is one long array of **slots**, `block_size` per block. Position *p* of a request lives in
#
# - logical block `p // block_size`, at offset `p % block_size`;
# - physical block `block_table[p // block_size]`;
# - slot `physical block × block_size + offset`.
#
# Each step the engine writes the new tokens' K and V to their slots (`slot_mapping`, the input of the
# cache-write kernel) and reports every write as a `WRITE` event.

# %%
for e in reports[1].events:
    if e.kind == WRITE:
        print(t("lp4_write", LANG, rid=e.request_id, position=e.position, block=e.block_id, slot=e.slot))
print(t("lp4_allocated_step", LANG, blocks=[(e.request_id, e.logical_index, e.block_id) for e in reports[1].events if e.kind == ALLOCATE]))

# %% [markdown]
# ## 4. The allocator
# Under the block tables is a plain free list with a reference count per block (`BlockAllocator`):
# `allocate` pops the front, `free` appends to the back. Reference counts above 1 are how blocks are
# shared between requests (copy-on-write, prefix caching; paper §4.4).

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

# %% [markdown]
# ## 5. How much is wasted?
# `StepReport.memory` sorts every slot of the pool into the paper's categories. For the paged allocator
# only *internal fragmentation* (the unfilled slots of last blocks) is ever wasted, less than one block
# per request.

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

# %% [markdown]
# ## Exercise
# Below is request 0's block table in the last step it was alive. During the run, the engine wrote the
# K and V of its token at `position` into the pool. Compute that physical `slot` from `table` and
# `block_size` alone.

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
