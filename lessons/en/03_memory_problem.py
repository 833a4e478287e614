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
print(c_reports[2].memory)

# %% [markdown]
# Three ranges of 64 slots fit; the fourth request waits, although 32 slots are free: they form a gap
# smaller than 64 (**external fragmentation**). Inside each range only the first ~20 slots will ever
# hold tokens: the rest is **reserved** now and **internal fragmentation** for good.
#
# ## 2. The same requests, paged
# The paged allocator gives a request one block at a time, only when its last block is full.

# %%
paged = LLM(num_gpu_blocks=14, block_size=16, max_model_len=64)
p_reports = []
paged.generate(prompts, params, on_step=p_reports.append)
fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 3), sharey=True)
memory_figure(memory_frame(c_reports), lang=LANG, title="contiguous, reservation = max", ax=a1)
memory_figure(memory_frame(p_reports), lang=LANG, title="paged", ax=a2)
plt.show()
print(f"steps to serve all four: contiguous {len(c_reports)}, paged {len(p_reports)}")

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
plot_memory_breakdown(rows)
plt.show()
for r in rows:
    print(f"{r['system']:14s} token states {r['token_state_fraction']:6.1%} (paper {r['paper_token_state_fraction']:.1%})   "
          f"requests running {r['mean_concurrent_requests']:5.1f} (paper {r['paper_mean_concurrent_requests']})")

# %% [markdown]
# Our bars are a model-free re-enactment on synthetic lengths, so the shares differ by a few points from
# the paper's, but the ordering and the size of the gap are the paper's: contiguous reservation wastes
# most of the pool, paging wastes almost none — and the saved memory becomes a larger batch (last column;
# the paper's Figure 13). Lesson 1 showed why a larger batch is what decode needs.
#
# ## Exercise: the waste of a request mix, by hand
# An Orca (Max) server with `max_model_len` = 256 and a pool of 800 slots receives four requests at
# time 0 (prompt tokens, output tokens): (40, 10), (100, 60), (16, 200), (30, 30). Each admitted request
# reserves 256 slots; they are admitted first come, first served while a range fits.
#
# Step 0 is the prefill (the prompts' K and V are cached); every later step caches one more token per
# running request. **At step 5**, how many slots are in each category? (A request's final length is
# prompt + output tokens.)

# %%
mix = [Request(arrival=0.0, prompt_len=p, output_len=o) for p, o in [(40, 10), (100, 60), (16, 200), (30, 30)]]

# %% tags=["exercise"]
token_states = None  # TODO(student)
reserved = None  # TODO(student)
internal_fragmentation = None  # TODO(student)
external_fragmentation = None  # TODO(student)

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
    waste = reserved + internal_fragmentation + external_fragmentation
    return t("l3_pass", LANG, share=f"{token_states / (token_states + waste):.0%}")


print(check())
