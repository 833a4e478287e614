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
# # Lesson 7 — Sharing memory: fork, copy-on-write, parallel sampling, beam search
#
# **Goal:** watch several sequences of one request share KV blocks through their block tables, see a
# shared block copied at the first write into it, and measure how much memory parallel sampling and
# beam search save.
#
# Block tables do more than remove fragmentation (lessons 3 and 4): two block tables may point at the
# *same* physical block. The PagedAttention paper (§4.4) borrows the rest of the operating-system idea:
#
# | operating system | PagedAttention |
# |---|---|
# | `fork()` of a process: the child gets a copy of the page table | **fork**: a new sequence copies its parent's block table; nothing is copied in memory |
# | a reference count per physical page | a **refcount** per physical block: how many block tables hold it |
# | copy-on-write: the first write into a shared page copies it | **copy-on-write**: a sequence about to write into a block with refcount > 1 first gets a new block and copies the old one into it |
#
# One request that owns several sequences is a **sequence group** (vLLM's name). It is scheduled,
# preempted and finished as a unit.

# %%
# Make `engine` importable when this notebook is opened from lessons/<lang>/ without `pip install -e .`
import pathlib
import sys

try:
    import engine  # noqa: F401
except ImportError:
    sys.path.insert(0, str(next(p for p in pathlib.Path.cwd().resolve().parents if (p / "engine").is_dir())))

import matplotlib.pyplot as plt
import torch

from engine import LLM, BeamSearchParams, SamplingParams
from engine.report import COPY_ON_WRITE, FORK, FREE
from visualize import series_figure, t
from visualize.style import use_cjk_font

LANG = "en"

# %% [markdown]
# ## 1. The paper's Figure 8 on the real model
# Figure 8 of the paper: a prompt is sampled twice (`n = 2`). Both samples share the prompt's blocks;
# the last prompt block is only partly filled, so the first sample that writes its next token into it
# must not overwrite what the other sample sees.
#
# The default model with vLLM's block size of 16 tokens and a pool of 64 blocks (`LLM(**config)` passes
# them to `EngineConfig(block_size=16, num_gpu_blocks=64)`). The chat prompt below is 38 tokens: two full
# blocks and 6 tokens in a third.

# %%
llm = LLM(block_size=16, num_gpu_blocks=64)
eng = llm.engine
block_size = eng.config.block_size
prompt = [{"role": "user", "content": "Write a haiku about autumn leaves."}]
prompt_len = len(eng.encode(prompt))
print(t("lp7_prompt", LANG, n=prompt_len, full=prompt_len // block_size, rest=prompt_len % block_size))


def show_tables(report):
    for s in report.block_tables:
        print(t("lp7_table", LANG, index=s.index, seq=s.seq_id, table=s.block_table, refs=s.ref_counts, filled=s.filled))


# %% [markdown]
# We drive the engine one step at a time. The first step is the prompt's **one** prefill: sample 0 computes
# the prompt, then sample 1 is *forked* from it (a `FORK` event). Both block tables point at the same
# three blocks, each with refcount 2.

# %%
request_id = eng.add_request(prompt, SamplingParams(n=2, temperature=0.8, seed=2, max_tokens=3, ignore_eos=True))
prefill = eng.step()
print(t("lp7_events", LANG, events=[(e.kind, e.seq_id, e.parent_seq_id, e.block_id, e.detail) for e in prefill.events if e.kind != "write"]))
show_tables(prefill)
last = prefill.block_tables[0].block_table[-1]  # the partly filled last prompt block, shared
held = prefill.block_tables[0].filled[-1]  # its filled slots
before = [(k[last].clone(), v[last].clone()) for k, v in eng.runner.kv_caches]  # its K and V in every layer

# %% [markdown]
# The second step is the first decode step: each sample writes the K and V of the token it sampled at position 38,
# which lies in the shared block. The first writer sees refcount 2: the allocator gives it a new block,
# drops the old block's refcount to 1, and returns the pair `(src, dst)` (vLLM's `blocks_to_copy`).
# The engine copies the block's K and V in every layer (`copy_blocks`) before the forward pass, so the
# new token lands in the copy. The second writer now sees refcount 1: it is the last holder and writes
# in place. The two full prompt blocks stay shared: nobody writes into them again.

# %%
decode = eng.step()
cow = [e for e in decode.events if e.kind == COPY_ON_WRITE]
for e in cow:
    print(t("lp7_cow", LANG, seq=e.seq_id, logical=e.logical_index, src=e.block_id, dst=e.dst_block_id))
show_tables(decode)
src, dst = cow[0].block_id, cow[0].dst_block_id
caches = eng.runner.kv_caches
unchanged = all(torch.equal(k[src][:held], kb[:held]) and torch.equal(v[src][:held], vb[:held]) for (k, v), (kb, vb) in zip(caches, before))
copied = all(torch.equal(k[dst][:held], kb[:held]) and torch.equal(v[dst][:held], vb[:held]) for (k, v), (kb, vb) in zip(caches, before))
print(t("lp7_unchanged", LANG, block=src, held=held, layers=len(caches), same=t("yes" if unchanged else "no", LANG)))
print(t("lp7_copied", LANG, block=dst, same=t("yes" if copied else "no", LANG)))
first_tokens = {s.seq_id: eng.tokenizer.decode(s.token_ids[prompt_len]) for s in eng.requests[request_id].seqs}
print(t("lp7_differs", LANG, slot=held, position=prompt_len, differs=t("no" if torch.equal(caches[0][0][src][held], caches[0][0][dst][held]) else "yes", LANG),
        first=first_tokens))
while eng.has_unfinished_requests():
    eng.step()
for o in eng.get_output(request_id).outputs:
    print(t("lp7_sample", LANG, index=o.index, text=o.text))

# %% [markdown]
# ## 2. Parallel sampling, n = 4
# Now four samples of the same prompt. After the prefill all four hold the same three blocks
# (refcount 4); at the first decode step three of them copy the last prompt block and the fourth
# writes in place, so two blocks stay shared until the end.
#
# `StepReport.memory` counts each physical block once (`blocks_with_sharing`) and also the blocks the
# live sequences would need if nothing were shared, the sum of their block tables' lengths
# (`blocks_without_sharing`). The paper's §6.3 measure is
#
# $$\text{memory saved by sharing} = \frac{\text{blocks saved by sharing}}{\text{blocks needed without sharing}} = 1 - \frac{\texttt{blocks\_with\_sharing}}{\texttt{blocks\_without\_sharing}}$$
#
# (`MemoryUsage.memory_saved_by_sharing`).

# %%
p_reports = []
parallel = llm.generate(prompt, SamplingParams(n=4, temperature=0.8, seed=0, max_tokens=10, ignore_eos=True), on_step=p_reports.append)
p_live = [r for r in p_reports if r.block_tables]  # the last step finishes the request: no tables left
for k, r in enumerate(p_live):
    m = r.memory
    events = sorted({e.kind for e in r.events if e.kind in (FORK, COPY_ON_WRITE)})
    print(t("lp7_step", LANG, k=k, with_sharing=m.blocks_with_sharing, without=m.blocks_without_sharing,
            saved=m.memory_saved_by_sharing, events=events or ""))
show_tables(p_live[-1])
for o in parallel[0].outputs:
    print(t("lp7_sample", LANG, index=o.index, text=o.text))

# %% [markdown]
# The paper measures 6.1–9.8 % saved for parallel sampling (n = 2…6) on Alpaca and 16.2–30.5 % on
# ShareGPT (§6.3, Figure 15), far less than here: there outputs run to hundreds of tokens, each
# sample's own blocks grow with its output, while what is shared (the full prompt blocks) stays the
# same. Ten tokens of output against a 38-token prompt is the most favourable case.
#
# ## 3. Beam search, width 4
# Beam search keeps the `beam_width` best sequences (by cumulative log-probability). Each step every
# live beam proposes candidates; the best 4 survive. A surviving candidate **forks** its parent (block
# table copied, refcounts + 1; the parent itself carries on as its first survivor). A beam with no
# surviving candidate is **pruned**: its block table is freed at once. Its blocks go back to the free
# list if nobody else holds them (`FREE` with an empty detail); the blocks still shared only lose a
# reference ("still shared"). Beams share far more than samples: a whole common prefix, not only the
# prompt (paper Figure 9).

# %%
b_reports = []
beams = llm.beam_search(prompt, BeamSearchParams(beam_width=4, max_tokens=8), on_step=b_reports.append)
for k, r in enumerate(b_reports):
    forks = [f"{e.parent_seq_id}->{e.seq_id}" for e in r.events if e.kind == FORK]
    cows = [f"{e.block_id}->{e.dst_block_id}" for e in r.events if e.kind == COPY_ON_WRITE]
    freed = sorted({e.seq_id for e in r.events if e.kind == FREE})
    returned = [e.block_id for e in r.events if e.kind == FREE and not e.detail]
    gone = t("lp7_finished" if r.finished else "lp7_pruned", LANG)
    print(t("lp7_beam_step", LANG, k=k, beams=[s.seq_id for s in r.block_tables], forks=forks, cows=cows, gone=gone,
            freed=freed, returned=returned, blocks=r.memory.blocks_with_sharing, saved=r.memory.memory_saved_by_sharing))
for o in beams[0].sequences:
    print(t("lp7_beam", LANG, index=o.index, logprob=o.cumulative_logprob, text=o.text))

# %% [markdown]
# The paper measures 37.6–55.2 % saved for beam widths 2…6 on Alpaca and 44.3–66.3 % on ShareGPT.
# Both runs side by side: the gap between the two lines is the memory saved by sharing.

# %%
use_cjk_font()  # before the axes exist: their title and axis labels take the font they are made with
fig, axes = plt.subplots(1, 2, figsize=(11, 3))
for ax, reports, title in ((axes[0], p_reports, t("l7_parallel_sampling", LANG, n=4)),
                           (axes[1], b_reports, t("l7_beam_search", LANG, width=4))):
    steps = list(range(len(reports)))
    series = {t("l7_blocks_without_sharing", LANG): (steps, [r.memory.blocks_without_sharing for r in reports]),
              t("l7_blocks_with_sharing", LANG): (steps, [r.memory.blocks_with_sharing for r in reports])}
    series_figure(series, t("blocks", LANG), lang=LANG, title=title, ax=ax)
plt.show()

# %% [markdown]
# ## 4. Preemption of a group
# When memory runs out the scheduler preempts a whole group, newest first, never one sequence of it
# (paper §4.5): its sequences depend on each other's shared blocks. This engine preempts by
# **recompute**: every sequence's blocks are freed, and later the group is prefilled again as its
# prompt plus each sequence's own generated tokens, with the full prompt blocks shared once more.
# vLLM can also **swap** a group's blocks out to CPU memory and back in.
#
# ## Exercise
# A new request asks for `n = 4` samples of the prompt below. Look at the step in which every sample
# holds `prompt_len + output_len` token states (its prompt and its first `output_len` generated
# tokens) in the KV cache. Without looking at the engine's report, compute:
#
# - `blocks_saved`: blocks saved by sharing, `blocks_without_sharing - blocks_with_sharing`;
# - `memory_saved`: the paper's measure, `blocks_saved / blocks_without_sharing`.
#
# The rule: each sample's block table has `ceil(tokens / block_size)` blocks. The full prompt blocks
# are shared by all 4 samples (refcount 4) for the whole run. The partly filled last prompt block is
# copied at the first write by all but one sample, so from then on it is no longer shared; neither is
# any block a sample fills with its own tokens.

# %%
exercise_prompt = "Here is a list of five simple ways to save energy at home, each with a one-line explanation of why it helps:"
exercise_len = len(eng.encode(exercise_prompt))
output_len = 7
e_reports = []
llm.generate(exercise_prompt, SamplingParams(n=4, temperature=0.8, seed=1, max_tokens=output_len + 2, ignore_eos=True), on_step=e_reports.append)
exercise_report = next(r for r in e_reports if r.block_tables and all(sum(s.filled) == exercise_len + output_len for s in r.block_tables))
print("block_size =", block_size, " n = 4  prompt_len =", exercise_len, " output_len =", output_len)

# %% tags=["exercise"]
blocks_saved = None  # TODO(student)
memory_saved = None  # TODO(student): a fraction, 0..1

# %% tags=["check"]
def check():
    from visualize.i18n import t  # the check's messages, in the notebook's language
    m = exercise_report.memory
    saved = m.blocks_without_sharing - m.blocks_with_sharing
    if blocks_saved is None or memory_saved is None:
        return t("l7_fail_none", LANG)
    if blocks_saved != saved:
        return t("l7_fail_blocks", LANG, value=blocks_saved)
    if abs(memory_saved - m.memory_saved_by_sharing) > 1e-3:
        return t("l7_fail_share", LANG, value=memory_saved)
    return t("l7_pass", LANG, saved=saved, without=m.blocks_without_sharing, share=f"{m.memory_saved_by_sharing:.1%}")


print(check())
