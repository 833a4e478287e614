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
# watch what the engine does when its KV pool runs out (preemption by recompute), and measure the
# block-size trade-off with the simulator.
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
    print(f"{name:10s}: {len(reports):3d} steps, {sum(lengths) / seconds:5.1f} tokens/s, mean latency {latency:5.1f} steps")

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
    print(f"request {o.request_id}: preempted {o.num_preemptions}x")
print("same text as with a roomy pool:", [o.text for o in tight_out] == [o.text for o in roomy_out])

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
print("PREEMPT events:", [(k, e.request_id) for k, r in enumerate(t_reports) for e in r.events if e.kind == PREEMPT])

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
