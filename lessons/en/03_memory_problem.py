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
# # Lesson 3 — The memory problem: reservation and fragmentation
#
# **Goal:** see where KV-cache memory goes when every request gets one contiguous, pre-allocated range
# (as in the systems before vLLM), name the kinds of waste, and reproduce the PagedAttention paper's
# Figure 2 with the project's simulator.
#
# Before vLLM, a serving system (FasterTransformer, Orca) gave each request **one contiguous range**
# of the KV pool when it was admitted. The range cannot grow later, and nobody knows how many tokens the
# request will generate, so it is sized for the worst case (paper §3). Each slot of the pool is then:
#
# | category | the slot… |
# |---|---|
# | **token states** | holds a token's K and V — the only useful memory |
# | **reserved** | is kept for a token the request will produce later |
# | **internal fragmentation** | lies inside a range but will never be used (the request ends sooner) |
# | **external fragmentation** | is free, but in a gap too small for the next request's range |
# | free | is free and usable |

# %%
# Make `engine` importable when this notebook is opened from lessons/<lang>/ without `pip install -e .`
import pathlib
import sys

try:
    import engine  # noqa: F401
except ImportError:
    sys.path.insert(0, str(next(p for p in pathlib.Path.cwd().resolve().parents if (p / "engine").is_dir())))

import matplotlib.pyplot as plt

from engine import LLM, Request, SamplingParams, reproduce_paper, simulate
from visualize import memory_figure, memory_frame, pool_map_figure
from visualize.paper import plot_memory_breakdown
from visualize.i18n import t

# visualize/paper.py switches matplotlib to a file-only backend when imported: switch figures back on.
# %matplotlib inline

LANG = "en"

# %% [markdown]
# ## 1. Contiguous ranges on the real model
# The engine can run the same model with the old allocator: `allocator="contiguous"`,
# `reservation="max"` (every request reserves `max_model_len` = 64 slots). The pool holds 14 blocks of
# 16 slots = 224 slots. Four short requests arrive together.

# %%
prompts = ["Hi!", "What is a GPU?", "Name a colour.", "Count to five."]
params = SamplingParams(max_tokens=16, ignore_eos=True)
contiguous = LLM(allocator="contiguous", reservation="max", num_gpu_blocks=14, block_size=16, max_model_len=64)
c_reports = []
contiguous.generate(prompts, params, on_step=c_reports.append)
pool_map_figure(c_reports[2], 16, lang=LANG, columns=14)
plt.show()
print(t("lp3_memory", LANG, **vars(c_reports[2].memory)))

# %% [markdown]
# Three ranges of 64 slots fit; the fourth request waits, although 32 slots are free: they form a gap
# smaller than 64 (**external fragmentation**). Inside each range only the first ~20 slots will ever
# hold tokens. Of the other slots, those up to the request's final length, not yet written, are **reserved**;
# those beyond it are **internal fragmentation** for good.
#
# ## 2. The same requests, paged
# The paged allocator gives a request one block at a time, only when its last block is full.

# %%
paged = LLM(num_gpu_blocks=14, block_size=16, max_model_len=64)
p_reports = []
paged.generate(prompts, params, on_step=p_reports.append)
fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 3), sharey=True)
memory_figure(memory_frame(c_reports), lang=LANG, title=t("l3_contiguous_max", LANG), ax=a1)
memory_figure(memory_frame(p_reports), lang=LANG, title=t("system_paged", LANG), ax=a2)
plt.show()
print(t("lp3_steps", LANG, contiguous=len(c_reports), paged=len(p_reports)))

# %% [markdown]
# Paged, all four requests run at once and finish sooner; the only waste is part of each request's last
# block.
#
# ## 3. The paper's Figure 2, reproduced
# The paper measured how much of the KV space holds token states when serving OPT-13B on an A100-40GB
# (15.7K token slots, Table 1), with three Orca variants: **Max** reserves 2048 slots, **Pow2** the
# prompt plus the next power of two of the output length (output 25 → 32 slots), **Oracle** exactly the
# final length (it knows the future); each range is placed by a buddy allocator (power-of-two chunks,
# §6.1). Its Figure 2 reports 20.4% (Max), 26.8% (Pow2), 38.2% (Oracle) and 96.3% (vLLM).
#
# The simulator runs the engine's own scheduler and allocators on lengths alone (no model), on a
# synthetic workload with the ShareGPT trace's mean lengths (161 prompt, 338 output tokens; paper Figure 11).

# %%
rows = reproduce_paper(num_requests=2000, workloads=("sharegpt",))
plot_memory_breakdown(rows, lang=LANG)
plt.show()
for r in rows:
    print(t("lp3_system", LANG, system=r["system"], share=r["token_state_fraction"], paper_share=r["paper_token_state_fraction"],
            running=r["mean_concurrent_requests"], paper_running=r["paper_mean_concurrent_requests"]))

# %% [markdown]
# Our bars are a model-free re-enactment on synthetic lengths, so the shares differ by a few points from
# the paper's, but the ordering and the size of the gap are the paper's: contiguous reservation wastes
# most of the pool, paging wastes almost none — and the saved memory becomes a larger batch (last column;
# the paper's Figure 13). Lesson 1 showed why a larger batch is what decode needs.
#
# ## 4. Why memory is throughput
# A decode step is memory-bound (lesson 1): it reads every weight once, whatever the batch, so a step of
# 30 requests takes little longer than a step of one, and makes 30 tokens instead of one. The batch is
# bounded by the KV pool: every running request's K and V must be in it. Memory a system wastes is batch
# it cannot run, and batch is throughput.
#
# The step-time model of the paper's set-up (`engine/sim/cost_model.py`, preset `a100-opt-13b-achieved`:
# OPT-13B on one A100-40GB, the GPU's roofline plus the host's work per step and per request) gives a
# decode step's time for a batch of requests of 500 tokens each. The curve is tokens per second against
# batch size; each system's mark sits at the batch its memory let it run in section 3.

# %%
from engine.sim.cost_model import StepShape, get_setup
from engine.experiments.figures import latency_sweep, sustainable_rate
from engine.sim.workloads import make_workload
from visualize.style import use_cjk_font

a100 = get_setup("a100-opt-13b-achieved")  # the paper's set-up: OPT-13B on one A100-40GB, 15,700 KV slots
CONTEXT = 500  # tokens per running request (ShareGPT: 161 prompt + 338 output tokens on average)
# The exercise's sweep: Orca (Max) on ShareGPT at these rates (req/s), SATURATION_REQUESTS requests each.
SATURATION_REQUESTS, SATURATION_RATES, SATURATION_TOLERANCE = 1000, (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 1.0), 0.25


def decode_tokens_per_s(batch, block_size=None):
    """Tokens per second of decode steps of `batch` requests of CONTEXT tokens (paged: its block_size)."""
    step_s = a100.cost_model.step_time(StepShape.of_batch([], [CONTEXT] * batch, block_size))
    return batch / step_s


use_cjk_font()
batches = [1, 2, 4, 8, 16, 32, 64, 128, 256]
fig, ax = plt.subplots(figsize=(7, 3.6))
ax.plot(batches, [decode_tokens_per_s(b, 16) for b in batches], "o-", color="#1f77b4", label=t("l3_tput_curve", LANG))
for r in rows:  # each system at the batch its memory let it run in section 3
    b = round(r["mean_concurrent_requests"])
    ax.plot(b, decode_tokens_per_s(b, 16 if r["system"] == "vLLM" else None), "s", markersize=9, label=r["system"])
ax.set_xscale("log", base=2)
ax.set_xlabel(t("l3_tput_x", LANG))
ax.set_ylabel(t("l3_tput_y", LANG))
ax.set_title(t("l3_tput_title", LANG))
ax.legend(fontsize=8)
plt.show()
for r in rows:
    b = round(r["mean_concurrent_requests"])
    rate = decode_tokens_per_s(b, 16 if r["system"] == "vLLM" else None)
    print(t("lp3_batch", LANG, system=r["system"], b=b, ms=1e3 * b / rate, rate=rate))

# %% [markdown]
# The curve climbs almost in proportion to the batch while reading the weights dominates the step (its
# time hardly moves), then bends as reading the KV cache and the per-request work take over. Orca (Max)
# sits near 7 requests: 15,700 slots hold seven reservations of 2,048. vLLM holds only the tokens its
# requests have, runs several times the batch and gets several times the tokens per second from the same
# GPU: the paper's 2-4x the throughput at the same latency (abstract, §6.2) comes from here.
#
# ## Exercise: the waste of a request mix, by hand, and the batch it costs
# An Orca (Max) server with `max_model_len` = 256 and a pool of 800 slots receives four requests at
# time 0 (prompt tokens, output tokens): (40, 10), (100, 60), (16, 200), (30, 30). Each admitted request
# reserves 256 slots; they are admitted first come, first served while a range fits.
#
# Step 0 is the prefill (the prompts' K and V are cached); every later step caches one more token per
# running request. **At step 5**, how many slots are in each category? (A request's final length is
# prompt + output tokens.)
#
# **Then the batch it costs.** In the paper's pool (15,700 slots, `max_model_len` = 2048), how many
# requests can Orca (Max) run at once (`orca_max_batch`)? And how many requests of 500 tokens fit at once
# in the same pool paged, with blocks of 16 slots (`paged_batch`)? (Paged, a request holds whole blocks.)
#
# **And the rate at which Orca (Max) saturates.** From the memory arithmetic alone, predict the request
# rate (requests per second) beyond which Orca (Max) on ShareGPT, in the paper's set-up, cannot keep up
# (`orca_max_saturation_rate`). Orca (Max) runs `orca_max_batch` requests at once; each decode step makes
# one token for each of them, and lasts what the step-time model says for that batch
# (`decode_tokens_per_s` of section 4 gives the tokens per second of a contiguous batch); a request needs
# as many decode steps as it has output tokens (the workload's mean: `sharegpt` below). Little's law
# (requests in the system = rate x time each spends there) then gives the rate the batch can serve. The
# check runs the simulator's Figure 12 sweep for Orca (Max) and passes when your prediction is within 25%
# of the rate it sustains (normalized latency under 2x its low-load value).

# %%
mix = [Request(arrival=0.0, prompt_len=p, output_len=o) for p, o in [(40, 10), (100, 60), (16, 200), (30, 30)]]
# The ShareGPT requests of the paper's Figure 12 (as engine.experiments.figures draws them): their lengths.
sharegpt = make_workload("sharegpt", SATURATION_REQUESTS, 0, a100.max_model_len)
print(t("lp3_sharegpt", LANG, prompt=sum(r.prompt_len for r in sharegpt) / len(sharegpt),
        output=sum(r.output_len for r in sharegpt) / len(sharegpt)))

# %% tags=["exercise"]
token_states = None  # TODO(student)
reserved = None  # TODO(student)
internal_fragmentation = None  # TODO(student)
external_fragmentation = None  # TODO(student)
orca_max_batch = None  # TODO(student)
paged_batch = None  # TODO(student)
orca_max_saturation_rate = None  # TODO(student)

# %% tags=["check"]
def check():
    from visualize.i18n import t  # the check's messages, in the notebook's language
    run = simulate(requests=mix, kv_slots=800, block_size=16, max_model_len=256,
                   allocator="contiguous", reservation="max", fast_forward=False)
    row = list(run.series_step).index(5)
    answers = dict(token_states=token_states, reserved=reserved,
                   internal_fragmentation=internal_fragmentation, external_fragmentation=external_fragmentation)
    for name, value in answers.items():
        if value is None:
            return t("l3_fail_none", LANG, name=name)
        if value != run.series_memory[name][row]:
            return t("l3_fail_value", LANG, name=name, value=value)
    # Section 4's batch bound, measured: requests of CONTEXT tokens (one output token), all at once,
    # in the paper's pool; the step's token budget is lifted so that only memory limits the batch.
    many = [Request(arrival=0.0, prompt_len=CONTEXT, output_len=1)] * 100
    fit = {name: simulate(requests=many, kv_slots=a100.kv_slots, block_size=16, max_model_len=a100.max_model_len,
                          max_num_batched_tokens=100 * CONTEXT, allocator=allocator, reservation="max").max_concurrent_requests
           for name, allocator in (("orca_max_batch", "contiguous"), ("paged_batch", "paged"))}
    for name, value in dict(orca_max_batch=orca_max_batch, paged_batch=paged_batch).items():
        if value is None:
            return t("l3_fail_none", LANG, name=name)
        if value != fit[name]:
            return t("l3_fail_batch", LANG, name=name, value=value)
    # The rate Orca (Max) saturates at, simulated: the Figure 12 sweep on the same ShareGPT requests.
    if orca_max_saturation_rate is None:
        return t("l3_fail_none", LANG, name="orca_max_saturation_rate")
    sweep = latency_sweep(("sharegpt",), {"sharegpt": SATURATION_RATES}, systems=("Orca (Max)",), num_requests=SATURATION_REQUESTS)
    simulated, _ = sustainable_rate([r["request_rate"] for r in sweep], [r["normalized_latency_s"] for r in sweep])
    off = orca_max_saturation_rate / simulated - 1
    if abs(off) > SATURATION_TOLERANCE:
        return t("l3_fail_rate_high" if off > 0 else "l3_fail_rate_low", LANG, value=f"{orca_max_saturation_rate:.3g}",
                 tolerance=f"{SATURATION_TOLERANCE:.0%}")
    waste = reserved + internal_fragmentation + external_fragmentation
    speedup = decode_tokens_per_s(paged_batch, 16) / decode_tokens_per_s(orca_max_batch)
    passed = t("l3_pass_batch", LANG, share=f"{token_states / (token_states + waste):.0%}", orca=orca_max_batch,
               paged=paged_batch, speedup=f"{speedup:.1f}")
    ceiling = max(r["throughput_requests_per_s"] for r in sweep)
    return passed + "\n" + t("l3_pass_rate", LANG, value=f"{orca_max_saturation_rate:.2f}", simulated=f"{simulated:.2f}",
                              ceiling=f"{ceiling:.2f}")


print(check())
