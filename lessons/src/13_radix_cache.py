# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown] lang="en"
# # Lesson 13 — The radix tree, cache-aware scheduling and a CPU tier
#
# **Goal:** run one multi-turn trace through vLLM's hash chain and through SGLang's radix tree on the real
# engine and see what each keeps and evicts; then order the waiting queue by cached prefix (LPM against FCFS)
# and put a CPU tier under the cache, and measure all of it on the simulator.
#
# Lesson 8 built the **hash chain**: each full block is named by the hash of its tokens and its parent's hash;
# a freed block stays cached until the free queue hands it out again, least recently *freed* first.
# SGLang's **RadixAttention** (Zheng et al. 2024, §3) keeps the same blocks as a **radix tree**: each edge is a
# run of tokens, each node holds the blocks of its edge, and the path from the root spells a prefix.
#
# - A lookup walks the tree from the root; where a prompt leaves a node part-way, the node is **split**.
# - Each node has a **lock count**: the running requests whose path passes through it. A locked node is never
#   evicted; eviction takes the **least recently used unlocked leaf**, block by block.
# - Evicted blocks can go to a **CPU tier** (SGLang's HiCache, vLLM's KV offloading) and be **loaded back** on a
#   later hit instead of computed again.
#
# In the engine: `engine/core/radix_cache.py` (the tree), `engine/core/scheduling_policy.py` (LPM),
# `engine/core/kv_offload.py` (the CPU tier), chosen with `EngineConfig(prefix_cache="radix",
# scheduling_policy="lpm", kv_offload_blocks=N)`.

# %% [markdown] lang="zh"
# # 第 13 课　基数树、缓存感知调度与 CPU 层
#
# **目标**：在真实引擎上让同一条多轮对话请求轨迹分别经过 vLLM 的哈希链和 SGLang 的基数树，看清两者各保留什么、驱逐什么；然后按已缓存前缀给等待队列排序（LPM 对比 FCFS），并在缓存下面再加一个 CPU 层，再在模拟器上把这些都测出来。
#
# 第 8 课讲了**哈希链**（hash chain）：每个满块由它的 token 和父块哈希算出的哈希命名；被释放的块仍留在缓存中，直到空闲队列再次把它分配出去；*最早释放*的块最先被分配出去（也就最先被驱逐）。SGLang 的 **RadixAttention**（Zheng 等，2024，§3）把同样的块组织成一棵**基数树**（radix tree）：每条边是一串 token，每个节点持有这条边的块，从根出发的路径拼出一个前缀。
#
# - 查找从根开始沿树向下走；提示词在某个节点中途分岔时，这个节点被**分裂**。
# - 每个节点有一个**锁计数**（lock count）：路径经过它的运行中请求数。被锁定的节点永不驱逐；驱逐时取**最久未用的未锁定叶节点**，一块一块地驱逐。
# - 被驱逐的块可以进入 **CPU 层**（cpu tier；SGLang 的 HiCache、vLLM 的 KV 卸载），之后命中时**载回**（load back），而不是重计算。
#
# 引擎中的位置：`engine/core/radix_cache.py`（树）、`engine/core/scheduling_policy.py`（LPM）、`engine/core/kv_offload.py`（CPU 层），用 `EngineConfig(prefix_cache="radix", scheduling_policy="lpm", kv_offload_blocks=N)` 选择。

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

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.model_executor.model_loader import load_model
from engine.report import EVICT
from engine.sim.simulator import simulate
from visualize.i18n import t

LANG = "en"  # the language of the printed lines and of the check's messages

weights = load_model(None)  # SmolLM2-135M-Instruct, loaded once and reused by every engine below
SYSTEM = list(range(100, 112))  # a 12-token "system prompt": 3 blocks of 4


def new_engine(cache, num_blocks=8, offload=0, policy="fcfs"):
    return LLMEngine(EngineConfig(block_size=4, num_gpu_blocks=num_blocks, max_num_seqs=1, prefix_cache=cache,
                                  scheduling_policy=policy, kv_offload_blocks=offload), loaded_model=weights)


def run(engine, prompt, max_tokens=4):
    """One request to its end; returns its output and the reports of its steps."""
    rid = engine.add_request(prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    reports = []
    while engine.has_unfinished_requests():
        reports.append(engine.step())
    return engine.get_output(rid), reports


def show_tree(report):
    """The radix tree after a step, one node a line, indented under its parent."""
    depth = {0: 0}
    for node in report.radix_tree.nodes:  # parents first
        depth[node.node_id] = depth[node.parent_id] + 1
        print("    " * depth[node.node_id] + t("lp13_node", LANG, tokens=node.token_ids, blocks=node.blocks, lock=node.lock_ref,
                                                  step=node.last_access_step))


# %% [markdown] lang="en"
# ## 1. One trace, two caches
# The trace is a chat: conversation A's first turn (the system prompt and 6 tokens of its own), A's second
# turn (its whole history, the model's answer included, and 4 new tokens), then conversation B's first turn,
# which shares only the system prompt. One request runs at a time, so each can hit what the last one cached.

# %% [markdown] lang="zh"
# ## 1. 同一条轨迹，两种缓存
# 这条请求轨迹是一段聊天：对话 A 的第一轮（系统提示词和它自己的 6 个 token）、A 的第二轮（全部历史，包括模型的回答，再加 4 个新 token），然后是对话 B 的第一轮，它只和前面共享系统提示词。每次只运行一个请求，所以每个请求都能命中前一个缓存下来的内容。

# %%
a1 = SYSTEM + list(range(200, 206))
for cache in ("hash", "radix"):
    eng = new_engine(cache)
    out_a1, _ = run(eng, a1)
    a2 = a1 + out_a1.outputs[0].token_ids + [210, 211, 212, 213]
    out_a2, _ = run(eng, a2)
    out_b1, reports = run(eng, SYSTEM + list(range(300, 306)))
    print(t("lp13_cached", LANG, cache=t(f"prefix_cache_{cache}", LANG), counts=[o.num_cached_tokens for o in (out_a1, out_a2, out_b1)]))
show_tree(reports[-1])

# %% [markdown] lang="en"
# Both caches find the same blocks: a hit is a run of full leading blocks either way (the last prompt token is
# always computed). The tree shows the structure the hash chain leaves implicit: one node for the system prompt,
# **split** off when B left A's path after 3 blocks, and one branch per conversation. Every lock count is 0:
# nothing runs, so every leaf is evictable, and the system prompt's node is not a leaf as long as a branch
# hangs below it.
#
# ## 2. Eviction: LRU leaves, and a CPU tier under them
# A pool of 8 blocks holds the tree above (7 cached blocks). A long unrelated prompt of 20 tokens needs 6 blocks:
# 1 is free, so 5 cached blocks must go. The tree evicts the least recently used leaf first, its last block first,
# and a leaf that empties lets its parent become a leaf. With a CPU tier of 4 blocks the evicted blocks are copied
# there instead of dropped; the tier itself drops its least recently used block when full.

# %% [markdown] lang="zh"
# 两种缓存找到的块相同：无论哪种，命中都是开头的一串满块（提示词的最后一个 token 总是要计算）。树把哈希链隐含的结构画了出来：系统提示词单独成一个节点（B 在第 3 个块之后离开 A 的路径时，它被**分裂**出来），每段对话各一个分支。所有锁计数都是 0：没有请求在运行，所以每个叶节点都可驱逐；只要下面还挂着分支，系统提示词的节点就不是叶节点。
#
# ## 2. 驱逐：最久未用的叶节点，以及其下的 CPU 层
# 一个 8 块的显存池装着上面的树（7 个已缓存的块）。一个 20 token 的无关长提示词需要 6 个块：只有 1 个空闲，于是必须驱逐 5 个已缓存的块。树先驱逐最久未用的叶节点，从它的最后一块开始；叶节点清空后，它的父节点就成了叶节点。有 4 块的 CPU 层时，被驱逐的块复制到那里而不是丢弃；CPU 层满时，它自己丢弃最久未用的块。

# %%
eng = new_engine("radix", offload=4)
out_a1, _ = run(eng, a1)
run(eng, SYSTEM + list(range(300, 306)))
_, reports = run(eng, list(range(400, 420)))
print(t("lp13_evicted", LANG, blocks=[e.block_id for r in reports for e in r.events if e.kind == EVICT]))
print(t("lp13_tier", LANG, offloaded=sum(len(r.kv_offload.offloaded) for r in reports),
        dropped=sum(r.kv_offload.dropped for r in reports), held=reports[-1].kv_offload.cpu_blocks))
show_tree(reports[-1])

# %% [markdown] lang="en"
# ## 3. Exercise
# On this engine (the tree above, the CPU tier after those evictions), conversation A comes back: its second turn,
# A's first prompt, the model's answer to it and 4 new tokens. Without running anything: how many of its prompt
# tokens does it find cached (`num_cached_tokens`, both tiers), and how many of those are loaded back from the CPU
# tier? Think about which blocks were evicted in which order (A's branch was used least recently), which of them
# the tier of 4 blocks still holds, and that a hit is a run of leading blocks: it stops at the first block found in
# neither tier.

# %% [markdown] lang="zh"
# ## 3. 练习
# 在这个引擎上（上面的树，以及那些驱逐之后的 CPU 层），对话 A 回来了：它的第二轮，即 A 的第一个提示词、模型对它的回答，再加 4 个新 token。不运行任何代码：它的提示词中有多少个 token 能在缓存中找到（`num_cached_tokens`，两层合计）？其中多少个是从 CPU 层载回的？
#
# 提示：想一想哪些块按什么顺序被驱逐（A 的分支最久未用），4 块的 CPU 层还留着其中哪些，以及命中是开头的一串块：遇到第一个两层都没有的块就停止。

# %% tags=["exercise"]
predicted_cached_tokens = None  # TODO(student): prompt tokens found cached, GPU and CPU tier together
predicted_loaded_tokens = None  # TODO(student): of those, tokens loaded back from the CPU tier

# %% tags=["check"]
def check():
    from lessons.checks import radix_exercise_expectation
    from visualize.i18n import t  # the check's messages, in the notebook's language
    if predicted_cached_tokens is None or predicted_loaded_tokens is None:
        return t("l13_fail_none", LANG)
    cached, loaded = radix_exercise_expectation(lambda offload: new_engine("radix", offload=offload), run, SYSTEM)
    if predicted_cached_tokens != cached:
        return t("l13_fail_cached", LANG, value=predicted_cached_tokens)
    if predicted_loaded_tokens != loaded:
        return t("l13_fail_loaded", LANG, value=predicted_loaded_tokens)
    return t("l13_pass", LANG, cached=cached, loaded=loaded)


print(check())

# %% [markdown] lang="en"
# ## 4. At scale: hash or tree, with or without the CPU tier; FCFS or LPM
# The simulator runs the same scheduler and allocator without a model, its clock a step-time model (here an
# A100 with OPT-13B). First a multi-turn chat workload with token ids: 400 requests, Poisson arrivals at 2 a
# second, a pool of 400 blocks of 16; the hash chain, the tree, and the tree with a CPU tier of 2,000 blocks.

# %% [markdown] lang="zh"
# ## 4. 放大规模：哈希链还是树，有没有 CPU 层；FCFS 还是 LPM
# 模拟器在没有模型的情况下运行同样的调度器和分配器，它的时钟是一个步时模型（这里是 A100 上的 OPT-13B）。先看带 token id 的多轮对话负载：400 个请求，泊松到达，每秒 2 个，一个 400 块、块大小 16 的显存池；依次用哈希链、基数树、基数树加 2,000 块的 CPU 层。

# %%
from tqdm import tqdm

SCALE = dict(block_size=16, cost_model="a100-opt-13b", seed=0, enable_prefix_caching=True, num_requests=400, progress=False)
rows = []
for cache, offload in tqdm((("hash", 0), ("radix", 0), ("radix", 2000)), desc=t("lp13_progress", LANG), mininterval=1):
    rows.append(simulate(workload="multiturn", request_rate=2, kv_slots=400 * 16, prefix_cache=cache, kv_offload_blocks=offload, **SCALE))
for (cache, offload), r in zip((("hash", 0), ("radix", 0), ("radix", 2000)), rows):
    print(t("lp13_sim_row", LANG, cache=t(f"prefix_cache_{cache}", LANG), policy=t("scheduling_fcfs", LANG), offload=offload,
            rate=r.prefix_cache_hit_rate, prefill=r.prefill_tokens_computed, p50=r.ttft_percentile_s(50), p99=r.ttft_percentile_s(99)))
print(t("lp13_tier_copies", LANG, offloaded=rows[-1].kv_offloaded_blocks, loaded=rows[-1].kv_loaded_blocks))
assert rows[-1].prefix_cache_hit_rate > rows[1].prefix_cache_hit_rate > rows[0].prefix_cache_hit_rate

# %% [markdown] lang="en"
# Read the rows against sections 1 and 2: the tree keeps the shared history that later turns need where the hash
# chain may evict an inner block first. The CPU tier turns most evictions into later loads and computes less than
# half the prefill tokens, yet TTFT rises a little: every block evicted is now copied out, and every hit in the tier
# copied back in, by the step that needs it, and every request in that step waits for those copies. Whether a load
# beats a recompute depends on the machine and the link: `CostModel.load_beats_recompute` and
# [docs/prefix-caching.md](../../docs/prefix-caching.md) give the numbers.
#
# **Longest prefix match** (SGLang's LPM) admits the waiting request with the most cached prompt tokens first. It
# can only change something while requests queue and compete for the cache: in the chat above, a queue forms only
# at times. Next, a few-shot workload: four tasks, each with its own 800-token prefix, arriving mixed at 8 requests
# a second into a pool of 150 blocks that holds about two prefixes besides the running requests.

# %% [markdown] lang="zh"
# 对照第 1、2 节来看这几行结果：树保留了后续轮次需要的共享历史，而哈希链可能先驱逐一个内部块。CPU 层把大部分驱逐变成了之后的载回，需要计算的预填充 token 不到原来的一半，但首 token 延迟反而略有上升：现在每个被驱逐的块都要复制出去，每次在 CPU 层命中都要复制回来，复制由需要它的那一步完成，该步里的每个请求都要等这些复制。载回是否比重计算划算取决于机器和传输链路：`CostModel.load_beats_recompute` 和 [docs/prefix-caching.md](../../docs/prefix-caching.md) 给出了数字。
#
# **最长前缀匹配**（longest prefix match，SGLang 的 LPM）先接纳已缓存提示词 token 最多的等待请求。只有请求排队并争用缓存时它才可能改变什么：在上面的多轮对话里，只是偶尔形成队列。下面换成少样本负载：四个任务，各有自己的 800 个 token 的前缀，混在一起以每秒 8 个请求到达，显存池只有 150 块，除了运行中的请求，大约只放得下两个前缀。

# %%
few = [simulate(workload="fewshot", request_rate=8, kv_slots=150 * 16, prefix_cache="radix", scheduling_policy=policy, **SCALE)
       for policy in tqdm(("fcfs", "lpm"), desc=t("lp13_progress", LANG), mininterval=1)]
for policy, r in zip(("fcfs", "lpm"), few):
    print(t("lp13_sim_row", LANG, cache=t("prefix_cache_radix", LANG), policy=t(f"scheduling_{policy}", LANG), offload=0,
            rate=r.prefix_cache_hit_rate, prefill=r.prefill_tokens_computed, p50=r.ttft_percentile_s(50), p99=r.ttft_percentile_s(99)))
assert few[1].prefix_cache_hit_rate > few[0].prefix_cache_hit_rate and few[1].ttft_percentile_s(50) < few[0].ttft_percentile_s(50)

# %% [markdown] lang="en"
# FCFS admits the tasks in arrival order, so each task's prefix is evicted by the others' and computed again; LPM
# runs the requests of a task while its prefix is cached, computes far fewer prefill tokens, and its shorter steps
# drain the queue: the median TTFT drops several-fold. The waiting request LPM passes over is not starved: after
# `lpm_max_wait_steps` steps it goes first, which is why the p99 falls less than the median.

# %% [markdown] lang="zh"
# FCFS 按到达顺序接纳各个任务，于是每个任务的前缀都会被其他任务的前缀驱逐，然后重新计算；LPM 趁某个任务的前缀还在缓存中时运行这个任务的请求，需要计算的预填充 token 少得多，每步更短，队列也就排空了：首 token 延迟的中位数降到原来的几分之一。被 LPM 跳过的等待请求不会饿死：等待超过 `lpm_max_wait_steps` 步之后它排到最前，所以 p99 降得比中位数少。

# %% [markdown] lang="en"
# ## Labs
# Write this lesson's parts of the engine yourself, graded in the engine (all optional): `radix_match` (The radix tree: match and split, 45 min), `radix_insert` (The radix tree: insert and LRU eviction of leaves, 60 min), `lpm` (Cache-aware scheduling: longest prefix match, 30 min). Copy the starter from `labs/starters/`, fill in the TODOs and run `python -m lessons grade <lab> --impl <your file>`; [the labs](../../docs/labs.md) explains each one.
# %% [markdown] lang="zh"
# ## 实验
# 亲手实现本课讲到的引擎部件，放进引擎中运行并评分（均为选做）：`radix_match`（基数树：匹配与分裂，45 分钟）、`radix_insert`（基数树：插入与按 LRU 驱逐叶节点，60 分钟）、`lpm`（缓存感知调度：最长前缀匹配，30 分钟）。从 `labs/starters/` 复制起始代码，完成其中的 TODO，然后运行 `python -m lessons grade <lab> --impl <你的文件>`；[实验说明](../../docs/labs.zh.md)逐一介绍每个实验。

# %% [markdown] lang="en"
# ## Self-check
# For discussion or an exam; the answers follow from this lesson.
# - **Warm-up.** Why does the radix tree split a node on a partial match, and what would go wrong if a match could end inside a node?
# - **Core.** A node's lock count is 2. What does that say about the running requests, and why can its blocks not be evicted even though they are cached?
# - **Design.** LPM can starve a request whose prefix is never cached. What does the engine do about it, and what does that cost the hit rate?
# %% [markdown] lang="zh"
# ## 自测题
# 供讨论或考试使用；答案都可以从本课推出。
# - **热身。**为什么基数树在部分匹配时要分裂节点？如果一次匹配可以停在节点中间，会出什么问题？
# - **核心。**一个节点的锁计数是 2。这说明运行中的请求是什么情况？为什么它的块虽然已缓存却不能被驱逐？
# - **设计。**LPM 可能让前缀从未被缓存的请求饿死。引擎对此做了什么？这对命中率有什么代价？
