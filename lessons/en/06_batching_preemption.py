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

# %% [markdown]
# ## 1. Static vs continuous batching, same requests
# Eight requests arrive together, asking for very different numbers of tokens; at most 4 run at once.
# Static batching is the engine driven by hand: admit 4, step until all 4 finish, admit the next 4.

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

# %% [markdown]
# Each bar is a request; a step's column shows which requests ran in it. In static batching the 4-token
# request's slot idles until the 24-token request of its batch is done. Now the numbers: throughput
# (generated tokens per second of engine time) and latency (steps from arrival, at step 0, to the last token).

# %%
for name, (ids, reports) in runs.items():
    seconds = sum(r.timings_ms["total"] for r in reports) / 1e3
    finish = {rid: k for k, r in enumerate(reports) for rid in r.finished}
    latency = sum(finish[rid] + 1 for rid in ids) / len(ids)
    print(t("lp6_batching", LANG, name=t(f"lc_l6_{name}", LANG), steps=len(reports), rate=sum(lengths) / seconds, latency=latency))

# %% [markdown]
# Continuous batching needs fewer steps for the same tokens, so throughput rises and the mean request
# finishes sooner. (The paper builds on Orca's iteration-level scheduling, §2.3 and §4.5.)
#
# ## 2. When the pool runs out: preemption by recompute
# vLLM admits requests without reserving room for their future tokens. If a running request needs a new
# block and none is free, the scheduler **preempts** the most recently admitted request: its blocks are
# freed and it returns to the front of the queue; later it is prefilled again with its prompt and the
# tokens it had produced (**recompute**, paper §4.5). The other option, swapping blocks to CPU memory,
# costs comparable time at block sizes 16–64 (paper §7.3). Here: a pool of just 10 blocks of 4 tokens.

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

# %% [markdown]
# A preempted request drops to 0 blocks and waits; when blocks free up it is prefilled again from
# scratch. The text is the same as with a large pool: recompute repeats the computation exactly; it only costs time.
#
# ## 3. Choosing the block size
# Small blocks waste little (at most one partly filled block per request) but give the attention kernel
# many small pieces to gather; large blocks are efficient to read but leave more of their last block
# empty. The simulator measures the memory side on the ShareGPT-like workload and the paper's pool
# (15.7K slots). The paper (§7.2) found block sizes 16–128 best on ShareGPT and chose 16 by default;
# the loss at small sizes comes from GPU kernel efficiency, which this simulator does not model.

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

# %% [markdown]
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

# %% [markdown]
# Recompute pays in compute: the preempted request's prompt and the tokens it had produced are prefilled
# again. Swap pays in copies: every block it held crosses to the CPU and back, and each token is computed
# once. The texts are the same both ways: both are exact.
#
# Which one is cheaper depends on the **block size** (paper §7.3, Figure 19). The same bytes move whatever
# the block size, but in blocks: small blocks mean many small copies. On a GPU each copy crosses PCIe with
# a cost of its own, so at block sizes 1–8 swapping is much slower than recomputing, while recompute does
# not depend on the block size; from 16 to 64 the two are comparable. Here the same 40 slots, cut into
# blocks of 1, 2, 4 and 8 tokens:

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

# %% [markdown]
# Halve the block size and the number of copies doubles. (On this CPU the copies stay inside RAM, so the
# times are a few milliseconds and noisy on a shared machine; the count of copies is what carries over to a GPU.)
#
# ## 5. Chunked prefill: a long prompt no longer stalls the decodes
# Two short requests are decoding when a prompt of about 260 tokens arrives. Prefilled whole, the prompt
# makes one step long, and the two running requests get their next token only after that step. With
# chunked prefill (vLLM's `enable_chunked_prefill`) each step spends one token budget
# (`max_num_batched_tokens`): the running decodes first, then the next chunk of the prompt, which attends
# to its earlier chunks through its block table.

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

# %% [markdown]
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
