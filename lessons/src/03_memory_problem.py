# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown] lang="en"
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

# %% [markdown] lang="zh"
# # 第 3 课　显存问题：预留与碎片
#
# **目标**：看清当每个请求都得到一段连续的、预先分配的区间时（vLLM 之前的系统就是这样），KV 缓存的显存都去了哪里；认识并区分几种浪费；并用项目的模拟器（simulator）复现 PagedAttention 论文的图 2。
#
# 在 vLLM 之前，推理服务系统（FasterTransformer、Orca）在接纳一个请求时，会从 KV 池里给它分配**一段连续的区间**。这段区间之后不能再扩大，而谁也不知道这个请求会生成多少 token，所以只能按最坏情况分配（论文 §3）。于是池中的每个槽位属于以下一类：
#
# | 类别 | 这个槽位…… |
# |---|---|
# | **token 状态**（token states） | 存着某个 token 的 K 和 V——唯一有用的显存 |
# | **预留**（reserved） | 留给请求之后才会生成的 token |
# | **内部碎片**（internal fragmentation） | 在区间之内，但永远用不上（请求提前结束了） |
# | **外部碎片**（external fragmentation） | 空闲，但所在的空隙比下一个请求需要的区间小 |
# | 空闲（free） | 空闲且可用 |

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

# %% [markdown] lang="en"
# ## 1. Contiguous ranges on the real model
# The engine can run the same model with the old allocator: `allocator="contiguous"`,
# `reservation="max"` (every request reserves `max_model_len` = 64 slots). The pool holds 14 blocks of
# 16 slots = 224 slots. Four short requests arrive together.

# %% [markdown] lang="zh"
# ## 1. 在真实模型上使用连续区间
# 引擎可以用旧式分配器运行同一个模型：`allocator="contiguous"`，`reservation="max"`（每个请求预留 `max_model_len` = 64 个槽位）。池中有 14 个块，每块 16 个槽位，共 224 个槽位。四个短请求同时到达。

# %%
prompts = ["Hi!", "What is a GPU?", "Name a colour.", "Count to five."]
params = SamplingParams(max_tokens=16, ignore_eos=True)
contiguous = LLM(allocator="contiguous", reservation="max", num_gpu_blocks=14, block_size=16, max_model_len=64)
c_reports = []
contiguous.generate(prompts, params, on_step=c_reports.append)
pool_map_figure(c_reports[2], 16, lang=LANG, columns=14)
plt.show()
print(t("lp3_memory", LANG, **vars(c_reports[2].memory)))

# %% [markdown] lang="en"
# Three ranges of 64 slots fit; the fourth request waits, although 32 slots are free: they form a gap
# smaller than 64 (**external fragmentation**). Inside each range only the first ~20 slots will ever
# hold tokens. Of the other slots, those up to the request's final length, not yet written, are **reserved**;
# those beyond it are **internal fragmentation** for good.
#
# ## 2. The same requests, paged
# The paged allocator gives a request one block at a time, only when its last block is full.

# %% [markdown] lang="zh"
# 三个 64 槽位的区间放得下；第四个请求只能等待，尽管还有 32 个空闲槽位：它们构成的空隙小于 64（**外部碎片**）。每个区间里只有前 20 个左右的槽位会真正存放 token：其余槽位中，将来还会写入 token 的部分（直到请求的最终长度）目前算作**预留**；超出最终长度的部分永远用不上，是**内部碎片**。
#
# ## 2. 同样的请求，改用分页
# 分页分配器每次只给请求一个块，而且只在它最后一个块写满时才给。

# %%
paged = LLM(num_gpu_blocks=14, block_size=16, max_model_len=64)
p_reports = []
paged.generate(prompts, params, on_step=p_reports.append)
fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 3), sharey=True)
memory_figure(memory_frame(c_reports), lang=LANG, title=t("l3_contiguous_max", LANG), ax=a1)
memory_figure(memory_frame(p_reports), lang=LANG, title=t("system_paged", LANG), ax=a2)
plt.show()
print(t("lp3_steps", LANG, contiguous=len(c_reports), paged=len(p_reports)))

# %% [markdown] lang="en"
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

# %% [markdown] lang="zh"
# 使用分页时，四个请求同时运行，也更早结束；唯一的浪费是每个请求最后一个块中的一部分。
#
# ## 3. 复现论文的图 2
# 论文测量了在一张 A100-40GB 上部署 OPT-13B（15.7K 个 token 槽位，表 1）时，KV 空间中有多少比例真正存放着 token 状态，对比了 Orca 的三种变体：**Max** 预留 2048 个槽位，**Pow2** 预留提示词长度加上不小于输出长度的最小 2 的幂（输出 25 → 32 个槽位），**Oracle** 恰好预留最终长度（它能预知未来）；每段区间都由伙伴分配器（buddy allocator，2 的幂大小的片段，§6.1）放置。论文图 2 给出的比例是 20.4%（Max）、26.8%（Pow2）、38.2%（Oracle）和 96.3%（vLLM）。
#
# 模拟器只依据长度（不运行模型）来执行引擎自己的调度器和分配器，所用的合成负载与 ShareGPT 数据集的平均长度一致（提示词 161 个 token、输出 338 个 token；论文图 11）。

# %%
rows = reproduce_paper(num_requests=2000, workloads=("sharegpt",))
plot_memory_breakdown(rows, lang=LANG)
plt.show()
for r in rows:
    print(t("lp3_system", LANG, system=r["system"], share=r["token_state_fraction"], paper_share=r["paper_token_state_fraction"],
            running=r["mean_concurrent_requests"], paper_running=r["paper_mean_concurrent_requests"]))

# %% [markdown] lang="en"
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

# %% [markdown] lang="zh"
# 我们的柱状图是用合成的长度、不运行模型重演出来的，所以各项比例与论文相差几个百分点，但排序和差距的大小与论文一致：连续预留浪费了池中的大部分空间，分页几乎没有浪费——省下的显存变成了更大的批（最后一列；论文图 13）。第 1 课已经说明，解码需要的正是更大的批。
#
# ## 4. 为什么显存就是吞吐量
# 解码步是**访存受限**的（第 1 课）：无论批有多大，它都把每个权重读取一次，所以 30 个请求的一步只比 1 个请求的一步稍慢，却生成 30 个 token 而不是 1 个。批的大小受 KV 池限制：每个运行中请求的 K 和 V 都必须放在池里。一个系统浪费的显存，就是它跑不了的批；而批就是吞吐量。
#
# 论文实验配置的步时模型（`engine/sim/cost_model.py`，预设 `a100-opt-13b-achieved`：OPT-13B 在一张 A100-40GB 上，GPU 的 Roofline 模型（屋顶线模型）加上主机每步、每个请求的开销）给出一批各有 500 个 token 的请求做一次解码所需的时间。曲线是每秒 token 数随批大小的变化；每个系统的标记位于第 3 节中它的显存所允许的批大小处。下面的 `decode_tokens_per_s(batch, block_size)` 返回 `batch` 个请求（每个的上下文都是 `CONTEXT` 个 token）一起解码时每秒生成的 token 数；给出 `block_size` 时按分页分配计算。

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

# %% [markdown] lang="en"
# The curve climbs almost in proportion to the batch while reading the weights dominates the step (its
# time hardly moves), then bends as reading the KV cache and the per-request work take over. Orca (Max)
# sits near 7 requests: 15,700 slots hold seven reservations of 2,048. vLLM holds only the tokens its
# requests have, runs several times the batch and gets several times the tokens per second from the same
# GPU: the paper's 2-4x the throughput at the same latency (abstract, §6.2) comes from here.
#
# The same arithmetic for other models and GPUs (Llama-3-8B on an H100, Qwen3-32B on an H200): the app's
# [What-ifs at scale](http://localhost:8501/whatif) page (`streamlit run app.py`).
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

# %% [markdown] lang="zh"
# 在读取权重主导一步耗时的范围内（步时几乎不变），曲线几乎与批大小成正比地上升；之后读取 KV 缓存和每个请求的开销占了上风，曲线变缓。Orca (Max) 停在 7 个请求附近：15,700 个槽位只放得下 7 个 2,048 槽位的预留。vLLM 只保存请求已有的 token，批大了好几倍，在同一张 GPU 上每秒的 token 数也高出好几倍：论文所说“相同延迟下吞吐量提高 2–4 倍”（摘要、§6.2）正源于此。
#
# 换成其他模型和 GPU（H100 上的 Llama-3-8B、H200 上的 Qwen3-32B）做同样的算术：见应用的[规模推演](http://localhost:8501/whatif)页面（`streamlit run app.py`）。
#
# ## 练习：手算一组请求的浪费，以及它让批缩小了多少
# 一台 Orca (Max) 服务器，`max_model_len` = 256，池中有 800 个槽位。在时刻 0 收到四个请求（提示词 token 数，输出 token 数）：(40, 10)、(100, 60)、(16, 200)、(30, 30)。每个被接纳的请求预留 256 个槽位；按先来先服务（first come, first served）的顺序接纳，直到放不下为止。
#
# 第 0 步是预填充（提示词的 K 和 V 进入缓存）；之后每一步，每个运行中的请求再缓存一个 token。**在第 5 步**，每一类各有多少个槽位？（一个请求的最终长度 = 提示词 token 数 + 输出 token 数。）
#
# **再看它让批缩小了多少。** 在论文的 KV 池中（15,700 个槽位，`max_model_len` = 2048），Orca (Max) 最多能同时运行多少个请求（`orca_max_batch`）？同一个池改用分页、每块 16 个槽位时，最多能同时放下多少个 500 token 的请求（`paged_batch`）？（分页时，一个请求占用整数个块。）
#
# **最后，Orca (Max) 在什么请求速率下饱和。** 只凭显存容量的算术，预测在论文的配置下，请求速率超过多少时，Orca (Max) 处理 ShareGPT 就跟不上了（每秒请求数，`orca_max_saturation_rate`）。按以下步骤推算：
#
# 1. 批大小：Orca (Max) 同时运行 `orca_max_batch` 个请求。
# 2. 这个批每步的时间：每个解码步为批中每个请求生成一个 token，用时由步时模型按这个批大小给出（第 4 节的 `decode_tokens_per_s` 给出连续分配的批每秒生成的 token 数）。
# 3. 每个请求需要的解码步数：等于它的输出 token 数（取工作负载的平均值：见下面的 `sharegpt`）。
# 4. 利特尔定律（系统中的请求数 = 速率 × 每个请求停留的时间）：由前三步得到这个批能承受的速率。
#
# 检查会用模拟器对 Orca (Max) 跑图 12 的速率扫描，你的预测与它的可持续速率（归一化延迟低于低负载时的 2 倍）相差不超过 25% 即为通过。

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

# %% [markdown] lang="en"
# ## Self-check
# For discussion or an exam; the answers follow from this lesson.
# - **Warm-up.** Name the three kinds of waste of a contiguous allocator (reservation, internal fragmentation, external fragmentation), with an example of each.
# - **Core.** A request with a 100-token prompt generates 60 tokens under Orca (Max) with `max_model_len` 2048. How many slots does it reserve, and what share of them hold token states at its end?
# - **Design.** Why does reserving by powers of two (Pow2) shrink the reservation waste without removing it? What would an allocator have to know to reach Oracle's figure?
# %% [markdown] lang="zh"
# ## 自测题
# 供讨论或考试使用；答案都可以从本课推出。
# - **热身。**说出连续分配器的三种浪费（预留、内部碎片、外部碎片），各举一个例子。
# - **核心。**一个提示词 100 个 token、生成 60 个 token 的请求，在 Orca (Max) 下运行，`max_model_len` 为 2048。它预留了多少个槽位？结束时其中多大比例存着 token 状态？
# - **设计。**为什么按 2 的幂预留（Pow2）能减少预留的浪费，却不能消除它？分配器要事先知道什么，才能达到 Oracle 的数字？
