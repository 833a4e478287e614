# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown] lang="en"
# # Lesson 10 — Speculative decoding on a paged cache
#
# **Goal:** watch the engine propose draft tokens, verify them in one forward pass and roll back the
# rejected ones, block table by block table; then see why this pays while a decode step is memory-bound
# and stops paying as the batch grows, and predict the gain from a measured α, the chance that the model
# accepts a draft it judges (the Live engine page's acceptance rate, accepted ÷ proposed drafts, is a lower number).
#
# A decode step makes one token per sequence, and on a GPU it is memory-bound (lesson 1): reading the
# weights costs the same whether the step computes 1 query token or 5. Speculative decoding (Leviathan
# et al., 2023; Chen et al., 2023) uses the spare compute: a cheap **proposer** guesses the next k tokens
# (the **drafts**), the model runs the newest token and the k drafts in one forward pass, and keeps the
# drafts up to the first one it disagrees with, plus its own token after them. At temperature 0 the text
# is exactly the text plain greedy decoding writes. The engine's proposer here is **prompt lookup**
# (vLLM's method `"ngram"`): find the last few tokens earlier in the text and propose what followed them
# there. It costs nothing on the accelerator and pays off only when the answer repeats much of the prompt:
# edits, quotations, summaries.
#
# On a paged cache the drafts need KV slots before they are verified: the engine gives each sequence
# **lookahead slots** (vLLM's `num_lookahead_tokens`), **tentative** until the model has judged them. After
# verification the rejected drafts' slots are given back (**rollback**), a block left empty returns to the
# free list, and `num_computed_tokens` rewinds to the tokens that were kept.

# %% [markdown] lang="zh"
# # 第 10 课　分页缓存上的投机解码
#
# **目标**：观察引擎提出草稿 token、在一次前向计算中验证它们、回滚被拒绝的草稿，逐个查看块表的变化；然后理解为什么在解码步访存受限时这样做划算、批变大后就不再划算，并根据实测的 α（模型对判定过的草稿的接受概率）预测收益。实时引擎页面上的接受率是“接受的草稿数 ÷ 提出的草稿数”，是比 α 低的另一个数。
#
# 一步解码为每个序列生成一个 token，在 GPU 上它是访存受限的（第 1 课）：无论这一步计算 1 个还是 5 个查询 token，读取权重的开销都一样。投机解码（Leviathan 等，2023；Chen 等，2023）利用这些闲置的算力：一个廉价的**提议器**猜出接下来的 k 个 token（**草稿**），模型在一次前向计算中处理最新的 token 和这 k 个草稿，从第一个草稿起逐个比对，保留第一个与它不一致的草稿之前的所有草稿，再加上模型自己在这个位置给出的 token。温度为 0 时，生成的文本与普通贪心解码完全相同。这里引擎的提议器是**提示词查找**（vLLM 的方法 `"ngram"`）：在前文中找到最后几个 token 出现过的位置，把当时跟在后面的 token 作为草稿。它不占用加速器；只有当回答大段重复提示词的内容时才划算，例如修改文字、引用原文、写摘要。
#
# 在分页缓存上，草稿在验证之前就需要 KV 槽位：引擎给每个序列分配**前瞻槽位**（vLLM 的 `num_lookahead_tokens`），在模型判定之前它们是**暂定的**。验证之后，被拒绝草稿的槽位归还（**回滚**），变空的块回到空闲列表，`num_computed_tokens` 回退到被保留的 token 数。

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
from tqdm import tqdm

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.config import SpeculativeConfig
from engine.model_executor.model_loader import load_model
from engine.report import SPEC_ACCEPT, SPEC_PROPOSE, SPEC_REJECT
from engine.sim.cost_model import get_setup
from engine.sim.speculative import breakeven_batch, predict_speedup
from visualize.i18n import t
from visualize.style import use_cjk_font

LANG = "en"  # the language of the charts and of the check's messages
use_cjk_font()  # so that 中文 chart labels are drawn, not boxes

loaded = load_model(None)  # the default model (SmolLM2-135M-Instruct), read once for every engine below
K = 4  # draft tokens per step
EDIT = [{"role": "user", "content": "Fix the spelling in this text and write it out again: The quick brown fox jumpps "
                                    "over the lazy dog. The dog sleeps in the sun all day long."}]


def new_engine(k: int | None = K, block_size: int = 16, num_blocks: int = 64) -> LLMEngine:
    """The default model, greedy; speculative decoding by prompt lookup with k drafts (None: off)."""
    spec = SpeculativeConfig(method="ngram", num_speculative_tokens=k) if k else None
    return LLMEngine(EngineConfig(block_size=block_size, num_gpu_blocks=num_blocks, enable_prefix_caching=False,
                                  speculative_config=spec), loaded_model=loaded)


# %% [markdown] lang="en"
# ## 1. Propose, verify, roll back — step by step
# One request, blocks of 4 slots so that a step's drafts cross block boundaries. Each step prints the
# request's `num_computed_tokens` after it, the drafts and their tentative slots, how many
# the model accepted, the slots given back and the blocks freed. We step until a rejection frees a block.

# %% [markdown] lang="zh"
# ## 1. 提出、验证、回滚——逐步观察
# 一个请求，每块 4 个槽位，这样一步的草稿会跨越块的边界。每一步打印这一步之后请求的 `num_computed_tokens`、草稿及其暂定槽位、模型接受了多少个、归还的槽位和释放的块。一直单步执行，直到某次拒绝释放了一个块。

# %%
REWRITE = [{"role": "user", "content": "Rewrite this text, changing only 'the' to 'THE': The library opens at nine in the "
                                       "morning and closes at five in the afternoon."}]
eng = new_engine(block_size=4)
rid = eng.add_request(REWRITE, SamplingParams(max_tokens=48))


def computed_tokens() -> int:
    """The request's num_computed_tokens now: its tokens whose K and V are in the cache."""
    return next(g for g in eng.scheduler.running if g.request_id == rid).seqs[0].num_computed_tokens


report = eng.step()  # the prefill: no drafts yet (the first token comes from it)
snap = report.block_tables[0]
print(t("lp10_prefill", LANG, table=snap.block_table, computed=computed_tokens()))
while True:
    table_before, computed_before = snap.block_table, computed_tokens()
    report = eng.step()
    out = report.spec.get(rid)
    snap = next(s for s in report.block_tables if s.request_id == rid)
    computed = computed_tokens()
    if out is None:
        print(t("lp10_no_drafts", LANG, step=report.step, computed=computed))
    else:
        print(t("lp10_step", LANG, step=report.step, drafts=out.proposed, slots=out.tentative_slots, accepted=out.accepted,
                emitted=out.emitted, back=out.rolled_back_slots, freed=out.freed_blocks, computed=computed))
    if out is not None and out.freed_blocks:  # a rejection that emptied a block
        break

# %% [markdown] lang="en"
# The step with a rejection, slot by slot. Before it the request held `computed_before` tokens' KV. The step
# wrote K and V for its newest token and every draft (the drafts into tentative slots), computed the
# model's token at each of those positions, and compared: the drafts up to the first disagreement are
# kept, the rest are given back. After it `num_computed_tokens` counts only what was kept: the newest token
# plus the accepted drafts. The model's own next token (the "bonus") is in the output, its KV not yet
# written: the next step writes it, as in plain decoding.

# %% [markdown] lang="zh"
# 下面逐个槽位查看拒绝发生的那一步。在这一步之前，请求持有 `computed_before` 个 token 的 KV。这一步为最新的 token 和每个草稿写入 K 和 V（草稿写在暂定槽位里），在每个位置上算出模型自己的 token 并比较：直到第一个不一致之前的草稿被保留，其余的归还。之后 `num_computed_tokens` 只计入被保留的部分：最新的 token 加上被接受的草稿。模型自己生成的下一个 token（额外的 token，即 bonus token）已经在输出中，它的 KV 还没有写入：和普通解码一样，下一步再写。

# %%
bs = eng.config.block_size
events = [(t(f"ev_{e.kind}", LANG), e.slot) for e in report.events if e.kind in (SPEC_PROPOSE, SPEC_ACCEPT, SPEC_REJECT)]
print(t("lp10_events", LANG, events=events))
print(t("lp10_table_before", LANG, table=table_before, computed=computed_before))
print(t("lp10_table_after", LANG, table=snap.block_table, computed=computed, filled=snap.filled))
for b in sorted({s // bs for s in out.tentative_slots}):
    cells = ["T" if b * bs + i in out.tentative_slots and b * bs + i not in out.rolled_back_slots else
             "x" if b * bs + i in out.rolled_back_slots else "." for i in range(bs)]
    state = t("lp10_block_kept", LANG) if b in snap.block_table else t("lp10_block_freed", LANG)
    print(t("lp10_block_cells", LANG, block=b, cells=" ".join(cells), state=state))
assert computed == computed_before + 1 + out.accepted  # rewound: the newest token and the accepted drafts
assert set(out.rolled_back_slots) == set(out.tentative_slots[out.accepted:])
assert all(b not in snap.block_table for b in out.freed_blocks)

# %% [markdown] lang="en"
# `.` is a slot that held no draft, `T` a draft kept (its KV stays: it was the right token), `x` a rejected
# draft's slot, given back. A block whose slots all held rejected drafts is freed at once (`freed_blocks`) and
# leaves the block table; the allocator then holds exactly the blocks of the tokens kept, as if the
# request had never speculated.

# %% [markdown] lang="zh"
# `.` 表示没有放草稿的槽位，`T` 表示被保留的草稿（它的 KV 保留：这个 token 是对的），`x` 表示被拒绝草稿的槽位，已归还。如果一个块里的槽位全都属于被拒绝的草稿，它会立即被释放（`freed_blocks`）并离开块表；此后分配器持有的块恰好是被保留 token 所需的块，就像这个请求从未做过投机解码一样。

# %% [markdown] lang="en"
# ## 2. When it pays: a memory-bound step
# Each verification gives 1 to k + 1 tokens. Let α be the chance that the model accepts a draft that it
# judges (a draft after a rejection is never judged). It is not the Live engine page's acceptance rate (drafts
# accepted ÷ drafts proposed), which counts the unjudged drafts too and is lower: put that one into the
# formula below and E comes out too small. If each judged draft is accepted with chance α independently,
# a verification gives on average
#
# $$E = 1 + \alpha + \alpha^2 + \dots + \alpha^k = \frac{1 - \alpha^{k+1}}{1 - \alpha}$$
#
# tokens (Leviathan et al., 2023, §3.3). It pays when a step that verifies k + 1 tokens costs less than E
# plain steps. While a decode step is memory-bound, the k + 1 query tokens cost about what one does and
# the gain approaches E. As the batch grows the step reaches the compute roof: every extra query token
# costs its FLOPs, the rejected drafts' work is wasted, and speculation loses. The step-time model of
# an H100 serving Llama-3-8B (`engine/sim/speculative.py`) shows where.

# %% [markdown] lang="zh"
# ## 2. 何时划算：访存受限的解码步
# 每次验证得到 1 到 k + 1 个 token。设 α 为模型接受一个它判定过的草稿的概率（排在被拒绝草稿之后的草稿不会被判定）。它不是实时引擎页面上的接受率（接受的草稿数 ÷ 提出的草稿数）：那个数把没有被判定的草稿也算进分母，所以更低，代入下面的公式得到的 E 会偏小。如果每个被判定的草稿都以概率 α 独立地被接受，一次验证平均得到
#
# $$E = 1 + \alpha + \alpha^2 + \dots + \alpha^k = \frac{1 - \alpha^{k+1}}{1 - \alpha}$$
#
# 个 token（Leviathan 等，2023，§3.3）。当验证 k + 1 个 token 的一步比 E 个普通步更便宜时就划算。解码步访存受限时，k + 1 个查询 token 的开销与一个差不多，收益接近 E。批变大后，这一步会碰到算力的上限：每多一个查询 token 都要付出它的 FLOPs，被拒绝草稿的计算白白浪费，投机解码就得不偿失。用 H100 上运行 Llama-3-8B 的步时模型（`engine/sim/speculative.py`）可以看到转折点在哪里。

# %%
batches = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
cost = get_setup("h100-llama-3-8b").cost_model
fig, ax = plt.subplots(figsize=(7, 3.5))
for alpha in (0.5, 0.7, 0.9):
    preds = predict_speedup(cost, batches, context_len=512, alpha=alpha, k=K)
    ax.plot(batches, [p.speedup for p in preds], "o-", label=t("lc_l10_alpha", LANG, alpha=alpha))
    loses_at = breakeven_batch(preds)
    print(t("lp10_breakeven", LANG, alpha=alpha, speedup=preds[0].speedup, batch=loses_at) if loses_at else
          t("lp10_no_breakeven", LANG, alpha=alpha, speedup=preds[0].speedup, batch=batches[-1]))
ax.axhline(1, color="grey", lw=1, ls="--")
ax.set_xscale("log", base=2)
ax.set_xlabel(t("lc_l10_batch", LANG))
ax.set_ylabel(t("lc_l10_speedup", LANG))
ax.set_title(t("lc_l10_title", LANG, k=K))
ax.legend()
plt.show()

# %% [markdown] lang="en"
# Now measured, on this machine, with the real engine: the same greedy requests without and with
# speculation (k = 4), one request and then four together. The outputs are identical; the table gives the
# decode steps, the mean decode step time, α and the tokens per verification. On a CPU a step of a small
# model at batch 1 is largely fixed costs (reading the weights, the engine's own work), so verifying 5
# tokens costs far less than 5 plain steps; with four requests a step computes 20 query tokens, the
# compute shows, and speculation loses, as the model above predicts for a large batch.

# %% [markdown] lang="zh"
# 下面在本机上用真实引擎实测：同样的贪心请求，分别不用和使用投机解码（k = 4），先是一个请求，再是四个一起。两种方式的输出完全相同；表中给出解码步数、解码步的平均耗时、α 和每次验证得到的 token 数。在 CPU 上，小模型在批大小为 1 时一步的耗时大部分是固定开销（读取权重、引擎自身的工作），所以验证 5 个 token 远比 5 个普通步便宜；四个请求一起时，一步要计算 20 个查询 token，计算开销显现出来，投机解码就得不偿失，正如上面的步时模型对大批大小的预测。

# %%
PROMPTS = [[{"role": "user", "content": "Repeat this text exactly: The library opens at nine in the morning and closes at "
                                        "five in the afternoon on weekdays; on Saturdays it closes at noon."}],
           EDIT,
           [{"role": "user", "content": "Quote this sentence back to me: To reset the router, hold the small button on the "
                                        "back for ten seconds, wait for the light to blink green, then reconnect."}],
           [{"role": "user", "content": "Copy this list and add one more item at the end: apples, bananas, cherries, "
                                        "grapes, lemons, oranges, pears."}]]


def measure(k: int | None, batch: int, max_tokens: int = 32) -> dict:
    """Serve PROMPTS[:batch] to the end (greedy, max_tokens each): outputs, decode steps and their mean time
    (ms), and over the verifications: α (accepted / judged drafts), tokens per verification, their mean time."""
    e = new_engine(k)
    ids = [e.add_request(p, SamplingParams(max_tokens=max_tokens, ignore_eos=True)) for p in PROMPTS[:batch]]
    reports = []
    while e.has_unfinished_requests():
        reports.append(e.step())
    decodes = [r for r in reports if r.phase == "decode"]
    verified = [o for r in decodes for o in r.spec.values()]
    judged = sum(min(o.accepted + 1, len(o.proposed)) for o in verified)
    spec_steps = [r for r in decodes if r.spec]
    return dict(outputs=[e.get_output(i).token_ids for i in ids], steps=len(decodes),
                step_ms=sum(r.timings_ms["total"] for r in decodes) / len(decodes),
                alpha=sum(o.accepted for o in verified) / judged if judged else 0.0,
                tokens_per_verification=sum(len(o.emitted) for o in verified) / len(verified) if verified else 1.0,
                verify_ms=sum(r.timings_ms["total"] for r in spec_steps) / len(spec_steps) if spec_steps else 0.0,
                verify_tokens=sum(len(o.emitted) for o in verified))


runs = {}
for batch in tqdm((1, 4), desc=t("lp10_progress", LANG), mininterval=1):  # each batch served twice: plain, then speculative
    runs[batch] = plain, spec = measure(None, batch), measure(K, batch)
    assert plain["outputs"] == spec["outputs"]  # lossless at temperature 0
    print(t("lp10_measured", LANG, batch=batch, plain_steps=plain["steps"], plain_ms=plain["step_ms"], spec_steps=spec["steps"],
            spec_ms=spec["step_ms"], alpha=spec["alpha"], tokens=spec["tokens_per_verification"],
            speedup=plain["steps"] * plain["step_ms"] / (spec["steps"] * spec["step_ms"])))

# %% [markdown] lang="en"
# Lookup does not find a match every step; a step without drafts is a plain decode step. The exercise looks
# at the steps that did verify drafts.
#
# ## Exercise: predict the gain from α and k
# From the measured α and k at batch 1:
#
# 1. `tokens_per_step`: the tokens a verification gives on average, by the formula above.
# 2. `speedup_batch1`: how much faster the engine makes tokens while it speculates than plain decoding does:
#    a plain decode step makes 1 token in `plain_step_ms`; a verifying step makes `tokens_per_step` in
#    `verify_step_ms`.
#
# The check first recomputes both numbers from α, k and the two step times (within 1%), then compares them
# with what the engine did: the tokens its verifications gave, and its tokens per second over its
# verifying steps against plain decoding's. Within 20% passes.

# %% [markdown] lang="zh"
# 提示词查找并不是每一步都能找到匹配；没有草稿的一步就是普通的解码步。练习只看那些验证了草稿的步。
#
# ## 练习：根据 α 和 k 预测收益
# 根据批大小为 1 时实测的 α 和 k：
#
# 1. `tokens_per_step`：一次验证平均得到的 token 数，用上面的公式。
# 2. `speedup_batch1`：使用投机解码时引擎生成 token 的速度是普通解码的多少倍：普通解码一步用 `plain_step_ms` 生成 1 个 token；验证的一步用 `verify_step_ms` 生成 `tokens_per_step` 个。
#
# 检查先根据 α、k 和两种步的耗时重新计算这两个数（相差不超过 1%），再把你的数字与引擎的实际表现比较：它的验证得到的 token 数，以及它在验证步上每秒生成的 token 数相对于普通解码的倍数。相差不超过 20% 即为通过。

# %%
plain, spec = runs[1]
alpha, k = spec["alpha"], K
plain_step_ms, verify_step_ms = plain["step_ms"], spec["verify_ms"]
print(t("lp10_given", LANG, alpha=alpha, k=k, plain=plain_step_ms, verify=verify_step_ms))

# %% tags=["exercise"]
tokens_per_step = None  # TODO(student): tokens per verification, from alpha and k
speedup_batch1 = None  # TODO(student): from tokens_per_step, plain_step_ms and verify_step_ms


# %% tags=["check"]
def check():
    from lessons.checks import speculative_expectation  # the formula's values, recomputed apart from the page
    from visualize.i18n import t  # the check's messages, in the notebook's language
    if tokens_per_step is None or speedup_batch1 is None:
        return t("l10_fail_none", LANG)
    want_tokens, want_speedup = speculative_expectation(alpha, k, plain_step_ms, verify_step_ms)
    if abs(tokens_per_step / want_tokens - 1) > 0.01:  # a number copied from the measured table is not the formula's
        return t("l10_fail_formula", LANG, name="tokens_per_step", value=tokens_per_step)
    if abs(speedup_batch1 / want_speedup - 1) > 0.01:
        return t("l10_fail_formula", LANG, name="speedup_batch1", value=speedup_batch1)
    measured_tokens = spec["tokens_per_verification"]
    measured_speedup = measured_tokens / verify_step_ms * plain_step_ms  # tokens per ms, verifying vs plain
    if not 0.8 <= tokens_per_step / measured_tokens <= 1.2:
        return t("l10_fail_tokens", LANG, predicted=tokens_per_step, measured=measured_tokens)
    if not 0.8 <= speedup_batch1 / measured_speedup <= 1.2:
        return t("l10_fail_speedup", LANG, predicted=speedup_batch1, measured=measured_speedup)
    return t("l10_pass", LANG, tokens=tokens_per_step, measured_tokens=measured_tokens, speedup=speedup_batch1,
             measured_speedup=measured_speedup)


print(check())

# %% [markdown] lang="en"
# ## What to take away
# - The drafts' KV slots are taken before verification and are tentative; rollback gives the rejected ones
#   back and frees a block left empty, so no unverified token outlives its step (and none reaches the
#   prefix cache).
# - The gain is E = (1 − α^(k+1)) / (1 − α) tokens for the price of one step, as long as the step is
#   memory-bound; past the batch where it becomes compute-bound, speculation costs more than it gives.
#   vLLM's docs say the same: speculative decoding is most useful in memory-bound, low-QPS settings.

# %% [markdown] lang="zh"
# ## 要点
# - 草稿的 KV 槽位在验证之前就已分配，是暂定的；回滚归还被拒绝草稿的槽位，并释放变空的块，因此未通过验证的 token 不会在这一步之后继续占用槽位（也不会进入前缀缓存）。
# - 只要这一步是访存受限的，收益就是用一步的代价换来 E = (1 − α^(k+1)) / (1 − α) 个 token；批大到让这一步变成计算受限之后，投机解码的代价就超过了它的收益。vLLM 的文档也这样说：投机解码在访存受限、请求速率低（低 QPS）的场景下最有用。

# %% [markdown] lang="en"
# ## Labs
# Write this lesson's parts of the engine yourself, graded in the engine: `spec_verify` (Speculative decoding: greedy verification, 20 min), `lookahead` (Speculative decoding: lookahead slots and rollback, 45 min). Copy the starter from `labs/starters/`, fill in the TODOs and run `python -m lessons grade <lab> --impl <your file>`; [the labs](../../docs/labs.md) explains each one.
# %% [markdown] lang="zh"
# ## 实验
# 亲手实现本课讲到的引擎部件，放进引擎中运行并评分：`spec_verify`（投机解码：贪心验证，20 分钟）、`lookahead`（投机解码：前瞻槽位与回滚，45 分钟）。从 `labs/starters/` 复制起始代码，完成其中的 TODO，然后运行 `python -m lessons grade <lab> --impl <你的文件>`；[实验说明](../../docs/labs.zh.md)逐一介绍每个实验。

# %% [markdown] lang="en"
# ## Self-check
# For discussion or an exam; the answers follow from this lesson.
# - **Warm-up.** In prompt lookup, where do the draft tokens come from, and why is no second model needed?
# - **Core.** With α = 0.6 and k = 4, work out E = (1 − α^(k+1)) / (1 − α), the expected tokens per verification.
# - **Design.** Why does speculative decoding pay at batch 1 and lose at large batches? What happens to the lookahead slots of rejected drafts?
# %% [markdown] lang="zh"
# ## 自测题
# 供讨论或考试使用；答案都可以从本课推出。
# - **热身。**在提示词查找中，草稿 token 从哪里来？为什么不需要第二个模型？
# - **核心。**α = 0.6、k = 4 时，算出 E = (1 − α^(k+1)) / (1 − α)，即每次验证期望得到的 token 数。
# - **设计。**为什么投机解码在批大小为 1 时划算，批大小很大时却更慢？被拒绝的草稿占用的前瞻槽位会怎样？
