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
# # 第 6 课 连续批处理与抢占
#
# **目标：** 在同一组请求上比较静态批处理与迭代级（连续）批处理；观察 KV 池耗尽时引擎怎么做（通过重计算进行抢占）；并用模拟器测量块大小的取舍。
#
# - **静态批处理**（static batching）：取一批请求，一直运行到这批里*每个*请求都结束，再取下一批。已经结束的请求留下的位置会一直空着，直到最长的那个请求跑完。
# - **连续批处理**（continuous batching，即 Orca 的迭代级调度 iteration-level scheduling，vLLM 也采用它）：调度器（scheduler）**每一步**都重新决定这一批；结束的请求立即离开，等待中的请求马上补上它的位置。

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

LANG = "zh"  # the language of the charts and of the check's messages
use_cjk_font()  # so that 中文 chart labels are drawn, not boxes

# %% [markdown]
# ## 1. 同一组请求：静态批处理 vs 连续批处理
# 八个请求同时到达，要求生成的 token 数差别很大；最多同时运行 4 个。这里手动驱动引擎来做静态批处理：接纳 4 个，一步步运行直到这 4 个都结束，再接纳下 4 个。

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
# 每一条代表一个请求；每一步的那一列显示这一步有哪些请求在运行。在静态批处理中，4 个 token 的请求结束后，它的位置一直空闲，直到同批里 24 个 token 的请求完成。下面看具体数字：吞吐量（throughput，每秒引擎时间生成的 token 数）和延迟（latency，从到达——第 0 步——到最后一个 token 的步数）。

# %%
for name, (ids, reports) in runs.items():
    seconds = sum(r.timings_ms["total"] for r in reports) / 1e3
    finish = {rid: k for k, r in enumerate(reports) for rid in r.finished}
    latency = sum(finish[rid] + 1 for rid in ids) / len(ids)
    print(f"{name:10s}: {len(reports):3d} steps, {sum(lengths) / seconds:5.1f} tokens/s, mean latency {latency:5.1f} steps")

# %% [markdown]
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

# %% [markdown]
# 每块几十个 token 以内，浪费都很小，批也很大；超过 128 之后，每个请求最后一个块浪费的空间多到足以让批变小。
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
