# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown] lang="en"
# # Lesson 8 — Automatic prefix caching
#
# **Goal:** see how requests that begin with the same tokens (a system prompt, few-shot examples, a chat
# history) reuse KV blocks already computed, by walking vLLM's own design-document example on the real
# engine, step by step, and checking every claim of it.
#
# The paper calls this a *shared prefix* (§4.4, Figure 10). vLLM v1 made it automatic and on by default:
#
# - Every **full** block gets a **block hash**: `SHA-256(parent block hash, the block's token ids, extra keys)`.
#   Because the parent's hash is inside, a hash names the block's tokens *and everything before them*.
# - A map `block_hash -> block` finds, for a new prompt, the longest run of leading blocks already computed.
#   Their KV is reused (the request's block table points at them, refcount + 1); only the rest is prefilled,
#   attending to the cached blocks through the block table.
# - A freed block **keeps its hash**: it is free, but *cached and evictable*. The **free queue** hands out
#   blocks from its head (least recently used); taking a cached block there **evicts** it (its hash is dropped).
#
# Our engine follows vLLM's names: `engine/core/prefix_cache.py` (hashes, the map), `engine/core/block_manager.py`
# (`FreeBlockQueue`, `touch`, eviction), like vLLM's `kv_cache_manager.py` and `block_pool.py`.

# %% [markdown] lang="zh"
# # 第 8 课　自动前缀缓存（automatic prefix caching）
#
# **目标**：在真实引擎上一步一步重走 vLLM 设计文档中的例子并逐条验证其结论，看清以相同 token 开头的请求（系统提示词、少样本示例、对话历史）如何复用已经算好的 KV 块。
#
# 论文称之为*共享前缀*（§4.4，图 10）。vLLM v1 把它做成了自动的、默认开启的功能：
#
# - 每个**满的**块都有一个**块哈希**（block hash）：`SHA-256(父块哈希, 本块的 token id, 额外键)`。因为其中含有父块的哈希，一个哈希标识的是本块的 token *以及它之前的全部内容*。
# - 映射表 `block_hash -> block` 为新提示词找出已经计算过的、最长的一串开头块。这些块的 KV 被复用（请求的块表指向它们，引用计数 + 1）；只有其余部分需要预填充；预填充时通过块表读取已缓存块中的 K、V，参与注意力计算。
# - 被释放的块**保留它的哈希**：它是空闲的，但*已缓存、可驱逐*（cached and evictable）。**空闲队列**从队头（最久未使用）分配块；在那里取走一个已缓存的块就会**驱逐**它（丢弃它的哈希）。
#
# 本引擎沿用 vLLM 的命名：`engine/core/prefix_cache.py`（哈希与映射表）、`engine/core/block_manager.py`（`FreeBlockQueue`、`touch`、驱逐），对应 vLLM 的 `kv_cache_manager.py` 与 `block_pool.py`。

# %%
# Make `engine` importable when this notebook is opened from lessons/<lang>/ without `pip install -e .`
import pathlib
import sys

try:
    import engine  # noqa: F401
except ImportError:
    sys.path.insert(0, str(next(p for p in pathlib.Path.cwd().resolve().parents if (p / "engine").is_dir())))

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.model_executor.model_loader import load_model
from engine.report import ALLOCATE, CACHE_HIT, EVICT, FREE
from visualize.i18n import t

LANG = "en"  # the language of the printed lines and of the check's messages

weights = load_model(None)  # SmolLM2-135M-Instruct, loaded once and reused by every engine below


def new_engine(block_size=4, num_blocks=10, caching=True):
    return LLMEngine(EngineConfig(block_size=block_size, num_gpu_blocks=num_blocks, enable_prefix_caching=caching),
                     loaded_model=weights)


def show(engine, report):
    """What a step did to the blocks, and the free queue after it (head = evicted next; * = cached)."""
    for kind in (CACHE_HIT, ALLOCATE, EVICT, FREE):
        blocks = [(e.request_id, e.block_id) for e in report.events if e.kind == kind]
        if blocks:
            print(t("lp8_event_blocks", LANG, kind=t(f"ev_{kind}", LANG), blocks=blocks))
    cached = set(engine.kv.cached_free_blocks())
    print(t("lp8_free_queue", LANG, queue=" ".join(f"{b}{'*' if b in cached else ''}" for b in engine.kv.free_queue())))


# %% [markdown] lang="en"
# ## 1. vLLM's example: block size 4, 10 blocks
# The prompts are token ids, so their lengths are exact: request 0 has 15 prompt tokens.
#
# **Time 1.** The cache is empty. Request 0 gets 4 blocks: 3 are full and, once their KV is written at the
# end of the step, cached; the 4th holds 3 of 4 tokens and is not hashed.

# %% [markdown] lang="zh"
# ## 1. vLLM 的例子：块大小 4，共 10 个块
# 提示词直接给 token id，长度因此是精确的：请求 0 的提示词有 15 个 token。
#
# **时刻 1。** 缓存为空。请求 0 得到 4 个块：其中 3 个是满的，在本步结束、KV 写入之后被缓存；第 4 个块只装了 4 个 token 中的 3 个，不计算哈希。

# %%
eng = new_engine()
cache = eng.kv.prefix_cache
r0 = eng.add_request(list(range(100, 115)), SamplingParams(max_tokens=4, ignore_eos=True))
show(eng, eng.step())
print(t("lp8_cached_blocks", LANG, blocks=[b for b in range(10) if cache.block_hash[b]]))
assert [b for b in range(10) if cache.block_hash[b]] == [0, 1, 2]

# %% [markdown] lang="en"
# **Time 2-3.** Request 0's first decode fills block 3 (it is cached now); the next token needs a new block, 4.
# In the same step request 1 arrives: 14 prompt tokens, of which the first 10 are request 0's.
# Only the first **2** blocks (8 tokens) hit: the 3rd block matches only 2 of its 4 tokens, and a block is
# shared whole or not at all.

# %% [markdown] lang="zh"
# **时刻 2-3。** 请求 0 的第一次解码填满了块 3（它现在被缓存了）；下一个 token 需要新块 4。同一步里请求 1 到达：14 个提示词 token，其中前 10 个与请求 0 相同。只有前 **2** 个块（8 个 token）命中：第 3 个块的 4 个 token 中只有 2 个相同，而块要么整块共享，要么不共享。

# %%
show(eng, eng.step())
assert cache.block_hash[3] is not None
r1 = eng.add_request(list(range(100, 110)) + [200, 201, 202, 203], SamplingParams(max_tokens=3, ignore_eos=True))
report = eng.step()
show(eng, report)
print(t("lp8_computed", LANG, counts={s.request_id: s.num_tokens for s in report.scheduled}))
assert [e.block_id for e in report.events if e.kind == CACHE_HIT] == [0, 1]
assert {s.request_id: s.num_tokens for s in report.scheduled}[r1] == 14 - 8

# %% [markdown] lang="en"
# **Time 5.** Request 0 finishes. Its blocks are freed **in reverse** (4, 3, 2): a request's last blocks hash the
# longest prefixes and are the least likely to be reused, so they should be evicted first. Blocks 0 and 1 do not
# return: request 1 still holds them (refcount 1). Blocks 2 and 3 are free *and* cached.
#
# **Time 6.** Request 1 finishes: 6, 5, 1, 0 join the tail.

# %% [markdown] lang="zh"
# **时刻 5。** 请求 0 结束。它的块按**逆序**释放（4、3、2）：一个请求靠后的块，其哈希涵盖的前缀最长，最不可能被复用，所以应最先被驱逐。块 0 和 1 没有回到队列：请求 1 还持有它们（引用计数 1）。块 2 和 3 既是空闲的，*又*是已缓存的。
#
# **时刻 6。** 请求 1 结束：6、5、1、0 加到队尾。

# %%
show(eng, eng.step())
assert eng.kv.free_queue() == [7, 8, 9, 4, 3, 2]
show(eng, eng.step())
assert eng.kv.free_queue() == [7, 8, 9, 4, 3, 2, 6, 5, 1, 0]

# %% [markdown] lang="en"
# **Time 7.** Request 2 arrives with 29 prompt tokens, the first 12 request 0's. Blocks 0, 1, 2 hit. They are
# **touched** first: taken off the free queue before anything is allocated, so the queue becomes
# 7 8 9 4 3 6 5 and the allocation cannot evict them. Request 2 needs 8 blocks: the 3 hits and 5 from the
# head: 7, 8, 9, 4 and 3, and block 3 is **evicted** (it was cached).

# %% [markdown] lang="zh"
# **时刻 7。** 请求 2 到达，有 29 个提示词 token，前 12 个与请求 0 相同。块 0、1、2 命中。它们先被 `touch`（vLLM 的函数名：引用计数 + 1，并从空闲队列中移出）：这发生在分配任何块之前，于是队列变成 7 8 9 4 3 6 5，分配也就不会驱逐它们。请求 2 需要 8 个块：3 个命中块，再从队头取 5 个：7、8、9、4 和 3，其中块 3 被**驱逐**（它原本是已缓存的）。

# %%
r2 = eng.add_request(list(range(100, 112)) + list(range(300, 317)), SamplingParams(max_tokens=1, ignore_eos=True))
report = eng.step()
show(eng, report)
assert [e.block_id for e in report.events if e.kind == CACHE_HIT] == [0, 1, 2]
assert [e.block_id for e in report.events if e.kind == ALLOCATE] == [7, 8, 9, 4, 3]
assert [e.block_id for e in report.events if e.kind == EVICT] == [3]
print(t("lp8_cached_tokens", LANG, counts={r: eng.get_output(r).num_cached_tokens for r in (r0, r1, r2)}))
stats = eng.prefix_cache_stats()
print(t("lp8_hit_rate", LANG, hits=stats.hits, queries=stats.queries, rate=stats.hit_rate))
print(t("lp8_cached_free", LANG, slots=report.memory.cached_free_slots, kib=report.memory.bytes("cached_free_slots") // 1024))

# %% [markdown] lang="en"
# ## 2. The usual confusions
# **A shared prefix shorter than one block never hits.** Only full blocks are hashed.

# %% [markdown] lang="zh"
# ## 2. 常见的误解
# **短于一个块的共享前缀永远不会命中。** 只有满的块才计算哈希。

# %%
short = new_engine(block_size=16, num_blocks=20)
for _ in range(2):
    out = short.get_output(short.add_request(list(range(100, 110)), SamplingParams(max_tokens=1)))
    while short.has_unfinished_requests():
        short.step()
    print(t("lp8_short_prompt", LANG, n=short.get_output(out.request_id).num_cached_tokens))

# %% [markdown] lang="en"
# **The first batch cannot reuse what it is computing.** A block is hashed only after the step that writes its
# KV, so two identical prompts admitted in the same step both compute everything (and the map keeps one copy).
#
# **The last token is always recomputed.** Its logits choose the next token, so a prompt found entirely in the
# cache still computes its last block: a prompt of 8 tokens sent twice computes 4 tokens the second time.

# %% [markdown] lang="zh"
# **第一批请求无法复用自己正在计算的内容。** 块只有在写入其 KV 的那一步之后才计算哈希，所以同一步被接纳的两个相同提示词都会完整计算一遍（映射表只保留一份）。
#
# **最后一个 token 总是重新计算。** 它的 logits 决定下一个 token，所以即使提示词全部在缓存中，也要计算它的最后一个块：一个 8 token 的提示词发送两次，第二次计算 4 个 token。

# %%
same = new_engine(num_blocks=20)
ids = [same.add_request(list(range(500, 508)), SamplingParams(max_tokens=1)) for _ in range(2)]
first = same.step()
print(t("lp8_same_step", LANG, hits=[e.block_id for e in first.events if e.kind == CACHE_HIT],
        computed=[s.num_tokens for s in first.scheduled]))
again = same.add_request(list(range(500, 508)), SamplingParams(max_tokens=1))
second = same.step()
print(t("lp8_sent_again", LANG, cached=same.get_output(again).num_cached_tokens, computed=[s.num_tokens for s in second.scheduled]))

# %% [markdown] lang="en"
# **The block size trades fragmentation against prefix granularity.** A small block wastes less of each
# request's last block (internal fragmentation < block_size slots) *and* lets more of a shared prefix hit;
# a large block gives fewer, bigger kernel reads but rounds every shared prefix down to whole blocks.

# %% [markdown] lang="zh"
# **块大小在碎片与前缀粒度之间权衡。** 小块让每个请求最后一个块浪费得更少（内部碎片 < `block_size` 个槽位），*也*让共享前缀中更多的部分能够命中；大块让内核的读取更少、更大，但每个共享前缀都要向下取整到整块。

# %%
prefix = list(range(1000, 1021))  # 21 shared tokens
for bs in (2, 4, 8, 16):
    e = new_engine(block_size=bs, num_blocks=200 // bs)
    for tail in ([1, 2, 3], [4, 5, 6]):
        rid = e.add_request(prefix + tail, SamplingParams(max_tokens=1))
        while e.has_unfinished_requests():
            e.step()
    print(t("lp8_block_size", LANG, bs=bs, n=e.get_output(rid).num_cached_tokens))

# %% [markdown] lang="en"
# ## 3. Exercise
# Continue the example after Time 7. Request 2 (max_tokens=1) finished in that step, freeing its 8 blocks in
# reverse. Now **request 3** arrives: 18 tokens, request 2's first 16 followed by two others.
# Without running anything: which blocks does it hit, in order, and which block does its allocation evict?
# (Write `None` for "no eviction" only if you are sure.) Hint: at most `(18 - 1) // 4` blocks can hit; which
# of the blocks left on the queue are still cached?

# %% [markdown] lang="zh"
# ## 3. 练习
# 接着时刻 7 继续。请求 2（max_tokens=1）在那一步就结束了，按逆序释放了它的 8 个块。现在**请求 3** 到达：18 个 token，前 16 个与请求 2 相同，后面是另外两个。不运行任何代码：它依次命中哪些块？它的分配会驱逐哪个块？（只有确定“没有驱逐”时才写 `None`。）
#
# 提示：最多有 `(18 - 1) // 4` 个块能命中；队列里剩下的块中，哪些仍然是已缓存的？

# %% tags=["exercise"]
predicted_hits = None  # TODO(student): a list of block ids
predicted_evicted = None  # TODO(student): a block id

# %% tags=["check"]
def check():
    from visualize.i18n import t  # the check's messages, in the notebook's language
    if predicted_hits is None:
        return t("l8_fail_none", LANG)
    e = new_engine()
    for prompt, max_tokens, steps in ((list(range(100, 115)), 4, 2), (list(range(100, 110)) + [200, 201, 202, 203], 3, 3),
                                      (list(range(100, 112)) + list(range(300, 317)), 1, 1)):
        e.add_request(prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
        for _ in range(steps):
            e.step()
    e.add_request(list(range(100, 112)) + list(range(300, 304)) + [7, 7], SamplingParams(max_tokens=1, ignore_eos=True))
    report = e.step()
    hits = [ev.block_id for ev in report.events if ev.kind == CACHE_HIT]
    evicted = [ev.block_id for ev in report.events if ev.kind == EVICT]
    if list(predicted_hits) != hits:
        return t("l8_fail_hits", LANG, value=predicted_hits)
    if [predicted_evicted] != evicted and not (predicted_evicted is None and not evicted):
        return t("l8_fail_evicted", LANG, value=predicted_evicted)
    return t("l8_pass", LANG, hits=hits, evicted=evicted)


print(check())

# %% [markdown] lang="en"
# ## Labs
# Write this lesson's parts of the engine yourself, graded in the engine: `prefix_cache` (Prefix caching: the block hash chain, hits, eviction, 60 min). The radix tree's and LPM's labs come with lesson 13. Copy the starter from `labs/starters/`, fill in the TODOs and run `python -m lessons grade <lab> --impl <your file>`; [the labs](../../docs/labs.md) explains each one.
# %% [markdown] lang="zh"
# ## 实验
# 亲手实现本课讲到的引擎部件，放进引擎中运行并评分：`prefix_cache`（前缀缓存：块哈希链、命中与驱逐，60 分钟）。基数树和 LPM 的实验放在第 13 课之后。从 `labs/starters/` 复制起始代码，完成其中的 TODO，然后运行 `python -m lessons grade <lab> --impl <你的文件>`；[实验说明](../../docs/labs.zh.md)逐一介绍每个实验。

# %% [markdown] lang="en"
# ## Self-check
# For discussion or an exam; the answers follow from this lesson.
# - **Warm-up.** Why does a block hash include its parent block's hash, not only the block's own tokens?
# - **Core.** Two prompts share their first 37 tokens, with block size 16. How many tokens can the second one take from the prefix cache, and why not 37?
# - **Design.** A cached block whose reference count drops to 0 is kept as cached and evictable. Which one is evicted first when a new block is needed, and what does that order assume about the requests to come?
# %% [markdown] lang="zh"
# ## 自测题
# 供讨论或考试使用；答案都可以从本课推出。
# - **热身。**为什么块哈希要包含父块的哈希，而不只是本块自己的 token？
# - **核心。**两个提示词的前 37 个 token 相同，块大小为 16。第二个提示词能从前缀缓存取到多少个 token？为什么不是 37 个？
# - **设计。**引用计数降到 0 的已缓存块会留下来，成为“已缓存、可驱逐”。需要新块时先驱逐哪一个？这个顺序对之后的请求做了什么假设？
