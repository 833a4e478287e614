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
# # Lesson 1 — Autoregressive inference: prefill and decode
#
# **Goal:** see the two phases of generation on a real model, count what each one costs in time and
# FLOPs, and find out why decoding one token at a time is limited by memory, not arithmetic.
#
# A language model produces text one token at a time: it reads the prompt, predicts the next token,
# appends it, and predicts again. The engine calls one such round a **step**.
#
# | phase | tokens computed in the step | happens |
# |---|---|---|
# | **prefill** | the whole prompt, all at once | once per request |
# | **decode** | one new token per request | once per generated token |

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

from engine import LLM, SamplingParams
from visualize.i18n import t
from visualize.style import use_cjk_font

LANG = "en"  # the language of the charts and of the check's messages
use_cjk_font()  # so that 中文 chart labels are drawn, not boxes

# %% [markdown]
# ## 1. Watch a generation step by step
# `LLM()` loads the default model, SmolLM2-135M-Instruct. `on_step` hands us the engine's
# `StepReport` after every step: its phase, how many tokens it computed, and how long the forward pass took.

# %%
llm = LLM()
eng = llm.engine
reports = []
out = llm.generate("The capital of France is", SamplingParams(max_tokens=12), on_step=reports.append)
print(repr(out[0].text))
for r in reports[:4]:
    print(t("lp1_step", LANG, step=r.step, phase=t(f"phase_{r.phase}", LANG), tokens=r.num_tokens, ms=r.timings_ms["forward"]))

# %%
fig, ax = plt.subplots(figsize=(7, 2.6))
colors = ["tab:orange" if r.phase == "prefill" else "tab:blue" for r in reports]
ax.bar([r.step for r in reports], [r.num_tokens for r in reports], color=colors)
ax.set_xlabel(t("lc_step", LANG))
ax.set_ylabel(t("lc_tokens_computed", LANG))
ax.set_title(t("lc_l1_steps_title", LANG))
plt.show()

# %% [markdown]
# The prefill computes every prompt token in one step; each decode step computes exactly one.
# Decode steps must run one after another: token *t + 1* cannot be computed before token *t* is sampled.
#
# ## 2. FLOPs of each phase
# Almost all the work is matrix multiplication with the weights: a token passing through a weight
# matrix of *N* numbers costs about **2 N FLOPs** (one multiply and one add per weight).
# Attention adds work that grows with the context.

# %%
model = eng.runner.model
cfg = eng.hf_config
n_linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
n_lm_head = cfg.vocab_size * cfg.hidden_size  # tied to the embedding in SmolLM2, but still a matmul
L, H, D = model.num_layers, cfg.num_attention_heads, model.head_dim
print(t("lp1_weights", LANG, linear=n_linear / 1e6, head=n_lm_head / 1e6))


def prefill_flops(n):
    """A prompt of n tokens: every token through every layer, causal attention, LM head on the last token."""
    return 2 * n_linear * n + 2 * L * H * D * n * (n + 1) + 2 * n_lm_head


def decode_flops(context):
    """One new token attending to `context` cached tokens."""
    return 2 * n_linear + 4 * L * H * D * context + 2 * n_lm_head


for n in (8, 128, 1024):
    print(t("lp1_flops", LANG, n=n, prefill=prefill_flops(n) / 1e9, decode=decode_flops(n) / 1e9))

# %% [markdown]
# A decode step does a few hundred MFLOP, a long prefill hundreds of GFLOP. Yet, as we measure next,
# a decode step is far from proportionally cheaper.
#
# ## 3. Time of each phase
# We time prefills of growing prompts, and decode steps of growing batches (several requests decoding
# in the same step). Each point is the fastest of a few repetitions: timings on a busy machine are noisy.

# %%
def forward_times(prompt_len, batch, max_tokens):
    """Run `batch` requests of `prompt_len` tokens; return (prefill ms, fastest decode step ms)."""
    prompt = list(range(1000, 1000 + prompt_len))
    steps = []
    llm.generate([prompt] * batch, SamplingParams(max_tokens=max_tokens, ignore_eos=True), on_step=steps.append)
    return steps[0].timings_ms["forward"], min(s.timings_ms["forward"] for s in steps[1:])


prefill_lens = [8, 32, 128]
prefill_ms = [min(forward_times(n, 1, 2)[0] for _ in range(2)) for n in prefill_lens]
decode_batches = [1, 4, 16]
decode_ms = [forward_times(16, b, 8)[1] for b in decode_batches]

fig, ax = plt.subplots(figsize=(6, 3.2))
ax.plot(prefill_lens, prefill_ms, "o-", color="tab:orange", label=t("lc_l1_prefill_n", LANG))
ax.plot(decode_batches, decode_ms, "s-", color="tab:blue", label=t("lc_l1_decode_n", LANG))
ax.set_xscale("log", base=2)
ax.set_xlabel(t("lc_l1_tokens_in_step", LANG))
ax.set_ylabel(t("lc_l1_forward_ms", LANG))
ax.legend()
plt.show()

# %% [markdown]
# Going from 1 to 16 tokens in a step costs far less than 16×: the step has a fixed cost that does not
# depend on how many tokens it computes. That cost is **reading the weights**: every step streams all
# of them from memory once, whether it then uses each weight for 1 token or for 128.

# %%
weight_bytes = (n_linear + n_lm_head) * eng.runner.dtype.itemsize
for n, ms in zip(prefill_lens, prefill_ms):
    print(t("lp1_prefill_rate", LANG, n=n, rate=prefill_flops(n) / (ms / 1e3) / 1e9))
for b, ms in zip(decode_batches, decode_ms):
    print(t("lp1_decode_rate", LANG, b=b, rate=b * decode_flops(16) / (ms / 1e3) / 1e9, bw=weight_bytes / (ms / 1e3) / 1e9))

# %% [markdown]
# ## 4. Why decode is memory-bound
# **Arithmetic intensity** = FLOPs done per byte read from memory. With batch *B*, a decode step does
# 2 FLOPs per weight per request, and reads each weight once:
# intensity ≈ 2 *B* / (bytes per weight). Hardware has a *ridge point*: below it, the step waits for memory.
# An NVIDIA H200 does about 989 TFLOP/s (dense bf16) and reads 4.8 TB/s, a ridge of about 206 FLOP/byte
# (NVIDIA's H200 datasheet).

# %%
batches = [1, 8, 32, 128, 512]
bf16_intensity = [2 * b / 2 for b in batches]  # bf16: 2 bytes per weight
fig, ax = plt.subplots(figsize=(6, 3))
ax.bar([str(b) for b in batches], bf16_intensity, color="tab:blue")
ax.axhline(989 / 4.8, color="tab:red", ls="--", label=t("lc_l1_ridge", LANG))
ax.set_yscale("log")
ax.set_xlabel(t("lc_l1_batch", LANG))
ax.set_ylabel(t("lc_l1_intensity", LANG))
ax.legend()
plt.show()

# %% [markdown]
# One request decodes at 1 FLOP per byte: the GPU's arithmetic units idle more than 99% of the time.
# The remedy is to decode **many requests in the same step**, so each weight read serves many tokens.
# How many requests fit is decided by the memory left for their caches — the subject of lessons 2 and 3.
#
# ## Exercise
# One decode step of this model runs **8 requests** together, with the weights in the engine's
# dtype (`eng.runner.dtype`, float32 on CPU). Ignore attention. Using `n_linear` and `n_lm_head` from
# above, fill in:
# - `step_flops`: the FLOPs of the step's matrix multiplications;
# - `step_bytes`: the bytes of weights it reads.

# %% tags=["exercise"]
step_flops = None  # TODO(student)
step_bytes = None  # TODO(student)

# %% tags=["check"]
def check():
    from visualize.i18n import t  # the check's messages, in the notebook's language
    n = n_linear + n_lm_head
    want_flops, want_bytes = 2 * n * 8, n * eng.runner.dtype.itemsize
    if step_flops is None or step_bytes is None:
        return t("l1_fail_none", LANG)
    if abs(step_flops - want_flops) > 0.01 * want_flops:
        return t("l1_fail_flops", LANG, value=f"{step_flops:.3g}")
    if abs(step_bytes - want_bytes) > 0.01 * want_bytes:
        return t("l1_fail_bytes", LANG, value=f"{step_bytes:.3g}")
    return t("l1_pass", LANG, value=f"{step_flops / step_bytes:.1f}")


print(check())
