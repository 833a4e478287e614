# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown] lang="en"
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

# %% [markdown] lang="zh"
# # 第 1 课　自回归推理：预填充与解码
#
# **目标**：在真实模型上看清生成的两个阶段，算一算它们各自花费的时间和浮点运算量，并弄明白为什么逐个 token 的解码是访存受限（memory-bound）的，而不是算力受限。
#
# 语言模型每次只产出一个 token：先读入提示词（prompt），预测下一个 token，把它接到末尾，再预测下一个。这种方式叫作**自回归**（autoregressive）生成。引擎把这样的一轮称为一**步**（step）。
#
# | 阶段 | 这一步计算的 token | 发生几次 |
# |---|---|---|
# | **预填充**（prefill） | 整个提示词，一次算完 | 每个请求一次 |
# | **解码**（decode） | 每个请求一个新 token | 每生成一个 token 一次 |

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

# %% [markdown] lang="en"
# ## 1. Watch a generation step by step
# `LLM()` loads the default model, SmolLM2-135M-Instruct. `on_step` hands us the engine's
# `StepReport` after every step: its phase, how many tokens it computed, and how long the forward pass took.

# %% [markdown] lang="zh"
# ## 1. 逐步观察一次生成
# `LLM()` 会加载默认模型 SmolLM2-135M-Instruct。每一步结束后，`on_step` 把引擎的 `StepReport` 交给我们：其中有这一步的阶段、计算了多少 token、前向计算（forward）用了多久。

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

# %% [markdown] lang="en"
# The prefill computes every prompt token in one step; each decode step computes exactly one.
# Decode steps must run one after another: token *t + 1* cannot be computed before token *t* is sampled.
#
# ## 2. FLOPs of each phase
# Almost all the work is matrix multiplication with the weights: a token passing through a weight
# matrix of *N* numbers costs about **2 N FLOPs** (one multiply and one add per weight).
# Attention adds work that grows with the context.

# %% [markdown] lang="zh"
# 预填充在一步里算完提示词的所有 token；每个解码步只算一个。解码步只能一个接一个地执行：第 *t* 个 token 还没采样出来，就没法计算第 *t + 1* 个。
#
# ## 2. 两个阶段的浮点运算量
# 几乎所有计算都是与权重（weights）的矩阵乘法：一个 token 经过一个含 *N* 个数的权重矩阵，大约需要 **2 N 次浮点运算**（FLOPs，每个权重一次乘法加一次加法）。注意力（attention）还会带来随上下文长度增长的额外计算。
#
# 下面的 `prefill_flops(n)` 把 *n* 个 token 的提示词的三部分运算相加：每个 token 经过每一层的线性层（2 × `n_linear` × *n*）；因果注意力（每层 2 × 头数 × 每头维数 × *n*(*n* + 1)）；只对最后一个 token 计算的语言模型头（LM head，2 × `n_lm_head`，SmolLM2 中它与词嵌入共享权重，但仍是一次矩阵乘法）。`decode_flops(context)` 是一个新 token 对 `context` 个已缓存 token 做注意力计算的一步：线性层和语言模型头各算一次，注意力为每层 4 × 头数 × 每头维数 × `context`。

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

# %% [markdown] lang="en"
# A decode step does a few hundred MFLOP, a long prefill hundreds of GFLOP. Yet, as we measure next,
# a decode step is far from proportionally cheaper.
#
# ## 3. Time of each phase
# We time prefills of growing prompts, and decode steps of growing batches (several requests decoding
# in the same step). Each point is the fastest of a few repetitions: timings on a busy machine are noisy.

# %% [markdown] lang="zh"
# 一个解码步只有几亿次浮点运算，而一次长预填充有上千亿次。可是下面的测量会显示，解码步的耗时远没有按比例变小。
#
# ## 3. 两个阶段的耗时
# 我们测量不同长度提示词的预填充时间，以及不同批大小（batch，同一步里一起解码的请求数）的解码步时间。机器繁忙时计时会有波动，所以每个点取几次重复中最快的一次。

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

# %% [markdown] lang="en"
# Going from 1 to 16 tokens in a step costs far less than 16×: the step has a fixed cost that does not
# depend on how many tokens it computes. That cost is **reading the weights**: every step streams all
# of them from memory once, whether it then uses each weight for 1 token or for 128.

# %% [markdown] lang="zh"
# 一步计算的 token 从 1 个增加到 16 个，耗时远没有变成 16 倍：每一步都有一笔与 token 数无关的固定开销，那就是**读取权重**。无论每个权重随后用于 1 个 token 还是 128 个 token，每一步都要把全部权重从内存里读一遍。

# %%
weight_bytes = (n_linear + n_lm_head) * eng.runner.dtype.itemsize
for n, ms in zip(prefill_lens, prefill_ms):
    print(t("lp1_prefill_rate", LANG, n=n, rate=prefill_flops(n) / (ms / 1e3) / 1e9))
for b, ms in zip(decode_batches, decode_ms):
    print(t("lp1_decode_rate", LANG, b=b, rate=b * decode_flops(16) / (ms / 1e3) / 1e9, bw=weight_bytes / (ms / 1e3) / 1e9))

# %% [markdown] lang="en"
# ## 4. Why decode is memory-bound
# **Arithmetic intensity** = FLOPs done per byte read from memory. With batch *B*, a decode step does
# 2 FLOPs per weight per request, and reads each weight once:
# intensity ≈ 2 *B* / (bytes per weight). Hardware has a *ridge point*: below it, the step waits for memory.
# An NVIDIA H200 does about 989 TFLOP/s (dense bf16) and reads 4.8 TB/s, a ridge of about 206 FLOP/byte
# (NVIDIA's H200 datasheet).

# %% [markdown] lang="zh"
# ## 4. 为什么解码是访存受限的
# **算术强度**（arithmetic intensity）= 每从内存读取一个字节所做的浮点运算次数。批大小为 *B* 时，一个解码步对每个请求、每个权重做 2 次运算，而每个权重只读一次：算术强度 ≈ 2*B* /（每个权重的字节数）。硬件有一个**屋脊点**（ridge point）：低于它，计算单元就得等待访存（在 GPU 上即显存），即**访存受限**（memory-bound）。NVIDIA H200 的稠密 bf16 算力约 989 TFLOP/s，带宽 4.8 TB/s，屋脊点约为 206 FLOP/字节（数据来自 NVIDIA H200 规格书）。

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

# %% [markdown] lang="en"
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

# %% [markdown] lang="zh"
# 单个请求解码时每字节只有 1 次运算：GPU 的计算单元 99% 以上的时间都在空等。解决办法是**在同一步里解码许多请求**，让每次读取的权重服务更多 token。能同时容纳多少请求，取决于留给它们缓存的显存——这就是第 2、3 课的主题。
#
# ## 练习
# 这个模型的一个解码步同时运行 **8 个请求**，权重使用引擎的数据类型（`eng.runner.dtype`，在 CPU 上是 float32）。忽略注意力部分。利用上面的 `n_linear` 和 `n_lm_head`，填写：
# - `step_flops`：这一步矩阵乘法的浮点运算次数；
# - `step_bytes`：这一步读取的权重字节数。

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

# %% [markdown] lang="en"
# ## Self-check
# For discussion or an exam; the answers follow from this lesson.
# - **Warm-up.** Why does a prefill step compute every prompt token in one forward pass, while a decode step computes one token per request?
# - **Core.** For a decode step of a 135M-parameter float32 model at batch 1, estimate the bytes read and the FLOPs. Is the step memory-bound or compute-bound?
# - **Design.** Double the batch of a decode step that stays memory-bound: what happens to the step's time and to the throughput, and why?
# %% [markdown] lang="zh"
# ## 自测题
# 供讨论或考试使用；答案都可以从本课推出。
# - **热身。**为什么预填充步一次前向计算就算完提示词的全部 token，而解码步每个请求只算一个 token？
# - **核心。**批大小为 1 时，估算一个 1.35 亿参数、float32 模型的解码步读取的字节数和浮点运算量。这一步是访存受限还是计算受限？
# - **设计。**把一个仍然访存受限的解码步的批大小加倍：每步耗时和吞吐量会怎样变化？为什么？
