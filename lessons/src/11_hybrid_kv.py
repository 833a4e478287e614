# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown] lang="en"
# # Lesson 11 — A hybrid KV cache: sliding-window layers beside full attention
#
# **Goal:** see how vLLM v1 keeps the KV cache of a model that mixes attention types, on Gemma 3 270M's
# layers: its layers grouped into KV cache groups over one pool, one block table per group, and a
# sliding-window group freeing the blocks that left the window while the full-attention group keeps them all.
#
# Gemma 3 interleaves five **sliding-window** layers (a query at position p attends to positions
# p - 511 .. p: a window of 512) with one **full-attention** layer (Gemma Team 2025, §2). A sliding-window
# layer never reads a key more than 511 positions back, so it need not keep it: past the window its memory
# stops growing. The paper's block table has one kind of layer; vLLM v1's hybrid KV cache manager keeps:
#
# - a **KV cache spec** per layer (`FullAttentionSpec`, `SlidingWindowSpec`), and **KV cache groups** of
#   layers with the same spec (`engine/core/kv_cache_interface.py`);
# - one pool of equal-sized **pages** (blocks): layer j of every group shares one K/V tensor, so any free
#   block serves any group;
# - per request, one **block table per group**; a sliding-window group replaces the blocks wholly before
#   the window by the **null block** and frees them (`remove_skipped_blocks`,
#   `engine/core/single_type_kv_cache_manager.py`), and a coordinator answers the scheduler for all groups
#   (`engine/core/kv_cache_coordinator.py`).
#
# Which blocks a request holds depends on its lengths only, so this lesson runs the engine's scheduler and
# KV cache manager on Gemma 3 270M's layer shapes without the model's forward pass.

# %% [markdown] lang="zh"
# # 第 11 课　混合 KV 缓存：滑动窗口层与全注意力层并存
#
# **目标**：以 Gemma 3 270M 的层为例，看清 vLLM v1 如何为混合了多种注意力的模型管理 KV 缓存：层被分成若干 KV 缓存组，共用一个块池，每组各有一张块表；滑动窗口组释放已移出窗口的块，全注意力组则保留全部块。
#
# Gemma 3 每五个**滑动窗口**层之后跟一个**全注意力**层（Gemma 团队，2025，§2）。滑动窗口层中位置 p 的查询只看位置 p - 511 到 p（窗口为 512），它从不读取 511 个位置之前的键，所以不必保留它们：超过窗口之后，它的显存不再增长。论文中的块表只有一种层；vLLM v1 的混合 KV 缓存管理器则有：
#
# - 每层一个 **KV 缓存规格**（`FullAttentionSpec`、`SlidingWindowSpec`），规格相同的层组成 **KV 缓存组**（`engine/core/kv_cache_interface.py`）；
# - 一个由大小相同的**页**（块）组成的块池：各组的第 j 层共用同一个 K/V 张量，所以任何空闲块都能给任何组用；
# - 每个请求**每组一张块表**；滑动窗口组把完全落在窗口之前的块换成**空块**（`null block`）并释放它们（`remove_skipped_blocks`，`engine/core/single_type_kv_cache_manager.py`），由一个协调器代表所有组响应调度器（`engine/core/kv_cache_coordinator.py`）。
#
# 一个请求占用哪些块只取决于它的长度，所以本课在 Gemma 3 270M 的层形状上运行引擎的调度器和 KV 缓存管理器，不做模型的前向计算。

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

from engine.core.kv_cache_coordinator import HybridKVCacheCoordinator
from engine.core.kv_cache_interface import FULL_ATTENTION, gemma3_layer_types, get_kv_cache_config, kv_bytes_per_request, layer_specs
from engine.core.scheduler import Scheduler
from engine.core.sequence import Sequence, SequenceGroup
from engine.report import FREE
from visualize.i18n import t

LANG = "en"  # the language of the printed lines and of the check's messages

BLOCK_SIZE, WINDOW = 16, 512
# Gemma 3 270M: 18 layers, 1 KV head of 256 dimensions, bf16 (2 bytes); every sixth layer full attention
specs = layer_specs(18, BLOCK_SIZE, 1, 256, 2, sliding_window=WINDOW, layer_types=gemma3_layer_types(18))
config = get_kv_cache_config(specs, num_blocks=2000)
for gi, group in enumerate(config.kv_cache_groups):
    spec = group.kv_cache_spec
    kind = t("kv_full_attention", LANG) if spec.attention_type == FULL_ATTENTION else t("kv_sliding_window", LANG, window=spec.sliding_window)
    print(t("lp11_group", LANG, group=gi, kind=kind, layers=list(group.layer_names)))
for j, tensor in enumerate(config.kv_cache_tensors):
    print(t("lp11_tensor", LANG, j=j, layers=list(tensor.shared_by), mib=tensor.size / 2**20))

# %% [markdown] lang="en"
# ## 1. Grouping: 15 sliding + 3 full layers, groups of 3
# vLLM's rule (`_get_kv_cache_groups_uniform_page_size`): the group size is the fewest layers of any type
# (here the 3 full layers), so the 15 sliding layers make 5 groups of 3 and the full layers 1. Each group has
# its own block table; a page holds 3 layers' K and V for 16 tokens, whatever group it serves.
#
# ## 2. A request with a 1,200-token prompt
# The prompt crosses the window: its prefill needs every block (each prompt token's query has its own
# window), then each decode step frees, in every sliding group, the blocks that no future query reads.

# %% [markdown] lang="zh"
# ## 1. 分组：15 个滑动窗口层 + 3 个全注意力层，每组 3 层
# vLLM 的规则（`_get_kv_cache_groups_uniform_page_size`）：组的大小取各类层中最少的层数（这里是 3 个全注意力层），于是 15 个滑动窗口层组成 5 组、每组 3 层，全注意力层组成 1 组。每组有自己的块表；一页存 3 层、16 个 token 的 K 和 V，不论它给哪个组用。
#
# ## 2. 一个提示词长 1,200 个 token 的请求
# 提示词超出了窗口：预填充时需要全部块（每个提示词 token 的查询都有自己的窗口），之后每个解码步在每个滑动窗口组里释放今后不会再有查询读取的块。

# %%
def run(prompt_len, decode_steps, block_size=BLOCK_SIZE):
    """One request through the engine's scheduler and hybrid KV cache manager; each step's groups."""
    kv = HybridKVCacheCoordinator(get_kv_cache_config(specs, num_blocks=2000), block_size)
    scheduler = Scheduler(kv, max_num_seqs=1, max_num_batched_tokens=4096)
    seq = Sequence(0, prompt_len, max_len=prompt_len + decode_steps + 1)
    scheduler.add(SequenceGroup(0, [seq]))
    steps = []
    for _ in range(decode_steps + 1):
        out = scheduler.schedule()
        for ready in scheduler.update_from_output(out):
            ready.append_token()
        freed = [e for e in kv.events.drain() if e.kind == FREE]
        steps.append((seq.num_computed_tokens, kv.kv_groups(scheduler.running), freed))
    return kv, seq, steps


kv, seq, steps = run(1200, 40)
for computed, groups, freed in steps[:3] + steps[-2:]:
    print(t("lp11_step", LANG, computed=computed, sliding=groups[0].num_blocks_in_use, full=groups[-1].num_blocks_in_use,
            total=sum(g.num_blocks_in_use for g in groups), freed=len(freed)))
table = steps[-1][1][0].block_tables[0].block_table
print(t("lp11_table", LANG, group=0, n=len(table), nulls=table.count(0), tail=table[-6:]))
print(t("lp11_table", LANG, group=5, n=len(steps[-1][1][-1].block_tables[0].block_table), nulls=0,
        tail=steps[-1][1][-1].block_tables[0].block_table[-6:]))

# %% [markdown] lang="en"
# After the prefill every group holds the prompt's 75 blocks. The first decode step frees, in each sliding
# group, the blocks wholly before position 1200 - 511 = 689: blocks 0..42. From then on a sliding group
# holds at most ceil(511 / 16) + 1 = 33 blocks while the full group grows by one block every 16 tokens.
# The sliding tables keep one entry per logical block; the freed ones point at the null block 0, so the
# slot mapping is unchanged and attention skips them.
#
# ## 3. What the window saves
# The same request on the same model with all 18 layers full attention holds every block in every layer.
# `kv_bytes_per_request` counts whole blocks in each layer, after the request's last step.

# %% [markdown] lang="zh"
# 预填充之后每个组都占着提示词的 75 个块。第一个解码步在每个滑动窗口组里释放完全落在位置 1200 - 511 = 689 之前的块：第 0 到 42 块。此后一个滑动窗口组最多占 `ceil(511 / 16) + 1 = 33` 个块，而全注意力组每 16 个 token 多占一个块。滑动窗口组的块表仍然每个逻辑块一项；被释放的项指向空块 0，因此槽位映射不变，注意力计算跳过它们。
#
# ## 3. 窗口省下了多少
# 同一个请求、同一个模型，如果 18 层全是全注意力，每层都要保留全部块。`kv_bytes_per_request` 按每层的整块数计算请求最后一步之后的字节数。

# %%
full_specs = layer_specs(18, BLOCK_SIZE, 1, 256, 2, layer_types=[FULL_ATTENTION] * 18)
for context in (1200, 4096, 32768):
    hybrid, full = kv_bytes_per_request(specs, context), kv_bytes_per_request(full_specs, context)
    print(t("lp11_saved", LANG, context=context, full=full / 2**20, hybrid=hybrid / 2**20, ratio=full / hybrid))

# %% [markdown] lang="en"
# ## 4. Exercise
# A request with a **1,000-token** prompt (same model, block size 16, window 512) is prefilled whole, then
# decodes one token per step. Without running anything: how many blocks does it hold, over all six groups,
# right after the step that brings it to **1,300** tokens computed? Hint: at the start of a step a sliding
# group frees the blocks wholly before the window of that step's query, then the step takes the block its
# new token needs.

# %% [markdown] lang="zh"
# ## 4. 练习
# 一个提示词长 **1,000** 个 token 的请求（同一模型，块大小 16，窗口 512）一次预填充完，然后每步解码一个 token。不运行任何代码：在使它的已计算 token 数达到 **1,300** 的那一步之后，它在全部六个组里一共占多少个块？
#
# 提示：每一步开始时，滑动窗口组先释放完全落在这一步查询窗口之前的块，然后这一步再为新 token 取需要的块。

# %% tags=["exercise"]
blocks_in_use = None  # TODO(student): an int, the blocks of all six groups together

# %% tags=["check"]
def check():
    from lessons.checks import hybrid_blocks_in_use
    from visualize.i18n import t  # the check's messages, in the notebook's language
    if blocks_in_use is None:
        return t("l11_fail_none", LANG)
    measured = hybrid_blocks_in_use(1000, 1300)
    if blocks_in_use != measured:
        return t("l11_fail", LANG, value=blocks_in_use)
    return t("l11_pass", LANG, value=measured)


print(check())

# %% [markdown] lang="en"
# ## Labs
# Write this lesson's part of the engine yourself, graded in the engine: `sliding_window` (A sliding window: freeing blocks out of the window, 30 min). Copy the starter from `labs/starters/`, fill in the TODOs and run `python -m lessons grade <lab> --impl <your file>`; [the labs](../../docs/labs.md) explains each one.
# %% [markdown] lang="zh"
# ## 实验
# 亲手实现本课讲到的引擎部件，放进引擎中运行并评分：`sliding_window`（滑动窗口：释放窗口外的块，30 分钟）。从 `labs/starters/` 复制起始代码，完成其中的 TODO，然后运行 `python -m lessons grade <lab> --impl <你的文件>`；[实验说明](../../docs/labs.zh.md)逐一介绍每个实验。

# %% [markdown] lang="en"
# ## Self-check
# For discussion or an exam; the answers follow from this lesson.
# - **Warm-up.** Why does a prefill of a 1,200-token prompt need all 75 blocks in a sliding group of window 512?
# - **Core.** Why does vLLM keep a null entry in the table instead of removing the freed block's entry?
# - **Design.** A prefix-cache hit in a sliding group needs only the blocks of the last window before the hit's end. Why is that enough, and what does the full group need?
# %% [markdown] lang="zh"
# ## 自测题
# 供讨论或考试使用；答案都可以从本课推出。
# - **热身。**为什么在窗口为 512 的滑动窗口组里，预填充一个 1,200 个 token 的提示词需要全部 75 个块？
# - **核心。**为什么 vLLM 在块表里留下一个空块项，而不是直接删掉被释放块的那一项？
# - **设计。**滑动窗口组的前缀缓存命中只需要命中终点之前最后一个窗口的块。为什么这就够了？全注意力组需要什么？
