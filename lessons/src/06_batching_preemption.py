# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown] lang="en"
# # Lesson 6 — Continuous batching and preemption
#
# **Goal:** compare static batching with iteration-level (continuous) batching on the same requests,
# watch what the engine does when its KV pool runs out (preemption by recompute), measure the
# block-size trade-off with the simulator, preempt by swapping instead of recomputing, and see chunked
# prefill keep the decodes running beside a long prompt.
#
# - **Static batching**: take a batch of requests, run it until *every* request in it is done, then take
#   the next batch. A finished request's place stays empty while the longest one runs on.
# - **Continuous batching** (Orca's iteration-level scheduling, used by vLLM): the scheduler decides the
#   batch again **every step**; a finished request leaves at once and a waiting one takes its place.

# %% [markdown] lang="zh"
# # 第 6 课　连续批处理与抢占
#
# **目标**：在同一组请求上比较静态批处理与迭代级（连续）批处理；观察 KV 池耗尽时引擎怎么做（通过重计算进行抢占）；用模拟器测量块大小的取舍；改用交换（swap）代替重计算进行抢占；并看分块预填充如何在长提示词预填充期间让正在进行的解码照常推进。
#
# - **静态批处理**（static batching）：取一批请求，一直运行到这批里*每个*请求都结束，再取下一批。已经结束的请求留下的位置会一直空着，直到最长的那个请求跑完。
# - **连续批处理**（continuous batching，即 Orca 的迭代级调度（iteration-level scheduling），vLLM 也采用它）：调度器（scheduler）**每一步**都重新决定这一批；结束的请求立即离开，等待中的请求马上补上它的位置。

# %%
# Make `engine` importable when this notebook is opened from lessons/<lang>/ without `pip install -e .`
import pathlib
import sys

try:
    import engine  # noqa: F401
except ImportError:
    sys.path.insert(0, str(next(p for p in pathlib.Path.cwd().resolve().parents if (p / "engine").is_dir())))

import matplotlib.pyplot as plt

from engine import LLM, SamplingParams, simulate
from engine.report import PREEMPT

from visualize.i18n import t
from visualize.style import use_cjk_font

LANG = "en"  # the language of the charts and of the check's messages
use_cjk_font()  # so that 中文 chart labels are drawn, not boxes

# %% [markdown] lang="en"
# ## 1. Static vs continuous batching, same requests
# Eight requests arrive together, asking for very different numbers of tokens; at most 4 run at once.
# Static batching is the engine driven by hand: admit 4, step until all 4 finish, admit the next 4.

# %% [markdown] lang="zh"
# ## 1. 同一组请求：静态批处理 vs 连续批处理
# 八个请求同时到达，要求生成的 token 数差别很大；最多同时运行 4 个。这里手动驱动引擎来做静态批处理：接纳 4 个，一步步运行直到这 4 个都结束，再接纳下 4 个。下面的 `run(lengths, batch_size)` 按给定的输出长度运行一组请求：`batch_size=None` 表示连续批处理（全部请求一次排队，调度器每一步补位）；取整数时表示静态批处理，每批这么多个请求，每批都运行到底。它返回请求 id 和各步的步报告。

# %%
llm = LLM(max_num_seqs=4)
eng = llm.engine
prompt = "Write a short poem about memory."
lengths = [4, 24, 6, 20, 3, 22, 8, 16]


def run(lengths, batch_size):
    """Run requests with these output lengths. batch_size=None: continuous batching (all queued at
    once, the scheduler refills every step); an int: static batches of that many, each run to the end.
    Returns (request ids, step reports)."""
    groups = [lengths] if batch_size is None else [lengths[i : i + batch_size] for i in range(0, len(lengths), batch_size)]
    ids, reports = [], []
    for group in groups:
        ids += [eng.add_request(prompt, SamplingParams(max_tokens=n, ignore_eos=True)) for n in group]
        while eng.has_unfinished_requests():
            reports.append(eng.step())
    return ids, reports


runs = {"static": run(lengths, batch_size=4), "continuous": run(lengths, batch_size=None)}

# %%
fig, axes = plt.subplots(1, 2, figsize=(12, 3), sharey=True)
for ax, (name, (ids, reports)) in zip(axes, runs.items()):
    for i, rid in enumerate(ids):
        steps = [k for k, r in enumerate(reports) if any(s.request_id == rid for s in r.scheduled)]
        ax.broken_barh([(k, 1) for k in steps], (i - 0.4, 0.8), color=f"C{i % 10}")
    ax.set_title(t("lc_l6_batching_title", LANG, name=t(f"lc_l6_{name}", LANG), n=len(reports)))
    ax.set_xlabel(t("lc_step", LANG))
axes[0].set_yticks(range(len(lengths)), [t("lc_l6_n_tokens", LANG, n=n) for n in lengths])
plt.show()

# %% [markdown] lang="en"
# Each bar is a request; a step's column shows which requests ran in it. In static batching the 4-token
# request's slot idles until the 24-token request of its batch is done. Now the numbers: throughput
# (generated tokens per second of engine time) and latency (steps from arrival, at step 0, to the last token).

# %% [markdown] lang="zh"
# 每一条代表一个请求；每一步的那一列显示这一步有哪些请求在运行。在静态批处理中，4 个 token 的请求结束后，它的位置一直空闲，直到同批里 24 个 token 的请求完成。下面看具体数字：吞吐量（throughput，引擎每运行一秒生成的 token 数）和延迟（latency，从到达——第 0 步——到最后一个 token 的步数）。

# %%
for name, (ids, reports) in runs.items():
    seconds = sum(r.timings_ms["total"] for r in reports) / 1e3
    finish = {rid: k for k, r in enumerate(reports) for rid in r.finished}
    latency = sum(finish[rid] + 1 for rid in ids) / len(ids)
    print(t("lp6_batching", LANG, name=t(f"lc_l6_{name}", LANG), steps=len(reports), rate=sum(lengths) / seconds, latency=latency))

# %% [markdown] lang="en"
# Continuous batching needs fewer steps for the same tokens, so throughput rises and the mean request
# finishes sooner. (The paper builds on Orca's iteration-level scheduling, §2.3 and §4.5.)
#
# ## 2. When the pool runs out: preemption by recompute
# vLLM admits requests without reserving room for their future tokens. If a running request needs a new
# block and none is free, the scheduler **preempts** the most recently admitted request: its blocks are
# freed and it returns to the front of the queue; later it is prefilled again with its prompt and the
# tokens it had produced (**recompute**, paper §4.5). The other option, swapping blocks to CPU memory,
# costs comparable time at block sizes 16–64 (paper §7.3). Here: a pool of just 10 blocks of 4 tokens.

# %% [markdown] lang="zh"
# 连续批处理用更少的步数生成同样多的 token，所以吞吐量更高，请求平均也更早结束。（论文建立在 Orca 的迭代级调度之上，见 §2.3 和 §4.5。）
#
# ## 2. 池子用完时：通过重计算进行抢占
# vLLM 接纳请求时不会为它将来的 token 预留空间。如果某个运行中的请求需要新块而没有空闲块，调度器就会**抢占**（preempt）最近接纳的那个请求：释放它的块，把它放回队列最前面；之后再用它的提示词加上已生成的 token 重新预填充（**重计算**，recompute，论文 §4.5）。另一种做法是把块换出到 CPU 内存（**交换**，swap），在块大小为 16–64 时两者耗时相当（论文 §7.3）。这里的池只有 10 个块，每块 4 个 token。

# %%
tight = LLM(num_gpu_blocks=10, block_size=4)
questions = ["Why is the sky blue?", "What is a block table?", "Name a prime number."]
params = SamplingParams(max_tokens=14, ignore_eos=True)
t_reports = []
tight_out = tight.generate(questions, params, on_step=t_reports.append)
roomy_out = llm.generate(questions, params)  # the 512-block pool of section 1
for o in tight_out:
    print(t("lp6_preempted", LANG, rid=o.request_id, n=o.num_preemptions))
print(t("lp6_same_text", LANG, same=t("yes" if [o.text for o in tight_out] == [o.text for o in roomy_out] else "no", LANG)))

# %%
held = [[next((len(s.block_table) for s in r.block_tables if s.request_id == rid), 0) for r in t_reports]
        for rid in range(len(questions))]
fig, ax = plt.subplots(figsize=(8, 2.8))
ax.stackplot(range(len(t_reports)), *held, step="post", labels=[f"{t('request', LANG)} {rid}" for rid in range(len(questions))])
for k, r in enumerate(t_reports):
    for rid in r.preempted:
        ax.annotate(t("lc_l6_preempted", LANG, rid=rid), (k, tight.engine.num_blocks), xytext=(k, tight.engine.num_blocks + 2),
                    arrowprops=dict(arrowstyle="->"), ha="center", fontsize=8)
ax.axhline(tight.engine.num_blocks, color="k", ls=":", label=t("lc_l6_pool_size", LANG))
ax.set_ylim(0, tight.engine.num_blocks + 4)
ax.set_xlabel(t("lc_step", LANG))
ax.set_ylabel(t("lc_l6_blocks_held", LANG))
ax.legend(fontsize=8, loc="upper right")
plt.show()
print(t("lp6_preempt_events", LANG, events=[(k, e.request_id) for k, r in enumerate(t_reports) for e in r.events if e.kind == PREEMPT]))

# %% [markdown] lang="en"
# A preempted request drops to 0 blocks and waits; when blocks free up it is prefilled again from
# scratch. The text is the same as with a large pool: recompute repeats the computation exactly; it only costs time.
#
# ## 3. Choosing the block size
# Small blocks waste little (at most one partly filled block per request) but give the attention kernel
# many small pieces to gather; large blocks are efficient to read but leave more of their last block
# empty. The simulator measures the memory side on the ShareGPT-like workload and the paper's pool
# (15.7K slots). The paper (§7.2) found block sizes 16–128 best on ShareGPT and chose 16 by default;
# the loss at small sizes comes from GPU kernel efficiency, which this simulator does not model.

# %% [markdown] lang="zh"
# 被抢占的请求持有的块降为 0 并开始等待；有块空出来后，它会从头重新预填充。生成的文本与大池子时完全相同：重计算精确地重复了原来的计算，只是多花了时间。
#
# ## 3. 选择块大小
# 小块浪费少（每个请求最多一个没填满的块），但注意力内核要收集许多零碎的小块；大块读起来高效，但最后一个块空着的部分更多。模拟器在类 ShareGPT 负载和论文的池大小（15.7K 槽位）上测量了显存这一面。论文（§7.2）发现在 ShareGPT 上块大小 16–128 最好，默认选 16；小块的损失来自 GPU 内核效率，而这个模拟器并不模拟这一点。

# %%
sizes = [1, 4, 16, 64, 128, 256, 512]
results = [simulate(workload="sharegpt", num_requests=1000, block_size=b, kv_slots=15_360) for b in sizes]
shares = [r.saturated() for r in results]
fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 3))
a1.plot(sizes, [100 * s["internal_fragmentation"] for s, _ in shares], "o-", color="tab:orange")
a1.set_ylabel(t("lc_l6_internal_share", LANG))
a2.plot(sizes, [c for _, c in shares], "o-")
a2.set_ylabel(t("lc_l6_running", LANG))
for ax in (a1, a2):
    ax.set_xscale("log", base=2)
    ax.set_xlabel(t("lc_l6_block_size", LANG))
    ax.axvspan(16, 128, color="green", alpha=0.1)
plt.show()

# %% [markdown] lang="en"
# Up to a few dozen tokens per block the waste stays small and the batch large; past 128 the last block
# of every request wastes enough to shrink the batch.
#
# ## 4. Swap instead of recompute (paper §4.5, §7.3)
# With `preemption_mode="swap"` the engine keeps a second block pool in CPU memory, the **swap space**, with
# the same block layout. A preempted request's blocks are copied there (`blocks_to_swap_out`: pairs of a GPU
# block and a CPU block) and copied back before it decodes on (`blocks_to_swap_in`): nothing is recomputed.
# While any request is swapped out no new request is admitted, and swapped requests come back before
# waiting ones. Below, the workload of section 2 both ways, each on a fresh engine over the same weights:
# the blocks moved, the tokens computed a second time, and the time the step reports spent copying
# (`timings_ms["swap"]`).

# %% [markdown] lang="zh"
# 每块几十个 token 以内，浪费都很小，批也很大；超过 128 之后，每个请求最后一个块浪费的空间多到足以让批变小。
#
# ## 4. 用交换代替重计算（论文 §4.5、§7.3）
# 设置 `preemption_mode="swap"` 后，引擎在 CPU 内存中另建一个块布局相同的块池，即**交换空间**（swap space）。被抢占请求的块被复制过去（`blocks_to_swap_out`：GPU 块与 CPU 块的配对），在它继续解码之前再复制回来（`blocks_to_swap_in`）：不重新计算任何东西。只要有请求被换出，就不接纳新请求；被换出的请求先于等待中的请求回来。下面把第 2 节的负载用两种方式各跑一遍，每次都用同一份权重新建引擎：比较移动的块数、被重计算的 token 数，以及步报告记下的复制耗时（`timings_ms["swap"]`）。

# %%
from engine import EngineConfig, LLMEngine
from engine.model_executor.model_loader import load_model

weights = load_model(None)  # the default model, read once for the fresh engines below


def run_engine(prompts, params, **config):
    """A fresh engine over `weights` runs `prompts` to the end; returns (outputs, step reports)."""
    fresh = LLMEngine(EngineConfig(**config), loaded_model=weights)
    ids = [fresh.add_request(p, params) for p in prompts]
    reports = []
    while fresh.has_unfinished_requests():
        reports.append(fresh.step())
    return [fresh.get_output(i) for i in ids], reports


needed = sum(r.num_tokens for r in run_engine(questions, params, num_gpu_blocks=64, block_size=4)[1])  # no preemption
modes = {}
for mode in ("recompute", "swap"):
    out, reports = run_engine(questions, params, num_gpu_blocks=10, block_size=4, preemption_mode=mode)
    modes[mode] = dict(preemptions=sum(len(r.preempted) for r in reports),
                       blocks_moved=sum(len(r.blocks_to_swap_out) + len(r.blocks_to_swap_in) for r in reports),
                       tokens_recomputed=sum(r.num_tokens for r in reports) - needed,
                       copy_ms=sum(r.timings_ms["swap"] for r in reports),
                       same_text=[o.text for o in out] == [o.text for o in roomy_out])
    m = modes[mode]
    print(t("lp6_mode", LANG, mode=t(f"l6_{mode}", LANG), preemptions=m["preemptions"], moved=m["blocks_moved"],
            recomputed=m["tokens_recomputed"], ms=m["copy_ms"], same=t("yes" if m["same_text"] else "no", LANG)))

# %%
from visualize.i18n import t  # the new charts' texts, in the notebook's language
from visualize.style import use_cjk_font

use_cjk_font()  # before the axes exist, so that 中文 labels are not boxes

fig, axes = plt.subplots(1, 2, figsize=(8, 2.6))
names = [t(f"l6_{mode}", LANG) for mode in modes]
for ax, key in zip(axes, ("blocks_moved", "tokens_recomputed")):
    ax.bar(names, [m[key] for m in modes.values()], color=["tab:orange", "tab:purple"])
    ax.set_ylabel(t(f"l6_{key}", LANG))
plt.tight_layout()
plt.show()

# %% [markdown] lang="en"
# Recompute pays in compute: the preempted request's prompt and the tokens it had produced are prefilled
# again. Swap pays in copies: every block it held crosses to the CPU and back, and each token is computed
# once. The texts are the same both ways: both are exact.
#
# Which one is cheaper depends on the **block size** (paper §7.3, Figure 19). The same bytes move whatever
# the block size, but in blocks: small blocks mean many small copies. On a GPU each copy crosses PCIe with
# a cost of its own, so at block sizes 1–8 swapping is much slower than recomputing, while recompute does
# not depend on the block size; from 16 to 64 the two are comparable. Here the same 40 slots, cut into
# blocks of 1, 2, 4 and 8 tokens:

# %% [markdown] lang="zh"
# 重计算付出的是计算：被抢占请求的提示词和它已生成的 token 要重新预填充一遍。交换付出的是复制：它占用的每个块都要到 CPU 走一个来回，而每个 token 只计算一次。两种方式生成的文本相同：二者都是精确的。
#
# 哪种更便宜取决于**块大小**（论文 §7.3，图 19）。无论块多大，要移动的字节数都一样，但是按块移动：块越小，复制次数越多、每次越小。在 GPU 上每次复制都要经过 PCIe，各有一份固定开销，所以块大小为 1–8 时交换比重计算慢得多，而重计算与块大小无关；块大小在 16 到 64 之间时两者相当。下面把同样的 40 个槽位切成 1、2、4、8 个 token 的块：

# %%
sweep = {}
for bs in (1, 2, 4, 8):  # the same 40 slots, cut into blocks of bs tokens
    _, reports = run_engine(questions, params, num_gpu_blocks=40 // bs, block_size=bs, preemption_mode="swap")
    sweep[bs] = dict(copies=sum(len(r.blocks_to_swap_out) + len(r.blocks_to_swap_in) for r in reports),
                     ms=sum(r.timings_ms["swap"] for r in reports))
for bs, s in sweep.items():
    print(t("lp6_copies", LANG, bs=bs, copies=s["copies"], kib=bs * eng.bytes_per_slot / 1024, ms=s["ms"]))
fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 2.6))
a1.plot(list(sweep), [s["copies"] for s in sweep.values()], "o-", color="tab:purple")
a1.set_ylabel(t("l6_blocks_copied", LANG))
a2.plot(list(sweep), [s["ms"] for s in sweep.values()], "o-", color="tab:purple")
a2.set_ylabel(t("l6_copy_ms", LANG))
for ax in (a1, a2):
    ax.set_xscale("log", base=2)
    ax.set_xlabel(t("l6_block_size", LANG))
plt.tight_layout()
plt.show()

# %% [markdown] lang="en"
# Halve the block size and the number of copies doubles. (On this CPU the copies stay inside RAM, so the
# times are a few milliseconds and noisy on a shared machine; the count of copies is what carries over to a GPU.)
#
# ## 5. Chunked prefill: a long prompt no longer stalls the decodes
# Two short requests are decoding when a prompt of about 260 tokens arrives. Prefilled whole, the prompt
# makes one step long, and the two running requests get their next token only after that step. With
# chunked prefill (vLLM's `enable_chunked_prefill`) each step spends one token budget
# (`max_num_batched_tokens`): the running decodes first, then the next chunk of the prompt, which attends
# to its earlier chunks through its block table.

# %% [markdown] lang="zh"
# 块大小减半，复制次数就翻倍。（在这台 CPU 上复制只发生在内存之内，耗时只有几毫秒，在共享的机器上波动也大；能推广到 GPU 的是复制次数。）
#
# ## 5. 分块预填充：长提示词不再拖住解码
# 两个短请求正在解码时，来了一个约 260 个 token 的提示词。如果整段预填充，这个提示词会让某一步变得很长，两个正在运行的请求要等这一步结束才拿到下一个 token。启用分块预填充（vLLM 的 `enable_chunked_prefill`）后，每一步花同一份 token 预算（`max_num_batched_tokens`）：先给正在运行的解码，再给提示词的下一个**分块**（chunk）；这个分块通过块表读取前面各分块已写入的 K、V，参与注意力计算。

# %%
long_prompt = " ".join(["The lighthouse keeper wrote down the weather, the ships and the birds every evening."] * 16)
chunking = {}
for budget in (None, 32):  # None: every prompt prefilled whole; 32: chunked prefill with a 32-token budget
    mixed = LLMEngine(EngineConfig(num_gpu_blocks=128, enable_chunked_prefill=budget is not None,
                                   max_num_batched_tokens=budget), loaded_model=weights)
    for q in questions[:2]:
        mixed.add_request(q, SamplingParams(max_tokens=12, ignore_eos=True))
    reports = []
    while mixed.has_unfinished_requests():
        if len(reports) == 2:  # the long prompt arrives while the two short requests decode
            mixed.add_request(long_prompt, SamplingParams(max_tokens=2, ignore_eos=True))
        reports.append(mixed.step())
    chunking[budget] = reports
    decoding = [sum(s.phase == "decode" for s in r.scheduled) for r in reports]
    print(t("lp6_budget", LANG, budget=budget, steps=len(reports), tokens=max(r.num_tokens for r in reports),
            ms=max(r.timings_ms["total"] for r in reports), decoding=decoding))

# %%
fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 3))
for shift, (budget, reports) in zip((-0.2, 0.2), chunking.items()):
    label = t("l6_whole_prompt", LANG) if budget is None else t("l6_chunked", LANG, budget=budget)
    steps = [k + shift for k in range(len(reports))]
    a1.bar(steps, [r.num_tokens for r in reports], width=0.4, label=label)
    a2.bar(steps, [r.timings_ms["total"] for r in reports], width=0.4, label=label)
a1.axhline(32, color="k", ls=":", label=t("l6_budget", LANG, budget=32))
a1.set_ylabel(t("l6_tokens_per_step", LANG))
a2.set_ylabel(t("l6_step_ms", LANG))
for ax in (a1, a2):
    ax.set_xlabel(t("l6_step", LANG))
    ax.legend(fontsize=8)
plt.tight_layout()
plt.show()

# %% [markdown] lang="en"
# Without chunking one step computes the whole prompt and takes many times longer than a decode step: the
# decodes in it wait. With a budget of 32 no step computes more than 32 tokens and both decodes run in
# every step, so their time per token stays bounded. The price: the long prompt's first token comes a
# few steps later, and on this CPU the total time grows a little, since every step has a fixed cost (on
# a GPU a step of a few dozen tokens costs little more than a decode step, which is memory-bound: lesson 1).
#
# ## Exercise
# Six requests arrive together asking for 3, 9, 5, 12, 2 and 7 tokens, at most 4 at a time. A request
# asking for *n* tokens runs *n* steps (its prefill step produces the first token). In continuous
# batching a finished request's place is filled in the next step. Without running anything: how many
# steps does each strategy take?

# %% [markdown] lang="zh"
# 不分块时，有一步要计算整段提示词，耗时是解码步的许多倍：这一步里的解码只能等着。预算为 32 时，没有哪一步计算超过 32 个 token，两个解码每一步都在运行，所以它们生成每个 token 的时间（token 间延迟）有上限。代价是：长提示词的第一个 token 要晚几步才出来；在这台 CPU 上总时间也略有增加，因为每一步都有固定开销（在 GPU 上，几十个 token 的一步只比解码步贵一点，因为解码是访存受限的：见第 1 课）。
#
# ## 练习
# 六个请求同时到达，分别要求生成 3、9、5、12、2、7 个 token，最多同时运行 4 个。要求 *n* 个 token 的请求运行 *n* 步（它的预填充步产生第一个 token）。在连续批处理中，请求结束后它的位置在下一步就会被补上。不运行任何代码：两种策略各需要多少步？

# %%
exercise_lengths = [3, 9, 5, 12, 2, 7]

# %% tags=["exercise"]
static_steps = None  # TODO(student)
continuous_steps = None  # TODO(student)

# %% tags=["check"]
def check():
    from visualize.i18n import t  # the check's messages, in the notebook's language
    if static_steps is None or continuous_steps is None:
        return t("l6_fail_none", LANG)
    measured = {"static": len(run(exercise_lengths, 4)[1]), "continuous": len(run(exercise_lengths, None)[1])}
    for name, answer in (("static", static_steps), ("continuous", continuous_steps)):
        if answer != measured[name]:
            return t("l6_fail_steps", LANG, name=name, value=answer)
    return t("l6_pass", LANG, static=static_steps, continuous=continuous_steps)


print(check())

# %% [markdown] lang="en"
# ## Labs
# Write this lesson's parts of the engine yourself, graded in the engine: `admission` (Scheduler admission (vLLM v1), 30 min), `preemption` (Preemption: the victim, recompute or swap, 45 min), `swap` (Swapping: the block mapping out and in, 40 min), `chunked_prefill` (Chunked prefill: the chunk boundary and num_computed_tokens, 30 min). Copy the starter from `labs/starters/`, fill in the TODOs and run `python -m lessons grade <lab> --impl <your file>`; [the labs](../../docs/labs.md) explains each one.
# %% [markdown] lang="zh"
# ## 实验
# 亲手实现本课讲到的引擎部件，放进引擎中运行并评分：`admission`（vLLM v1 调度器的准入规则，30 分钟）、`preemption`（抢占：选择牺牲者，重计算或交换，45 分钟）、`swap`（交换：换出与换入的块映射，40 分钟）、`chunked_prefill`（分块预填充：分块边界与 num_computed_tokens，30 分钟）。从 `labs/starters/` 复制起始代码，完成其中的 TODO，然后运行 `python -m lessons grade <lab> --impl <你的文件>`；[实验说明](../../docs/labs.zh.md)逐一介绍每个实验。

# %% [markdown] lang="en"
# ## Self-check
# For discussion or an exam; the answers follow from this lesson.
# - **Warm-up.** What does continuous batching change compared with static batching, and which chart of this lesson shows it?
# - **Core.** The pool is full and a running request needs a new block. Which request does the scheduler preempt, and what happens to its blocks under recompute and under swap?
# - **Design.** When is swap cheaper than recompute? Name the quantities you would compare.
# %% [markdown] lang="zh"
# ## 自测题
# 供讨论或考试使用；答案都可以从本课推出。
# - **热身。**与静态批处理相比，连续批处理改变了什么？本课的哪张图能看出来？
# - **核心。**KV 池已满，一个运行中的请求需要一个新块。调度器抢占哪个请求？在重计算和交换两种方式下，它的块各会怎样？
# - **设计。**什么时候交换比重计算便宜？说出你要比较的量。
