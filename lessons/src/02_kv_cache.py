# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown] lang="en"
# # Lesson 2 — The KV cache
#
# **Goal:** see why keeping each token's keys and values (and not its query) makes decoding exact and
# cheap, measure how many bytes that costs per token, and watch the cache grow during a generation.

# %% [markdown] lang="zh"
# # 第 2 课　KV 缓存
#
# **目标**：弄明白为什么只保存每个 token 的键和值（而不保存查询）就能让解码既精确又省算力，算出每个 token 要为此付出多少字节，并观察缓存在一次生成中如何增长。

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
import transformers

from engine import LLM, SamplingParams
from engine.model_executor.model import apply_rotary
from engine.model_executor.model_loader import resolve_model
from engine.model_executor.model_runner import kv_bytes_per_slot
from visualize.i18n import t
from visualize.style import use_cjk_font

LANG = "en"  # the language of the charts and of the check's messages
use_cjk_font()  # so that 中文 chart labels are drawn, not boxes

# %% [markdown] lang="en"
# ## 1. What a decode step needs from the past
# In causal attention, token *t* produces a query **q**ₜ and attends to the keys **k**₀…**k**ₜ and values
# **v**₀…**v**ₜ. We take the first layer of the real model and compute its attention over a short prompt.

# %% [markdown] lang="zh"
# ## 1. 解码步需要过去的什么
# 在因果注意力（causal attention）中，第 *t* 个 token 产生一个查询（query）**q**ₜ，并对键（key）**k**₀…**k**ₜ 和值（value）**v**₀…**v**ₜ 做注意力计算。我们取真实模型的第一层，在一段短提示词上计算它的注意力。

# %%
llm = LLM()
eng = llm.engine
model, cfg = eng.runner.model, eng.hf_config
attn = model.model.layers[0].self_attn
H, HKV, D = attn.num_heads, attn.num_kv_heads, attn.head_dim
ids = eng.encode("A paged KV cache stores keys and values")
T = len(ids)


@torch.inference_mode()
def qkv(token_ids, positions):
    """Layer 0's rotated query, key and value of some tokens: [n, heads, head_dim]."""
    x = model.model.layers[0].input_layernorm(model.model.embed_tokens(torch.tensor(token_ids)))
    cos, sin = model.rotary_emb(torch.tensor(positions), x.dtype)
    q = apply_rotary(attn.q_proj(x).view(-1, H, D), cos, sin)
    k = apply_rotary(attn.k_proj(x).view(-1, HKV, D), cos, sin)
    return q, k, attn.v_proj(x).view(-1, HKV, D)


def attend(q, k, v, causal):
    """Softmax attention; KV heads repeated for their query-head group. Returns (out, probs)."""
    k, v = k.repeat_interleave(H // HKV, dim=1), v.repeat_interleave(H // HKV, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) * D**-0.5
    if causal:
        scores = scores.masked_fill(torch.ones(len(q), len(k)).triu(1).bool(), float("-inf"))
    probs = scores.softmax(-1)
    return torch.einsum("hqk,khd->qhd", probs, v), probs


q, k, v = qkv(ids, range(T))
out_full, probs = attend(q, k, v, causal=True)

fig, ax = plt.subplots(figsize=(4, 3.6))
ax.imshow(probs[0], cmap="Blues")
ax.add_patch(plt.Rectangle((-0.5, T - 1.5), T, 1, fill=False, ec="tab:red", lw=2))
ax.set_xlabel(t("lc_l2_key_token", LANG))
ax.set_ylabel(t("lc_l2_query_token", LANG))
ax.set_title(t("lc_l2_attention_title", LANG))
plt.show()

# %% [markdown] lang="en"
# The newest token's output (red row) needs **its own query** and **every earlier key and value**.
# Earlier queries are never used again: each one served only its own row, already computed.
# So a decode step can keep the past K and V in a **cache**, compute q, k, v for the one new token, and
# attend. Below we produce the same layer output token by token that way, and compare.

# %% [markdown] lang="zh"
# 最新 token 的输出（红框那一行）需要的是**它自己的查询**和**之前所有的键和值**。更早的查询再也用不到了：每个查询只服务于它自己那一行，而那一行早已算完。因此解码步可以把过去的 K 和 V 保存在**缓存**里，只为新 token 计算 q、k、v，再做注意力计算。下面我们用这种方式逐个 token 地算出同一层的输出，并与一次性计算的结果对比。

# %%
k_cache, v_cache, rows = [], [], []
for pos in range(T):
    q_t, k_t, v_t = qkv(ids[pos : pos + 1], [pos])  # only the new token goes through the projections
    k_cache.append(k_t)
    v_cache.append(v_t)
    rows.append(attend(q_t, torch.cat(k_cache), torch.cat(v_cache), causal=False)[0])
out_cached = torch.cat(rows)
print(t("lp2_full_vs_cached", LANG, T=T, diff=(out_full - out_cached).abs().max()))

# %% [markdown] lang="en"
# The two agree to float rounding: the cache changes *how much* is computed, not *what*.
#
# ## 2. The whole model: logits with and without the cache
# Now the full 30-layer model, through Hugging Face transformers, loaded from the very weights the
# engine uses. Without a cache (`use_cache=False`) every step recomputes the whole sequence; with it,
# each step computes one token. We compare the logits of every generated position, and the engine's
# own tokens (it decodes from its paged KV cache) with the argmax of the cache-free logits.

# %% [markdown] lang="zh"
# 两者的差别只在浮点舍入误差的量级：缓存改变的是计算*多少*，而不是计算*什么*。
#
# ## 2. 整个模型：有缓存与无缓存的 logits
# 现在换成完整的 30 层模型，通过 Hugging Face transformers 加载，使用的正是引擎所用的那份权重。不用缓存（`use_cache=False`）时，每一步都要把整个序列重新计算一遍；用缓存时，每一步只算一个 token。我们比较每个生成位置的 logits，并检查引擎自己生成的 token（它从分页的 KV 缓存中解码）是否等于无缓存 logits 的 argmax。

# %%
hf = transformers.AutoModelForCausalLM.from_pretrained(resolve_model(None), dtype=torch.float32).eval()
prompt = torch.tensor([ids])
greedy = dict(max_new_tokens=16, do_sample=False, output_logits=True, return_dict_in_generate=True, pad_token_id=0)
with torch.inference_mode():
    no_cache = hf.generate(prompt, use_cache=False, **greedy)
    with_cache = hf.generate(prompt, use_cache=True, **greedy)
engine_tokens = llm.generate(ids, SamplingParams(max_tokens=16, ignore_eos=True))[0].token_ids

diff = [(a - b).abs().max().item() for a, b in zip(no_cache.logits, with_cache.logits)]
argmax = [int(l[0].argmax()) for l in no_cache.logits]
print(t("lp2_engine_tokens", LANG, same=t("yes" if engine_tokens == argmax else "no", LANG)))
fig, ax = plt.subplots(figsize=(6, 2.6))
ax.plot(diff, "o-")
ax.set_xlabel(t("lc_l2_generated_token", LANG))
ax.set_ylabel(t("lc_l2_max_logit_diff", LANG))
ax.set_title(t("lc_l2_cache_diff_title", LANG))
plt.show()

# %% [markdown] lang="en"
# ## 3. What the cache costs: bytes per token
# Every layer stores one key and one value vector per KV head for every token:
#
# **KV bytes per token = 2 × layers × KV heads × head_dim × bytes per element**
#
# `kv_bytes_per_slot` in the engine computes exactly that; the engine's KV pools agree.

# %% [markdown] lang="zh"
# ## 3. 缓存的代价：每个 token 的字节数
# 每一层都要为每个 token、每个 KV 头（KV head）保存一个键向量和一个值向量：
#
# **每个 token 的 KV 字节数 = 2 × 层数 × KV 头数 × 每头维数（head_dim）× 每个元素的字节数**
#
# 引擎里的 `kv_bytes_per_slot` 正是按这个公式计算的；引擎实际分配的 KV 池（KV pool）也与之吻合。

# %%
print(t("lp2_formula", LANG, b=kv_bytes_per_slot(model.num_layers, model.num_kv_heads, model.head_dim, torch.float32)))
pool_bytes = sum(k.nbytes + v.nbytes for k, v in eng.runner.kv_caches)
slots = eng.num_blocks * eng.config.block_size
print(t("lp2_pools", LANG, pool=pool_bytes, slots=slots, per=pool_bytes // slots))

# %% [markdown] lang="en"
# Bigger models need far more. Configurations from the Llama 2 paper (Touvron et al., 2023) and its
# released config files: Llama-2-7B has 32 layers with 32 KV heads of 128 dims; Llama-2-70B has 80
# layers but only 8 KV heads (grouped-query attention), of 128 dims. Both serve in fp16 (2 bytes).

# %% [markdown] lang="zh"
# 更大的模型需要多得多的缓存。以下配置来自 Llama 2 论文（Touvron et al., 2023）及其发布的配置文件：Llama-2-7B 有 32 层、32 个 KV 头、每头 128 维；Llama-2-70B 有 80 层，但只有 8 个 KV 头（分组查询注意力，grouped-query attention, GQA），每头 128 维。两者都以 fp16（2 字节）部署。

# %%
models = {
    "SmolLM2-135M (fp32)": kv_bytes_per_slot(30, 3, 64, torch.float32),
    "SmolLM2-135M (bf16)": kv_bytes_per_slot(30, 3, 64, torch.bfloat16),
    "Llama-2-7B (fp16)": kv_bytes_per_slot(32, 32, 128, torch.float16),
    "Llama-2-70B (fp16)": kv_bytes_per_slot(80, 8, 128, torch.float16),
}
fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3))
a1.barh(list(models), [b / 1024 for b in models.values()], color="tab:purple")
a1.set_xlabel(t("lc_l2_kib_per_token", LANG))
for name, b in models.items():
    print(t("lp2_model_bytes", LANG, name=name, b=b, gib=4096 * b / 2**30))
lengths = torch.arange(0, 4097, 256)
for name, b in models.items():
    a2.plot(lengths, lengths * b / 2**30, label=name)
a2.set_xlabel(t("lc_l2_tokens_in_request", LANG))
a2.set_ylabel(t("lc_l2_kv_gib", LANG))
a2.legend(fontsize=8)
plt.tight_layout()
plt.show()

# %% [markdown] lang="en"
# Grouped-query attention is why the 10× larger 70B model needs *less* cache per token than the 7B:
# 8 KV heads instead of 32. At 0.5 MiB per token, a single 4096-token Llama-2-7B request holds 2 GiB.
#
# ## 4. The cache grows during a generation
# We watch the engine's pool while one request generates 40 tokens. `StepReport.memory` counts
# *token states* (slots holding a token's K and V) and the slots allocated to the request.

# %% [markdown] lang="zh"
# 正因为分组查询注意力，大 10 倍的 70B 模型每个 token 需要的缓存反而比 7B *少*：它只有 8 个 KV 头，而不是 32 个。每个 token 0.5 MiB，意味着一个 4096 token 的 Llama-2-7B 请求就要占 2 GiB。
#
# ## 4. 缓存在生成过程中增长
# 我们让一个请求生成 40 个 token，同时观察引擎的 KV 池。`StepReport.memory` 统计**token 状态**（token states，存放某个 token 的 K 和 V 的槽位）以及分配给这个请求的槽位。

# %%
reports = []
llm.generate(ids, SamplingParams(max_tokens=40, ignore_eos=True), on_step=reports.append)
kib = eng.bytes_per_slot / 1024
steps = range(len(reports))
fig, ax = plt.subplots(figsize=(6, 3))
ax.plot(steps, [r.memory.token_states * kib for r in reports], "o-", ms=3, label=t("lc_token_states", LANG))
ax.step(steps, [r.memory.allocated * kib for r in reports], where="post", label=t("lc_l2_allocated", LANG, size=eng.config.block_size))
ax.set_xlabel(t("lc_l2_step_of_request", LANG))
ax.set_ylabel(t("lc_l2_kv_kib", LANG))
ax.legend()
plt.show()

# %% [markdown] lang="en"
# Each step adds exactly one token's worth (45 KiB in fp32); memory is allocated a block at a time, and
# everything is freed in the step the request finishes. The cache's final size depends on how many
# tokens the request will generate, which nobody knows in advance: lesson 3 shows what that does to memory.
#
# ## Exercise
# The PagedAttention paper (Table 1) serves OPT-13B on one A100-40GB and keeps about **12 GB** for the
# KV cache, which holds **15.7K** tokens. OPT-13B (Zhang et al., 2022) has 40 layers, 40 attention
# heads (each is also a KV head) of 128 dims, in fp16. Compute:
# - `opt13b_bytes_per_token`: its KV bytes per token;
# - `opt13b_tokens`: how many whole tokens fit in 12 GiB (12 × 2³⁰ bytes).

# %% [markdown] lang="zh"
# 每一步恰好增加一个 token 的量（fp32 下 45 KiB）；显存按块（block）分配，请求结束的那一步全部释放。缓存最终有多大取决于请求会生成多少 token，而这事先没人知道：第 3 课会讲这对显存意味着什么。
#
# 关于用词：本实验在 CPU 上运行，KV 池实际放在内存里；但它模拟的是 GPU 上的 KV 缓存，所以课程中称为“显存”。涉及本机测量时（第 1 课的计时、第 6 课的复制耗时），说的是真实的内存；换出时接收块的 CPU 交换空间也在内存中。“访存受限”里的“访存”泛指从存储器读写数据，GPU 上指显存，CPU 上指内存，不必二选一。
#
# ## 练习
# PagedAttention 论文（表 1）在一张 A100-40GB 上部署 OPT-13B，留给 KV 缓存约 **12 GB**，可容纳 **15.7K** 个 token。OPT-13B（Zhang et al., 2022）有 40 层、40 个注意力头（每个都是一个 KV 头）、每头 128 维，使用 fp16。请计算：
# - `opt13b_bytes_per_token`：它每个 token 的 KV 字节数；
# - `opt13b_tokens`：12 GiB（12 × 2³⁰ 字节）能放下多少个完整的 token。

# %% tags=["exercise"]
opt13b_bytes_per_token = None  # TODO(student)
opt13b_tokens = None  # TODO(student)

# %% tags=["check"]
def check():
    from visualize.i18n import t  # the check's messages, in the notebook's language
    want = kv_bytes_per_slot(40, 40, 128, torch.float16)
    if opt13b_bytes_per_token is None or opt13b_tokens is None:
        return t("l2_fail_none", LANG)
    if opt13b_bytes_per_token != want:
        return t("l2_fail_bytes", LANG, value=opt13b_bytes_per_token)
    if opt13b_tokens != 12 * 2**30 // want:
        return t("l2_fail_tokens", LANG, value=opt13b_tokens)
    return t("l2_pass", LANG, value=f"{opt13b_tokens:,}")


print(check())

# %% [markdown] lang="en"
# ## Self-check
# For discussion or an exam; the answers follow from this lesson.
# - **Warm-up.** What does the KV cache keep for each token, and in which layers?
# - **Core.** Work out the KV cache bytes per token of SmolLM2-135M (30 layers, 3 KV heads, head size 64, float32). How many tokens fit in 1 GiB?
# - **Design.** Without a KV cache, how does the cost of the n-th generated token grow with n? What does the cache trade for that?
# %% [markdown] lang="zh"
# ## 自测题
# 供讨论或考试使用；答案都可以从本课推出。
# - **热身。**KV 缓存为每个 token 保存了什么？保存在哪些层里？
# - **核心。**算出 SmolLM2-135M（30 层，3 个 KV 头，每头维数 64，float32）每个 token 的 KV 缓存字节数。1 GiB 能放下多少个 token？
# - **设计。**没有 KV 缓存时，生成第 n 个 token 的代价如何随 n 增长？KV 缓存用什么换来了这一点？
