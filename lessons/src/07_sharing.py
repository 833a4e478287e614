# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown] lang="en"
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

# %% [markdown] lang="zh"
# # 第 7 课　共享显存：派生（fork）、写时复制、并行采样与束搜索
#
# **目标**：观察同一个请求的多个序列如何通过各自的块表共享 KV 块；看到共享块在第一次被写入时被复制；并测量并行采样和束搜索节省了多少显存。
#
# 块表的作用不只是消除碎片（第 3、4 课）：两个块表可以指向*同一个*物理块。PagedAttention 论文（§4.4）借用了操作系统思想的另一半：
#
# | 操作系统 | PagedAttention |
# |---|---|
# | 进程的 `fork()`：子进程得到一份页表的副本 | **派生**（fork）：新序列复制父序列的块表；显存中什么都不复制 |
# | 每个物理页一个引用计数 | 每个物理块一个**引用计数**（refcount）：有多少个块表持有它 |
# | 写时复制：第一次写共享页时才复制它 | **写时复制**（copy-on-write）：序列要写入引用计数 > 1 的块时，先拿到一个新块，把旧块复制进去 |
#
# 拥有多个序列的一个请求称为**序列组**（sequence group，vLLM 的名称）。它作为一个整体被调度、抢占和结束。

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

# %% [markdown] lang="en"
# ## 1. The paper's Figure 8 on the real model
# Figure 8 of the paper: a prompt is sampled twice (`n = 2`). Both samples share the prompt's blocks;
# the last prompt block is only partly filled, so the first sample that writes its next token into it
# must not overwrite what the other sample sees.
#
# The default model with vLLM's block size of 16 tokens and a pool of 64 blocks (`LLM(**config)` passes
# them to `EngineConfig(block_size=16, num_gpu_blocks=64)`). The chat prompt below is 38 tokens: two full
# blocks and 6 tokens in a third.

# %% [markdown] lang="zh"
# ## 1. 在真实模型上重现论文的图 8
# 论文图 8：同一个提示词被采样两次（`n = 2`）。两个样本共享提示词的块；最后一个提示词块只填了一部分，所以第一个往里写下一个 token 的样本不能覆盖另一个样本看到的内容。
#
# 使用默认模型、vLLM 的块大小 16 个 token、64 个块的池（`LLM(**config)` 把它们传给 `EngineConfig(block_size=16, num_gpu_blocks=64)`）。下面的对话提示词有 38 个 token：两个满块，外加第三个块里的 6 个 token。

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


# %% [markdown] lang="en"
# We drive the engine one step at a time. The first step is the prompt's **one** prefill: sample 0 computes
# the prompt, then sample 1 is *forked* from it (a `FORK` event). Both block tables point at the same
# three blocks, each with refcount 2.

# %% [markdown] lang="zh"
# 我们一步一步地驱动引擎。第一步是提示词**唯一的一次**预填充：样本 0 计算提示词，然后从它派生出样本 1（一个 `FORK` 事件）。两个块表指向相同的三个块，每个块的引用计数都是 2。

# %%
request_id = eng.add_request(prompt, SamplingParams(n=2, temperature=0.8, seed=2, max_tokens=3, ignore_eos=True))
prefill = eng.step()
print(t("lp7_events", LANG, events=[(t(f"ev_{e.kind}", LANG), e.seq_id, e.parent_seq_id, e.block_id, e.detail) for e in prefill.events if e.kind != "write"]))
show_tables(prefill)
last = prefill.block_tables[0].block_table[-1]  # the partly filled last prompt block, shared
held = prefill.block_tables[0].filled[-1]  # its filled slots
before = [(k[last].clone(), v[last].clone()) for k, v in eng.runner.kv_caches]  # its K and V in every layer

# %% [markdown] lang="en"
# The second step is the first decode step: each sample writes the K and V of the token it sampled at position 38,
# which lies in the shared block. The first writer sees refcount 2: the allocator gives it a new block,
# drops the old block's refcount to 1, and returns the pair `(src, dst)` (vLLM's `blocks_to_copy`).
# The engine copies the block's K and V in every layer (`copy_blocks`) before the forward pass, so the
# new token lands in the copy. The second writer now sees refcount 1: it is the last holder and writes
# in place. The two full prompt blocks stay shared: nobody writes into them again.

# %% [markdown] lang="zh"
# 第二步是第一个解码步：每个样本把自己采样到的 token 的 K 和 V 写到位置 38，这个位置在共享块里。第一个写入者看到引用计数 2：分配器给它一个新块，把旧块的引用计数降到 1，并返回 `(src, dst)` 这一对（vLLM 的 `blocks_to_copy`）。引擎在前向计算之前，把这个块在每一层的 K 和 V 复制过去（`copy_blocks`），于是新 token 落在副本里。第二个写入者此时看到引用计数 1：它是最后一个持有者，直接原地写入。两个满的提示词块仍然共享：之后没有谁再写它们。

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

# %% [markdown] lang="en"
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

# %% [markdown] lang="zh"
# ## 2. 并行采样，n = 4
# 现在对同一个提示词采样四次。预填充之后四个样本持有相同的三个块（引用计数 4）；第一个解码步中，其中三个复制最后一个提示词块，第四个原地写入，所以有两个块一直共享到结束。
#
# `StepReport.memory` 对每个物理块只计一次（`blocks_with_sharing`），同时也统计如果什么都不共享，存活序列需要的块数，即它们块表长度之和（`blocks_without_sharing`）。论文 §6.3 的度量是
#
# $$\text{共享节省的显存} = \frac{\text{共享节省的块数}}{\text{不共享时需要的块数}} = 1 - \frac{\texttt{blocks\_with\_sharing}}{\texttt{blocks\_without\_sharing}}$$
#
# （`MemoryUsage.memory_saved_by_sharing`）。

# %%
p_reports = []
parallel = llm.generate(prompt, SamplingParams(n=4, temperature=0.8, seed=0, max_tokens=10, ignore_eos=True), on_step=p_reports.append)
p_live = [r for r in p_reports if r.block_tables]  # the last step finishes the request: no tables left
for k, r in enumerate(p_live):
    m = r.memory
    events = sorted({e.kind for e in r.events if e.kind in (FORK, COPY_ON_WRITE)})
    print(t("lp7_step", LANG, k=k, with_sharing=m.blocks_with_sharing, without=m.blocks_without_sharing,
            saved=m.memory_saved_by_sharing, events=t("sep_list", LANG).join(t(f"ev_{kind}", LANG) for kind in events)))
show_tables(p_live[-1])
for o in parallel[0].outputs:
    print(t("lp7_sample", LANG, index=o.index, text=o.text))

# %% [markdown] lang="en"
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

# %% [markdown] lang="zh"
# 论文测得并行采样（n = 2…6）在 Alpaca 上节省 6.1%–9.8%，在 ShareGPT 上节省 16.2%–30.5%（§6.3，图 15），远少于这里：那里的输出长达数百个 token，每个样本自己的块随输出增长，而共享的部分（满的提示词块）保持不变。38 个 token 的提示词只配 10 个 token 的输出，是最有利的情形。
#
# ## 3. 束搜索，宽度 4
# 束搜索保留 `beam_width` 个最好的序列（按累积对数概率）。每一步，每个存活的束提出候选；最好的 4 个存活下来。存活的候选从它的父束**派生**（复制块表，引用计数 + 1；父束自身则作为第一个存活的候选继续下去）。没有任何候选存活的束被**剪枝**：它的块表立刻被释放。如果没有别人持有，它的块回到空闲列表（`FREE` 事件，详情为空）；仍被共享的块只是少了一个引用（事件详情为 `still shared, refcount N`，中文界面显示为“其他序列仍持有”）。束之间共享的远比样本多：整个公共前缀，而不只是提示词（论文图 9）。

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

# %% [markdown] lang="en"
# The paper measures 37.6–55.2 % saved for beam widths 2…6 on Alpaca and 44.3–66.3 % on ShareGPT.
# Both runs side by side: the gap between the two lines is the memory saved by sharing.

# %% [markdown] lang="zh"
# 论文测得束宽 2…6 在 Alpaca 上节省 37.6%–55.2%，在 ShareGPT 上节省 44.3%–66.3%。下面把两次运行并排画出：两条线之间的差距就是共享节省的显存。

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

# %% [markdown] lang="en"
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

# %% [markdown] lang="zh"
# ## 4. 序列组的抢占
# 显存不够时，调度器抢占整个序列组（最新的先被抢占），而不会只抢占其中一个序列（论文 §4.5）：组内的序列依赖彼此共享的块。这个引擎用**重计算**（recompute）来抢占：每个序列的块都被释放，之后整个组作为“提示词 + 每个序列自己已生成的 token”重新预填充，满的提示词块再次共享。vLLM 还可以把一个组的块**换出**（swap out）到 CPU 内存，之后再**换入**（swap in）。
#
# ## 练习
# 一个新请求对下面的提示词要求 `n = 4` 个样本。看这样一步：每个样本在 KV 缓存中持有 `prompt_len + output_len` 个 token 状态（它的提示词和前 `output_len` 个生成的 token）。不看引擎的报告，计算：
#
# - `blocks_saved`：共享节省的块数，即 `blocks_without_sharing - blocks_with_sharing`；
# - `memory_saved`：论文的度量，`blocks_saved / blocks_without_sharing`。
#
# 规则：每个样本的块表有 `ceil(token 数 / block_size)` 个块。满的提示词块在整个运行中被 4 个样本共享（引用计数 4）。只填了一部分的最后一个提示词块，在第一次写入时被除一个样本以外的所有样本复制，所以此后它不再共享；样本用自己的 token 填的块也都不共享。

# %%
exercise_prompt = "Here is a list of five simple ways to save energy at home, each with a one-line explanation of why it helps:"
exercise_len = len(eng.encode(exercise_prompt))
output_len = 7
print("block_size =", block_size, " n = 4  prompt_len =", exercise_len, " output_len =", output_len)

# %% tags=["exercise"]
blocks_saved = None  # TODO(student)
memory_saved = None  # TODO(student): a fraction, 0..1

# %% tags=["check"]
def check():
    from visualize.i18n import t  # the check's messages, in the notebook's language
    # The engine runs the exercise only here, so that no report of it is on the page to read the answer from.
    e_reports = []
    llm.generate(exercise_prompt, SamplingParams(n=4, temperature=0.8, seed=1, max_tokens=output_len + 2, ignore_eos=True),
                 on_step=e_reports.append)
    m = next(r for r in e_reports if r.block_tables and all(sum(s.filled) == exercise_len + output_len for s in r.block_tables)).memory
    saved = m.blocks_without_sharing - m.blocks_with_sharing
    if blocks_saved is None or memory_saved is None:
        return t("l7_fail_none", LANG)
    if blocks_saved != saved:
        return t("l7_fail_blocks", LANG, value=blocks_saved)
    if abs(memory_saved - m.memory_saved_by_sharing) > 1e-3:
        return t("l7_fail_share", LANG, value=memory_saved)
    return t("l7_pass", LANG, saved=saved, without=m.blocks_without_sharing, share=f"{m.memory_saved_by_sharing:.1%}")


print(check())

# %% [markdown] lang="en"
# ## Labs
# Write this lesson's parts of the engine yourself, graded in the engine: `fork_cow` (Fork and copy-on-write, 45 min), `bug_cow` (Find the bug, 30 min). Copy the starter from `labs/starters/`, fill in the TODOs and run `python -m lessons grade <lab> --impl <your file>`; [the labs](../../docs/labs.md) explains each one.
# %% [markdown] lang="zh"
# ## 实验
# 亲手实现本课讲到的引擎部件，放进引擎中运行并评分：`fork_cow`（派生与写时复制，45 分钟）、`bug_cow`（找错误：派生与写时复制，30 分钟）。从 `labs/starters/` 复制起始代码，完成其中的 TODO，然后运行 `python -m lessons grade <lab> --impl <你的文件>`；[实验说明](../../docs/labs.zh.md)逐一介绍每个实验。

# %% [markdown] lang="en"
# ## Self-check
# For discussion or an exam; the answers follow from this lesson.
# - **Warm-up.** After a fork of n = 4 samples, what is the reference count of their shared prompt blocks?
# - **Core.** Two samples share a last block that is not full. Sample 1 writes its next token: which block is copied, and what are the reference counts afterwards?
# - **Design.** Beam search forks and prunes beams at every step. Why does paged memory save more for beam search than for parallel sampling?
# %% [markdown] lang="zh"
# ## 自测题
# 供讨论或考试使用；答案都可以从本课推出。
# - **热身。**n = 4 个样本派生之后，它们共享的提示词块的引用计数是多少？
# - **核心。**两个样本共享一个未满的最后一块。样本 1 写入下一个 token：哪个块被复制？之后各块的引用计数是多少？
# - **设计。**束搜索每一步都在派生和剪掉候选束。为什么分页管理在束搜索中省下的显存比在并行采样中更多？
