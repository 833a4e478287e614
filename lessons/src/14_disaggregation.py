# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown] lang="en"
# # Lesson 14 — Prefill and decode on two engines
#
# **Goal:** split one request between two engines, a prefill instance that computes the prompt's KV cache and a
# decode instance that generates, and watch the KV blocks move from one pool to the other on the real engine;
# then count what the handover moves, and weigh when splitting pays.
#
# Every engine so far ran a new prompt's prefill in the same steps as the running requests' decodes (lesson 6).
# A long prefill makes every decode of its step wait: the running streams stutter, their inter-token latency
# (ITL) jumps whenever a long prompt arrives. **DistServe** (Zhong et al., OSDI 2024) calls this *prefill-decode
# interference*, and adds a second cost of colocation: both phases share one parallelism plan and one batch size,
# so neither can be tuned for its own latency target (TTFT for prefill, TPOT for decode). It puts the two phases
# on different GPUs and sizes each for its target, measuring *goodput*: requests served per second within both
# targets. **Splitwise** (Patel et al., ISCA 2024) starts from the hardware: prefill is compute-bound and decode
# memory-bound (lesson 1), so the two phases can run on different machine types. Both pay the same price: each
# prompt's KV cache must move from the prefill engine to the decode engine.
#
# In the engine: `engine/kv_transfer/` (vLLM v1's KV connector: a scheduler side that only decides, a worker side
# that only moves bytes), `python -m engine serve-disagg` (two processes behind an OpenAI-compatible proxy) and
# `engine/disagg_pair.py` (the same two engines in one process, stepped by hand, as here).
# [docs/disaggregation.md](../../docs/disaggregation.md) tells the whole story.

# %% [markdown] lang="zh"
# # 第 14 课　预填充与解码分离到两个引擎
#
# **目标**：把一个请求拆到两个引擎上：预填充实例计算提示词的 KV 缓存，解码实例负责生成；在真实引擎上观察 KV 块从一个显存池移到另一个显存池；然后算出一次交接要搬运多少数据，并权衡什么时候拆分才划算。
#
# 到目前为止，每个引擎都把新提示词的预填充和运行中请求的解码放在同一步里（第 6 课）。一次很长的预填充会让这一步里的每个解码都等着它：正在输出的流会卡顿，每当有长提示词到达，它们的 token 间延迟（ITL）就突然变大。**DistServe**（Zhong 等，OSDI 2024）把这叫作*预填充与解码的相互干扰*，并指出两个阶段共置（放在同一个引擎上）的第二个代价：两个阶段共用同一套并行方案和同一个批大小，哪一个都没法按自己的延迟目标单独调优：预填充看首 token 延迟（TTFT），解码看每输出 token 时间（TPOT）。它把两个阶段放到不同的 GPU 上，各自按自己的目标配置，衡量的是*有效吞吐量*（goodput）：每秒有多少请求同时满足这两个目标。**Splitwise**（Patel 等，ISCA 2024）从硬件出发：预填充是计算受限的，解码是访存受限的（第 1 课），所以两个阶段可以跑在不同类型的机器上。两者付出的代价相同：每个提示词的 KV 缓存都必须从预填充引擎搬到解码引擎。
#
# 引擎中的位置：`engine/kv_transfer/`（vLLM v1 的 KV 连接器：调度器侧只做决策，工作进程侧只搬字节）、`python -m engine serve-disagg`（两个进程，前面放一个兼容 OpenAI 接口的代理）和 `engine/disagg_pair.py`（同样的两个引擎放在一个进程里，手动单步执行，本课就用它）。完整的说明见 [docs/disaggregation.md](../../docs/disaggregation.md)。

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
from engine.disagg_pair import DisaggPair
from engine.model_executor.model_loader import load_model
from visualize.i18n import t

LANG = "en"  # the language of the printed lines and of the check's messages

weights = load_model(None)  # SmolLM2-135M-Instruct, loaded once and shared by the three engines below


def new_engine(role=None):
    """An engine on the shared weights: a prefill instance ("kv_producer"), a decode instance ("kv_consumer") or,
    with no role, an ordinary colocated engine. Blocks of 4 tokens, 16 of them."""
    transfer = {"kv_transfer_config": {"kv_role": role}} if role else {}
    return LLMEngine(EngineConfig(block_size=4, num_gpu_blocks=16, **transfer), loaded_model=weights)


def show_pool(pool):
    """Who holds which block of one instance's pool, one request a line."""
    held = [t("lp14_holds", LANG, rid=rid, blocks=blocks, why=t(f"ho_state_{why}", LANG))
            for rid, (blocks, why) in sorted(pool.block_tables.items())]
    role = t(f"lp14_role_{pool.role}", LANG)
    print("    " + t("lp14_pool", LANG, role=role, holders="; ".join(held) or t("lp14_all_free", LANG)))


# %% [markdown] lang="en"
# ## 1. The handover, in vLLM's order: pull
# vLLM's disaggregated serving (its `NixlConnector`, and the shared-memory connector here) makes two calls per
# request, through a proxy:
#
# 1. The prompt goes to the **prefill instance** with `max_tokens=1` and `kv_transfer_params={"do_remote_decode":
#    true}`. It prefills the prompt and finishes. The connector's scheduler side (`request_finished`) does not free
#    the request's blocks (`delay_free`): it lends them under a **lease**, an unguessable `transfer_id` that lives
#    `kv_lease_duration` seconds, and answers where they are: `remote_block_ids`, the side channel's host and port.
# 2. The same request goes to the **decode instance** with those parameters. At admission its scheduler asks the
#    connector how many prompt tokens come from elsewhere (`get_num_new_matched_tokens`: all but the last), then
#    **allocates** the request's blocks in its own pool and tells the connector where they are
#    (`update_state_after_alloc`). The request waits in `WAITING_FOR_REMOTE_KVS`, outside the step's batch: the
#    other requests keep decoding.
# 3. The worker side **reads** the lent blocks (here a shared-memory segment the prefill instance fills; RDMA in
#    vLLM), copies them into the allocated blocks and **notifies** the prefill instance (`/kv_transfer/release`),
#    which frees its blocks. The request then computes only its last prompt token, whose logits choose the first
#    output token, and decodes as usual.
#
# `DisaggPair` plays the proxy and steps both engines: `add_request` makes the first call, the second goes out once
# the prefill finished. The decode instance has a request of its own running; the pools are shown at every step.

# %% [markdown] lang="zh"
# ## 1. 按 vLLM 的顺序交接：拉取
# vLLM 的预填充/解码分离服务（它的 `NixlConnector`，以及这里的共享内存连接器）通过一个代理，为每个请求发出两次调用：
#
# 1. 提示词先发给**预填充实例**，带上 `max_tokens=1` 和 `kv_transfer_params={"do_remote_decode": true}`。它对提示词做完预填充，请求随即结束。连接器的调度器侧（`request_finished`）不释放这个请求的块（`delay_free`），而是在**租约**下把它们借出：租约就是一个无法猜测的 `transfer_id`，有效期 `kv_lease_duration` 秒；预填充实例的回复写明这些块在哪里：`remote_block_ids`，以及旁路通道的主机和端口。
# 2. 同一个请求带着这些参数发给**解码实例**。接纳时，它的调度器问连接器有多少个提示词 token 的 KV 可以从别处获得（`get_num_new_matched_tokens`：除最后一个之外的全部），然后在自己的显存池里为请求**分配**块，并告诉连接器这些块在哪里（`update_state_after_alloc`）。请求在 `WAITING_FOR_REMOTE_KVS` 状态中等待，不在这一步的批里：其他请求照常解码。
# 3. 工作进程侧**读取**借出的块（这里是预填充实例填好的一段共享内存；vLLM 用 RDMA），复制到分配好的块里，再**通知**预填充实例（`/kv_transfer/release`），预填充实例随即释放它的块。之后这个请求只计算最后一个提示词 token，由它的 logits 选出第一个输出 token，然后照常解码。
#
# `DisaggPair` 扮演代理，并单步执行两个引擎：`add_request` 发出第一次调用，预填充结束后发出第二次。解码实例上还有一个自己的请求在运行；每一步都显示两个显存池。

# %%
pair = DisaggPair(new_engine("kv_producer"), new_engine("kv_consumer"))
PROMPT = "Paged attention stores the KV cache in blocks of"
own = pair.decode.add_request("Once upon a time", SamplingParams(max_tokens=8))  # the decode instance's own request
pair.add_request(PROMPT, max_tokens=6)
for _ in range(4):
    state = pair.step()
    print(t("lp14_step", LANG, step=state.step))
    show_pool(state.prefill)
    show_pool(state.decode)
handover = state.handovers[0]
print(t("lp14_handover", LANG, prefill=handover.prefill_blocks, decode=handover.decode_blocks,
        lease=t(f"ho_lease_{handover.lease}", LANG), bytes=handover.num_bytes))

# %% [markdown] lang="en"
# Read the steps in order. At step 0 the prefill instance computed the prompt and lends its blocks under a lease,
# while the decode instance runs its own request. At step 1 the decode instance admitted the handed-over request:
# its blocks are allocated beside those of its own request, and the read began; the lease was read and released,
# so the prefill instance's pool is free again. At step 2 the bytes have landed, and the request runs its last
# prompt token; from step 3 it decodes beside the other request. The decode instance's own request never waited
# for a prefill of this prompt.
#
# Is the handed-over KV the one a single engine would have computed? Greedy decoding answers: the tokens through the
# handover must be those of one colocated engine given the same prompt.

# %% [markdown] lang="zh"
# 按顺序读这几步。第 0 步，预填充实例算完了提示词，在租约下借出它的块；解码实例在运行自己的请求。第 1 步，解码实例接纳了交接过来的请求：这个请求的块就分配在解码实例自己那个请求的块旁边，读取随即开始；借出的块读完后租约即被释放，所以预填充实例的显存池又全部空闲了。第 2 步，这些字节已经写进解码块，请求计算它的最后一个提示词 token；从第 3 步起，它和另一个请求一起解码。解码实例自己的请求从来没有等过这个提示词的预填充。
#
# 交接过来的 KV 和单个引擎自己算出的一样吗？贪心解码可以回答：经过交接得到的 token，必须和把同一个提示词交给一个共置的引擎得到的 token 完全相同。

# %%
while pair.has_unfinished():
    pair.step()
through_handover = pair.decode.get_output(handover.decode_request_id).outputs[0].token_ids
colocated = new_engine()
rid = colocated.add_request(PROMPT, SamplingParams(max_tokens=6))
while colocated.has_unfinished_requests():
    colocated.step()
print(t("lp14_tokens", LANG, how=t("lp14_through_handover", LANG), tokens=through_handover))
print(t("lp14_tokens", LANG, how=t("lp14_colocated", LANG), tokens=colocated.get_output(rid).outputs[0].token_ids))
assert through_handover == colocated.get_output(rid).outputs[0].token_ids

# %% [markdown] lang="en"
# ## 2. SGLang's order: push
# SGLang's PD disaggregation (`python/sglang/srt/disaggregation/`) turns the order around. The **decode** side moves
# first: it reserves the KV slots for the request *before* the prefill runs and tells the prefill side where they
# are; the **prefill** side then writes into them as it computes, each chunk of a chunked prefill as soon as its
# forward pass ends, so the transfer of one chunk overlaps the computation of the next. Both sides follow the
# request through the same states (`KVPoll`): `Bootstrapping` (the two sides find each other through a bootstrap
# server), `WaitingForInput` (each waits for the other: the prefill side for the indices of the slots the decode
# side reserved, the decode side for the KV), `Transferring`, then `Success` or `Failed`.
#
# | | pull (vLLM, this engine) | push (SGLang) |
# |---|---|---|
# | who moves first | prefill finishes and holds its blocks | decode reserves slots first |
# | who moves the bytes | decode reads | prefill writes into decode's slots |
# | what waits | prefill's blocks, under a lease | decode's reserved slots |
# | overlap | none: the whole prompt moves after the prefill | a chunk's transfer overlaps the next chunk's prefill |
#
# Pull never holds decode memory for a prompt still being computed, and a lease nobody reads simply expires; push
# hides the transfer behind the prefill, at the price of decode slots held while the prefill runs. The engine
# implements pull only.

# %% [markdown] lang="zh"
# ## 2. SGLang 的顺序：推送
# SGLang 的预填充/解码分离（`python/sglang/srt/disaggregation/`）把顺序反了过来。先动的是**解码**一侧：它在预填充开始*之前*就为请求预留好 KV 槽位，并告诉预填充一侧这些槽位在哪里；然后**预填充**一侧边计算边写进这些槽位：分块预填充的每个分块一算完就开始传输，于是一个分块的传输与下一个分块的计算重叠进行。两侧用同一组状态（`KVPoll`）跟踪请求：`Bootstrapping`（两侧通过引导服务器找到彼此）、`WaitingForInput`（互相等待：预填充一侧等解码一侧发来预留槽位的索引，解码一侧等 KV 数据）、`Transferring`（传输中），最后是 `Success`（成功）或 `Failed`（失败）。
#
# | | 拉取（vLLM，本引擎） | 推送（SGLang） |
# |---|---|---|
# | 谁先动 | 预填充先算完，保留它的块 | 解码先预留槽位 |
# | 谁搬字节 | 解码读取 | 预填充写进解码的槽位 |
# | 等待期间占着什么 | 预填充一侧在租约下保留的块 | 解码一侧预留的槽位 |
# | 重叠 | 没有：预填充结束后才搬运整个提示词的 KV | 一个分块的传输与下一个分块的预填充重叠 |
#
# 拉取从不为还在计算的提示词占用解码一侧的显存，没人读取的租约到期就自动结束；推送用预填充的计算掩盖传输时间，代价是预填充期间一直占着解码一侧的槽位。本引擎只实现了拉取。

# %% [markdown] lang="en"
# ## 3. What a handover moves
# Lesson 2 counted a token's KV bytes: `2 (K and V) × layers × KV heads × head_dim × element size`. A handover moves
# whole blocks, every layer's K and V of each lent block, whatever part of the last block the prompt fills.

# %% [markdown] lang="zh"
# ## 3. 一次交接搬运了什么
# 第 2 课算过一个 token 的 KV 字节数：`2（K 和 V）× 层数 × KV 头数 × 每头维数 × 元素字节数`。交接按整块搬运：每个借出的块，每一层的 K 和 V 都要搬，不管提示词把最后一块填了多少。

# %%
config = weights.config
element_bytes = next(iter(weights.state_dict.values())).element_size()  # float32 here: the pool's dtype is the model's
kv_bytes_per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * element_bytes
print(t("lp14_kv_bytes", LANG, layers=config.num_hidden_layers, heads=config.num_key_value_heads, dim=config.head_dim,
        elem=element_bytes, total=kv_bytes_per_token))
print(t("lp14_moved", LANG, blocks=len(handover.prefill_blocks), block_size=4, per_token=kv_bytes_per_token, bytes=handover.num_bytes))
assert handover.num_bytes == len(handover.prefill_blocks) * 4 * kv_bytes_per_token

# %% [markdown] lang="en"
# ## 4. Exercise
# The prefill instance gets a prompt of 30 token ids, `EXERCISE_PROMPT` below, on the same pair (blocks of 4).
# Without running anything, predict:
#
# - `predicted_lent_blocks`: how many blocks the prefill instance lends under the lease;
# - `predicted_bytes`: how many bytes the decode instance reads;
# - `predicted_link_ms`: how long those bytes take over a link of 25 GB/s (`LINK_BYTES_PER_S`, a 200 Gb/s RDMA
#   network card such as NIXL uses between machines), in milliseconds, latency aside.
#
# The check hands the prompt over and compares with the engine's own handover.

# %% [markdown] lang="zh"
# ## 4. 练习
# 在同一对引擎上（块大小为 4），预填充实例收到一个由 30 个 token id 组成的提示词，即下面的 `EXERCISE_PROMPT`。不运行任何代码，预测：
#
# - `predicted_lent_blocks`：预填充实例在租约下借出多少个块；
# - `predicted_bytes`：解码实例读取多少字节；
# - `predicted_link_ms`：这些字节经过一条 25 GB/s 的链路（`LINK_BYTES_PER_S`，相当于 NIXL 在机器之间使用的 200 Gb/s RDMA 网卡）需要多少毫秒，不计链路延迟。
#
# 检查会把这个提示词交接一次，再和引擎自己的交接记录对比。

# %% tags=["exercise"]
EXERCISE_PROMPT = list(range(1000, 1030))  # 30 token ids
LINK_BYTES_PER_S = 25e9
predicted_lent_blocks = None  # TODO(student): blocks the prefill instance lends
predicted_bytes = None  # TODO(student): bytes the decode instance reads
predicted_link_ms = None  # TODO(student): those bytes over LINK_BYTES_PER_S, in ms

# %% tags=["check"]
def check():
    from lessons.checks import handover_expectation
    from visualize.i18n import t  # the check's messages, in the notebook's language
    if predicted_lent_blocks is None or predicted_bytes is None or predicted_link_ms is None:
        return t("l14_fail_none", LANG)
    blocks, num_bytes = handover_expectation(pair, EXERCISE_PROMPT)
    if predicted_lent_blocks != blocks:
        return t("l14_fail_blocks", LANG, value=predicted_lent_blocks)
    if predicted_bytes != num_bytes:
        return t("l14_fail_bytes", LANG, value=predicted_bytes)
    link_ms = num_bytes / LINK_BYTES_PER_S * 1e3
    if abs(predicted_link_ms - link_ms) > 0.01 * link_ms:
        return t("l14_fail_ms", LANG, value=predicted_link_ms)
    return t("l14_pass", LANG, blocks=blocks, bytes=num_bytes, ms=link_ms)


print(check())

# %% [markdown] lang="en"
# The transfer of a short prompt is tiny. It grows with the prompt: 4,096 tokens of this model are 4,096 × 46,080
# bytes, about 189 MB, some 7.5 ms over the same link, and a model of 80 layers with 8 KV heads of 128 in 16-bit
# (Llama-3-70B's shape) holds 2 × 80 × 8 × 128 × 2 = 327,680 bytes a token, 1.3 GB for the same prompt. Whether the
# handover pays depends on what it saves: a prefill that no longer stalls the decodes.
#
# ## 5. What the lab measured
# `python -m engine.tools.bench_disagg` streams four greedy decodes of 128 tokens while a 1,024-token prompt arrives
# every second, once on a colocated `serve` and once on `serve-disagg` (one prefill and one decode instance, 1P1D);
# `--split-cores` gives each instance its own core, as two GPUs would be. On the lab's machine (2 vCPUs, Intel Xeon
# with AVX-512 and AMX, quiet, the default model in float32; [docs/disaggregation.md](../../docs/disaggregation.md)):
#
# | setup | ITL p50 | ITL p99 | long prompts' TTFT p50 | long prompts served |
# |---|---:|---:|---:|---:|
# | colocated, both cores | 26 ms | 1,182 ms | 1,216 ms | 4 |
# | 1P1D, both instances on both cores | 30 ms | 1,135 ms | 3,873 ms | 3 |
# | 1P1D, a core each (`--split-cores`) | 49 ms | 108 ms | 2,707 ms | 3 |
#
# Colocated, a stream's worst gap is a long prompt's whole prefill: the p99 is 43 times the p50. Splitting the
# engines while they share the same cores changes nothing: the prefill instance's work takes the cores from the
# decode steps just as the prefill in the batch did. With a core each, the decode instance never waits for a prefill
# and its p99 falls tenfold, as DistServe says; the price is the other column: one core's bandwidth for the decodes
# (p50 1.8 times higher) and one core for the prefills (the long prompts wait longer for their first token).
# Disaggregation moves interference off the decode device; it does not create hardware.
#
# ## 6. When not to split
# - **At equal GPU count.** Two GPUs as 1P1D give each phase one GPU; the same two GPUs as two colocated replicas
#   each run both phases on half the requests. When prompts are short, the prefill GPU idles while the decode GPU
#   holds every running request, and two replicas serve more: vLLM's documentation says plainly that disaggregated
#   prefill does not improve throughput; it controls tail ITL.
# - **Short inputs and small models.** llm-d recommends P/D disaggregation for long-context workloads (around 10
#   input tokens per output token) on medium to large models: there a prefill stalls the decodes long enough to be
#   worth a KV transfer, and the transfer is cheap next to the prefill it replaces.
# - **Chunked prefill already bounds the stall.** Lesson 6's chunked prefill cuts a long prompt into chunks that
#   share each step's token budget with the decodes (Sarathi-Serve), which caps the ITL spike on one engine.
# - **Without a fast link.** The KV bytes computed above cross the network for every request: NIXL over TCP works,
#   but llm-d asks for RDMA (InfiniBand, RoCE, EFA) in production.

# %% [markdown] lang="zh"
# 短提示词的传输量很小，但它随提示词增长：这个模型的 4,096 个 token 就有 4,096 × 46,080 字节，约 189 MB，经过同一条链路约需 7.5 毫秒；而一个 80 层、8 个 KV 头、每头 128 维、16 位精度的模型（Llama-3-70B 的形状）每个 token 有 2 × 80 × 8 × 128 × 2 = 327,680 字节，同样的提示词就是 1.3 GB。交接是否划算，要看它换来了什么：预填充不再让解码停下来等待。
#
# ## 5. 本实验测到了什么
# `python -m engine.tools.bench_disagg` 让四个贪心解码的流各输出 128 个 token，同时每秒到达一个 1,024 token 的提示词；分别在共置的 `serve` 和 `serve-disagg`（一个预填充实例加一个解码实例，即 1P1D）上各跑一次；`--split-cores` 让两个实例各用一个 CPU 核，就像两块 GPU 那样。在本实验的机器上（2 个虚拟 CPU，支持 AVX-512 和 AMX 的英特尔至强处理器，机器空闲，默认模型以 float32 运行；见 [docs/disaggregation.md](../../docs/disaggregation.md)）：
#
# | 配置 | ITL p50 | ITL p99 | 长提示词首 token 延迟 p50 | 完成的长提示词数 |
# |---|---:|---:|---:|---:|
# | 共置，两个核 | 26 毫秒 | 1,182 毫秒 | 1,216 毫秒 | 4 |
# | 1P1D，两个实例共用两个核 | 30 毫秒 | 1,135 毫秒 | 3,873 毫秒 | 3 |
# | 1P1D，每个实例一个核（`--split-cores`） | 49 毫秒 | 108 毫秒 | 2,707 毫秒 | 3 |
#
# 共置时，一个流最长的停顿就是一次长提示词的完整预填充：p99 是 p50 的 43 倍。如果两个实例仍然共用同样的核，拆分什么也没改变：预填充实例的计算照样把核从解码步那里抢走，和同批里的预填充一样。每个实例各有一个核时，解码实例再也不用等预填充，p99 降到原来的十分之一，正如 DistServe 所说；代价在另外几列：解码只有一个核的内存带宽（p50 高了 1.8 倍），预填充也只有一个核（长提示词要等更久才拿到首 token）。预填充/解码分离把干扰从解码设备上移走，但不会凭空变出硬件。
#
# ## 6. 什么时候不该拆分
# - **GPU 数量相同时。**两块 GPU 组成 1P1D，每个阶段各用一块；同样两块 GPU 组成两个共置的副本，每个副本处理一半请求的两个阶段。提示词短的时候，预填充 GPU 常常空闲，解码 GPU 却要承载所有运行中的请求，两个副本能服务更多请求：vLLM 的文档明确说，预填充/解码分离不提高吞吐量，它控制的是尾部的 token 间延迟。
# - **输入短、模型小时。**`llm-d` 建议把预填充/解码分离用于中到大型模型上的长上下文负载（输入 token 约为输出 token 的 10 倍）：在这种场景下，一次预填充让解码停顿的时间长到值得付出一次 KV 传输，而传输的开销与它所替代的预填充相比很小。
# - **分块预填充已经限制住了停顿。**第 6 课的分块预填充把长提示词切成分块，和解码共享每一步的 token 预算（Sarathi-Serve），在单个引擎上就能压住 token 间延迟的尖峰。
# - **没有高速链路时。**上面算出的 KV 字节数，每个请求都要过一次网络：NIXL 可以走 TCP，但 `llm-d` 在生产环境中要求使用 RDMA（InfiniBand、RoCE、EFA）。

# %%
pair.close()  # the prefill instance's side channel stops; every shared-memory segment is unlinked

# %% [markdown] lang="en"
# ## Labs
# Write this lesson's part of the engine yourself, graded in the engine (optional): `kv_connector` (The KV connector's scheduler side: prefill hands over to decode, 45 min). Copy the starter from `labs/starters/`, fill in the TODOs and run `python -m lessons grade <lab> --impl <your file>`; [the labs](../../docs/labs.md) explains each one.
# %% [markdown] lang="zh"
# ## 实验
# 亲手实现本课讲到的引擎部件，放进引擎中运行并评分（选做）：`kv_connector`（KV 连接器的调度器侧：预填充交接给解码，45 分钟）。从 `labs/starters/` 复制起始代码，完成其中的 TODO，然后运行 `python -m lessons grade <lab> --impl <你的文件>`；[实验说明](../../docs/labs.zh.md)逐一介绍每个实验。

# %% [markdown] lang="en"
# ## Self-check
# For discussion or an exam; the answers follow from this lesson.
# - **Warm-up.** Why does the decode instance compute the last prompt token itself instead of reading all of them?
# - **Core.** A lease expires before the decode instance reads it. What happens to the prefill instance's blocks, and to the request on the decode instance?
# - **Design.** You have two GPUs and a chat workload with short prompts and long answers. Would you run 1P1D or two colocated replicas, and what would change your mind?
# %% [markdown] lang="zh"
# ## 自测题
# 供讨论或考试使用；答案都可以从本课推出。
# - **热身。**为什么解码实例要自己计算最后一个提示词 token，而不是把全部提示词 token 的 KV 都读过来？
# - **核心。**一个租约在解码实例读取之前就到期了。预填充实例的块会怎样？解码实例上的那个请求又会怎样？
# - **设计。**你有两块 GPU，负载是提示词短、回答长的聊天。你会用 1P1D 还是两个共置的副本？什么情况会让你改变主意？
