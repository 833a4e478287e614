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
# # 第 3 课 显存问题：预留与碎片
#
# **目标：** 看清当每个请求都得到一段连续的、预先分配的区间时（vLLM 之前的系统就是这样），KV 缓存的显存都去了哪里；认识几种浪费的名字；并用项目的模拟器（simulator）复现 PagedAttention 论文的图 2。
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

# visualize/paper.py switches matplotlib to a file-only backend when imported: switch figures back on.
# %matplotlib inline

LANG = "zh"

# %% [markdown]
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
print(c_reports[2].memory)

# %% [markdown]
# 三个 64 槽位的区间放得下；第四个请求只能等待，尽管还有 32 个空闲槽位：它们构成的空隙小于 64（**外部碎片**）。每个区间里只有前 20 个左右的槽位会真正存放 token：其余部分现在是**预留**，最终成为**内部碎片**。
#
# ## 2. 同样的请求，改用分页
# 分页分配器每次只给请求一个块，而且只在它最后一个块写满时才给。

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
# 使用分页时，四个请求同时运行，也更早结束；唯一的浪费是每个请求最后一个块中的一部分。
#
# ## 3. 复现论文的图 2
# 论文测量了在一张 A100-40GB 上部署 OPT-13B（15.7K 个 token 槽位，表 1）时，KV 空间中有多少比例真正存放着 token 状态，对比了 Orca 的三种变体：**Max** 预留 2048 个槽位，**Pow2** 预留提示词长度加上不小于输出长度的最小 2 的幂（输出 25 → 32 个槽位），**Oracle** 恰好预留最终长度（它能预知未来）；每段范围都由伙伴分配器（buddy allocation，2 的幂大小的块，§6.1）放置。论文图 2 给出的比例是 20.4%（Max）、26.8%（Pow2）、38.2%（Oracle）和 96.3%（vLLM）。
#
# 模拟器只依据长度（不运行模型）来执行引擎自己的调度器和分配器，所用的合成负载与 ShareGPT 数据集的平均长度一致（提示词 161 个 token、输出 338 个 token；论文图 11）。

# %%
rows = reproduce_paper(num_requests=2000, workloads=("sharegpt",))
plot_memory_breakdown(rows)
plt.show()
for r in rows:
    print(f"{r['system']:14s} token states {r['token_state_fraction']:6.1%} (paper {r['paper_token_state_fraction']:.1%})   "
          f"requests running {r['mean_concurrent_requests']:5.1f} (paper {r['paper_mean_concurrent_requests']})")

# %% [markdown]
# 我们的柱状图是在合成长度上、不含模型的重演，所以各项比例与论文相差几个百分点，但排序和差距的大小与论文一致：连续预留浪费了池中的大部分空间，分页几乎没有浪费——省下的显存变成了更大的批（最后一列；论文图 13）。第 1 课已经说明，解码需要的正是更大的批。
#
# ## 练习：手算一组请求的浪费
# 一台 Orca (Max) 服务器，`max_model_len` = 256，池中有 800 个槽位。在时刻 0 收到四个请求（提示词 token 数，输出 token 数）：(40, 10)、(100, 60)、(16, 200)、(30, 30)。每个被接纳的请求预留 256 个槽位；按先来先服务（first come, first served）的顺序接纳，直到放不下为止。
#
# 第 0 步是预填充（提示词的 K 和 V 进入缓存）；之后每一步，每个运行中的请求再缓存一个 token。**在第 5 步**，每一类各有多少个槽位？（一个请求的最终长度 = 提示词 token 数 + 输出 token 数。）

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
