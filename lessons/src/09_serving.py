# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown] lang="en"
# # Lesson 9 — Serving online: an OpenAI-compatible server under load
#
# **Goal:** run the engine as a server, talk to it with the `openai` client, load it with Poisson
# arrivals at three rates, and predict with Little's law the rate at which its time to first token
# explodes.
#
# Until now every lesson drove the engine from Python: all requests known up front, one `generate` call.
# A server is different: requests arrive whenever clients send them, each joins the running batch at the
# next step (continuous batching, lesson 6), and each streams its tokens back as they are made.
# `python -m engine serve` is such a server, with the same HTTP API as `vllm serve` (FastAPI on uvicorn,
# one engine loop in the server process; see docs/serving.md). Two latencies matter to its users:
#
# - **TTFT**, time to first token: from sending the request to its first streamed token. It includes
#   the wait in the queue and the prefill step.
# - **TPOT**, time per output token: the mean gap between the following tokens, about one engine step
#   each.

# %% [markdown] lang="zh"
# # 第 9 课　在线服务：负载下的 OpenAI 兼容服务器
#
# **目标**：把引擎作为服务器运行，用 `openai` 客户端与它对话，以三种速率的泊松到达给它加负载，并用利特尔定律（Little's law）预测首 token 延迟在什么速率下急剧增大。
#
# 到目前为止，每一课都在 Python 里直接驱动引擎：所有请求事先已知，调用一次 `generate` 即可。服务器不同：请求随客户端发送而随时到达，每个请求在下一步加入正在运行的批（连续批处理，第 6 课），生成的 token 一边产生一边流式返回。`python -m engine serve` 就是这样的服务器，其 HTTP 接口与 `vllm serve` 相同（基于 `uvicorn` 的 FastAPI，服务器进程里运行一个引擎循环；见 docs/serving.md）。对用户来说有两种延迟最重要：
#
# - **TTFT**（首 token 延迟）：从发出请求到收到第一个流式 token 的时间，包括在队列中的等待和预填充那一步。
# - **TPOT**（每输出 token 时间）：之后各个 token 之间的平均间隔，每个大约是引擎的一步。

# %%
# Make `engine` importable when this notebook is opened from lessons/<lang>/ without `pip install -e .`
import pathlib
import sys

try:
    import engine  # noqa: F401
except ImportError:
    sys.path.insert(0, str(next(p for p in pathlib.Path.cwd().resolve().parents if (p / "engine").is_dir())))

import asyncio
import atexit
import math
import socket
import subprocess
import tempfile
import time
from dataclasses import replace

import httpx
import matplotlib.pyplot as plt
import numpy as np
from openai import AsyncOpenAI, OpenAI
from tqdm import tqdm

import engine
from engine import EngineConfig, LLMEngine, Request, simulate
from engine.sim.cost_model import StepShape
from engine.tools.calibrate import fit_cost_model, run_engine
from visualize.i18n import finish_reason_text, t
from visualize.style import use_cjk_font

LANG = "en"  # the language of the charts and of the check's messages
use_cjk_font()  # so that 中文 chart labels are drawn, not boxes

# %% [markdown] lang="en"
# ## 1. Start the server
# The server runs in its own process, started here with `subprocess`: the same command you would type in
# a terminal. It serves the default model from a small KV pool (32 blocks of 16 slots) and runs at most
# 4 requests in a step (`--max-num-seqs`). Chunked prefill is on, as in vLLM v1: the running requests'
# decodes go first and a new prompt is computed in the same step (lesson 6), so a newcomer does not hold
# the others up for a step of its own. Prefix caching is off, so that every request computes its whole
# prompt. The cell waits until `/health` answers 200.
#
# The server must not outlive the notebook. `stop_server` sends SIGTERM (the server lets running requests
# finish, then exits); it runs in the last cell, and also when the kernel shuts down (`atexit`), so after
# an error in any cell too. On Linux the server also gets SIGTERM if the kernel dies abruptly.

# %% [markdown] lang="zh"
# ## 1. 启动服务器
# 服务器运行在自己的进程里，这里用 `subprocess` 启动：命令和在终端里输入的一样。它用默认模型提供服务，KV 池很小（32 个块，每块 16 个槽位），每步最多运行 4 个请求（`--max-num-seqs`）。和 vLLM v1 一样开启分块预填充：先安排正在运行的请求的解码，新的提示词在同一步里计算（第 6 课），新来的请求不会单独占用一步、拖住其他请求。前缀缓存关闭，每个请求都完整计算自己的提示词。这个单元格一直等到 `/health` 返回 200。
#
# 服务器不能在这个笔记本（内核）结束之后还继续运行。`stop_server` 发送 SIGTERM（服务器先让正在运行的请求完成，然后退出）；它在最后一个单元格中调用，内核关闭时也会自动调用（`atexit`），因此即使中途某个单元格出错，服务器也会被停止。在 Linux 上，内核意外终止时服务器同样会收到 SIGTERM。

# %%
MAX_NUM_SEQS, NUM_BLOCKS, BLOCK_SIZE = 4, 32, 16
OUTPUT_TOKENS = 16  # every request of this lesson generates 16 tokens (max_tokens, with ignore_eos)
REPO = pathlib.Path(engine.__file__).resolve().parents[1]  # where `python -m engine` finds the package

with socket.socket() as s:  # a free port on this machine
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
base_url = f"http://127.0.0.1:{port}"
command = [sys.executable, "-m", "engine", "serve", "--port", str(port), "--max-num-seqs", str(MAX_NUM_SEQS),
           "--num-gpu-blocks-override", str(NUM_BLOCKS), "--block-size", str(BLOCK_SIZE),
           "--enable-chunked-prefill", "--no-enable-prefix-caching", "--uvicorn-log-level", "warning"]
server_log = tempfile.NamedTemporaryFile("w+", prefix="lesson9-server-", suffix=".log", delete=False)


def _terminate_with_the_kernel():  # runs in the child before `exec`: Linux's PR_SET_PDEATHSIG = 1
    import ctypes
    import signal

    ctypes.CDLL(None).prctl(1, signal.SIGTERM)


server = subprocess.Popen(command, cwd=REPO, stdout=server_log, stderr=subprocess.STDOUT,
                          preexec_fn=_terminate_with_the_kernel if sys.platform == "linux" else None)


def stop_server() -> int:
    """SIGTERM, then SIGKILL if the server is still there after 30 s; returns its exit code. Safe to call twice."""
    if server.poll() is None:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    return server.returncode


atexit.register(stop_server)

start = time.perf_counter()
while True:
    try:
        if httpx.get(f"{base_url}/health", timeout=1).status_code == 200:
            break
    except httpx.HTTPError:
        pass
    if server.poll() is not None or time.perf_counter() - start > 300:
        stop_server()
        raise RuntimeError(t("lp9_not_started", LANG) + "\n" + pathlib.Path(server_log.name).read_text()[-3000:])
    time.sleep(0.25)
print(repr(" ".join(["python", *command[1:]])))  # the command, as you would type it
print(t("lp9_ready", LANG, url=base_url, seconds=time.perf_counter() - start, pid=server.pid))

# %% [markdown] lang="en"
# ## 2. Requests with the `openai` client
# Any OpenAI client works: point it at the server's `/v1`. The server was started without `--api-key`, so
# any key is accepted. First a chat request answered in one piece, then the same request streamed: the
# answer arrives chunk by chunk, one chunk per engine step. `temperature=0` is greedy decoding, so both
# give the same text.

# %% [markdown] lang="zh"
# ## 2. 用 `openai` 客户端发送请求
# 任何 OpenAI 客户端都可以：让它指向服务器的 `/v1` 即可。服务器启动时没有设置 `--api-key`，所以任何密钥都会被接受。先发一个一次性返回完整回答的对话请求，再以流式方式发送同一个请求：回答一个片段一个片段地到达，引擎每一步产生一个片段。`temperature=0` 即贪心解码，所以两次得到的文本相同。

# %%
client = OpenAI(base_url=f"{base_url}/v1", api_key="unused")
model = client.models.list().data[0].id
messages = [{"role": "user", "content": "Name three fruits."}]
answer = client.chat.completions.create(model=model, messages=messages, max_tokens=OUTPUT_TOKENS, temperature=0)
print(repr(answer.choices[0].message.content))
print(t("lp9_answer", LANG, prompt=answer.usage.prompt_tokens, completion=answer.usage.completion_tokens,
        reason=finish_reason_text(answer.choices[0].finish_reason, LANG)))

# %%
chunks, arrived = [], []
start = time.perf_counter()
for chunk in client.chat.completions.create(model=model, messages=messages, max_tokens=OUTPUT_TOKENS, temperature=0, stream=True):
    if chunk.choices and chunk.choices[0].delta.content:
        chunks.append(chunk.choices[0].delta.content)
        arrived.append(time.perf_counter() - start)
print(chunks)
same = "".join(chunks) == answer.choices[0].message.content
print(t("lp9_streamed", LANG, n=len(chunks), ttft=1e3 * arrived[0], gap=1e3 * np.median(np.diff(arrived)),
        same=t("yes" if same else "no", LANG)))

# %% [markdown] lang="en"
# ## 3. The step time, fitted and measured
# To predict the server's latencies, the simulator (lesson 3) needs to know how long one step takes. The
# cell below does what `python -m engine calibrate` does, on a smaller grid: it runs an engine in this
# notebook on batches of 1, 2 and 4 requests, records every step's shape and time, and fits the step-time
# model of engine/sim/cost_model.py (a time per step, per request, per token, per KV block).
#
# Then the same batches through the server: one request alone, then 4 sent at once, each streaming. Their
# TPOT is the server's step time at batch 1 and 4. The server does more than the engine in each step
# (HTTP, one streamed chunk per request, the client on the same cores): the difference, per step and per
# running request, is added to the cost model the simulator uses.

# %% [markdown] lang="zh"
# ## 3. 每步耗时：拟合与实测
# 要预测服务器的延迟，模拟器（第 3 课）需要知道一步要多长时间。下面的单元格做的就是 `python -m engine calibrate` 做的事，只是参数网格更小：在本笔记本里运行一个引擎，批大小分别为 1、2、4 个请求，记录每一步的形状和耗时，拟合 engine/sim/cost_model.py 中的步时模型（每步、每个请求、每个 token、每个 KV 块各一项时间）。
#
# 然后让同样的批经过服务器：先单独发一个请求，再同时发 4 个，都用流式。它们的 TPOT 就是服务器在批大小为 1 和 4 时的每步耗时。服务器每一步做的比引擎多（HTTP、每个请求一个流式片段、客户端和它共用同样的 CPU 核）：两者之差（每步一项、每个运行中的请求一项）会加到模拟器使用的步时模型上。

# %%
calibration = LLMEngine(EngineConfig(block_size=BLOCK_SIZE, num_gpu_blocks=NUM_BLOCKS, max_num_seqs=MAX_NUM_SEQS,
                                     enable_chunked_prefill=True, enable_prefix_caching=False))
rng = np.random.default_rng(0)
vocab = calibration.hf_config.vocab_size
run_engine(calibration, [rng.integers(0, vocab, 16).tolist()] * 2, [2, 2])  # warm-up
shapes, seconds = [], []
for batch, prompt_len in tqdm([(b, n) for b in (1, 2, 4) for n in (8, 32)], desc=t("lp9_progress_calibration", LANG), mininterval=1):
    prompts = [rng.integers(0, vocab, prompt_len).tolist() for _ in range(batch)]
    step_shapes, step_seconds, _, _ = run_engine(calibration, prompts, [6] * batch)
    shapes += step_shapes
    seconds += step_seconds
cost = fit_cost_model(shapes, seconds)
tokenizer = calibration.tokenizer
del calibration  # the server holds its own copy of the model


def decode_step_s(model, batch, context=24):
    """Seconds of one decode step of `batch` requests of `context` tokens each, by the cost model."""
    return model.step_time(StepShape.of_batch([], [context] * batch, BLOCK_SIZE))


print(t("lp9_fitted", LANG, steps=len(shapes), alone=1e3 * decode_step_s(cost, 1), full=1e3 * decode_step_s(cost, MAX_NUM_SEQS),
        batch=MAX_NUM_SEQS, prompt=16, prefill=1e3 * cost.step_time(StepShape.of_batch([(16, 16)], [], BLOCK_SIZE))))

# %% [markdown] lang="en"
# The load generator: `one_request` streams one completion and times it the way `python -m engine
# bench-serve` (and `vllm bench serve`) do; `send` sends a list of prompts as a Poisson process of `rate`
# requests per second, or all at once for `math.inf`, and waits for every answer. The gaps between
# arrivals are drawn once and scaled by `1 / rate`: every rate sees the same pattern, faster or slower.
# The cells use `await` at the top level, which Jupyter allows.

# %% [markdown] lang="zh"
# 负载生成器：`one_request` 以流式发送一个补全请求，并按 `python -m engine bench-serve`（以及 `vllm bench serve`）的方式计时；`send` 把一组提示词按每秒 `rate` 个请求的泊松过程发送出去（`math.inf` 表示同时全部发出），并等到所有回答都返回。到达间隔只抽样一次，再按 `1 / rate` 缩放：每个速率看到的都是同一个到达模式，只是更快或更慢。这些单元格在顶层使用 `await`，Jupyter 允许这样写。

# %%
GAPS = np.random.default_rng(0).exponential(1.0, size=64)  # Poisson arrivals at 1 request/s


def arrival_times(rate, n):
    """Seconds from the start at which n requests arrive at `rate` requests/s (all at 0 for math.inf)."""
    return np.zeros(n) if math.isinf(rate) else np.concatenate([[0.0], np.cumsum(GAPS[:n - 1])]) / rate


async def one_request(aclient, prompt):
    """Stream one completion of OUTPUT_TOKENS tokens; returns (TTFT, TPOT, end-to-end latency) in seconds."""
    start = time.perf_counter()
    stream = await aclient.completions.create(model=model, prompt=prompt, max_tokens=OUTPUT_TOKENS, temperature=0, stream=True,
                                              stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    first = last = None
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].text:
            last = time.perf_counter() - start
            first = last if first is None else first
        if chunk.usage:
            tokens = chunk.usage.completion_tokens
    return first, (last - first) / (tokens - 1), last


async def send(prompts, rate):
    """Send `prompts` at `rate` requests/s; returns an array of (TTFT, TPOT, latency) rows and the seconds it all took."""
    async with AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0) as aclient:
        start, tasks = time.perf_counter(), []
        for prompt, at in zip(prompts, arrival_times(rate, len(prompts))):
            await asyncio.sleep(max(0.0, at - (time.perf_counter() - start)))
            tasks.append(asyncio.create_task(one_request(aclient, prompt)))
        rows = await asyncio.gather(*tasks)
    return np.array(rows), time.perf_counter() - start


topics = ["a cat", "the sea", "a robot", "the moon", "a train", "a forest", "a city", "a lighthouse", "a river",
          "a mountain", "a violin", "a garden"]
prompts = [f"Write a short story about {topic}." for topic in topics]
prompt_lens = [len(tokenizer(p).input_ids) for p in prompts]

alone, _ = await send(prompts[:1], math.inf)
together, _ = await send(prompts[:MAX_NUM_SEQS], math.inf)
tpot_alone, tpot_full = float(alone[:, 1].mean()), float(together[:, 1].mean())
# What the server adds to the engine's step: a straight line through the two measured points.
extra_seq = max(0.0, (tpot_full - decode_step_s(cost, MAX_NUM_SEQS)) - (tpot_alone - decode_step_s(cost, 1))) / (MAX_NUM_SEQS - 1)
extra_step = max(0.0, tpot_alone - decode_step_s(cost, 1) - extra_seq)
server_cost = replace(cost, name="this machine, through the server", step_overhead_s=cost.step_overhead_s + extra_step,
                      seq_overhead_s=cost.seq_overhead_s + extra_seq)
print(t("lp9_through_server", LANG, alone=1e3 * tpot_alone, full=1e3 * tpot_full, batch=MAX_NUM_SEQS,
        step=1e3 * extra_step, seq=1e3 * extra_seq))

# %% [markdown] lang="en"
# ## 4. Poisson load at three rates
# The simulator runs the engine's own scheduler on lengths alone (lesson 3), here with the cost model
# just fitted, on exactly the requests the server gets: the same prompt lengths, 16 output tokens each,
# the same arrival times. It answers in milliseconds, so it draws the whole curve; the server is measured
# at three rates that the simulator picks: a light load, a heavy one, and one beyond what it predicts the
# server can take. A request also costs the server some time outside the engine's steps before its first
# token (HTTP, tokenizing, handing it to the engine loop): measured on the lone request of section 3, it
# is added to the simulated TTFT.

# %% [markdown] lang="zh"
# ## 4. 三种速率的泊松负载
# 模拟器只凭长度运行引擎自己的调度器（第 3 课），这里用的是刚刚拟合的步时模型，模拟的正是服务器收到的那些请求：相同的提示词长度，每个请求 16 个输出 token，相同的到达时间。它几毫秒就能算完，所以可以画出整条曲线；服务器则在模拟器选出的三个速率下实测：轻负载、重负载，以及超过模拟器预测的服务器承受能力的负载。一个请求在得到第一个 token 之前，还要在引擎的步之外花掉服务器一些时间（HTTP、分词、交给引擎循环）：这段时间用第 3 节那个单独的请求测出，加到模拟的 TTFT 上。

# %%
SWEEP = 10  # requests per rate


def simulated(rate, n=SWEEP):
    """The simulator on the lesson's first n prompts arriving at `rate` requests/s (math.inf: all at once)."""
    requests = [Request(arrival=float(at), prompt_len=length, output_len=OUTPUT_TOKENS)
                for at, length in zip(arrival_times(rate, n), prompt_lens)]
    return simulate(requests=requests, kv_slots=NUM_BLOCKS * BLOCK_SIZE, block_size=BLOCK_SIZE, max_num_seqs=MAX_NUM_SEQS,
                    max_model_len=NUM_BLOCKS * BLOCK_SIZE, enable_chunked_prefill=True, cost_model=server_cost)


# What a request costs the server besides its steps (HTTP, tokenizing, handing it to the engine loop): the
# lone request's TTFT of section 3 against the simulator's. It is added to every simulated TTFT.
first_token_extra = max(0.0, alone[0, 0] - simulated(math.inf, 1).mean_ttft_s)
print(t("lp9_first_token_extra", LANG, ms=1e3 * first_token_extra))

most = simulated(math.inf).throughput_requests_per_s  # the most the simulated server finishes per second
curve = most * np.linspace(0.1, 1.6, 31)
predicted = [simulated(rate) for rate in curve]
rates = most * np.array([0.35, 0.7, 1.3])
measured = []
for rate in tqdm(rates, desc=t("lp9_progress_rates", LANG), mininterval=1):  # each rate sends its requests in real time
    rows, took = await send(prompts[:SWEEP], rate)
    sim = simulated(rate)
    measured.append(rows.mean(axis=0))
    print(t("lp9_rate", LANG, rate=rate, ttft=1e3 * measured[-1][0], sim_ttft=1e3 * (sim.mean_ttft_s + first_token_extra),
            tpot=1e3 * measured[-1][1], sim_tpot=1e3 * sim.mean_tpot_s, n=len(rows), seconds=took))
measured = np.array(measured)

# %%
fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
for ax, column, label, simulated_ms in (
        (axes[0], 0, "lc_l9_ttft", [1e3 * (r.mean_ttft_s + first_token_extra) for r in predicted]),
        (axes[1], 1, "lc_l9_tpot", [1e3 * r.mean_tpot_s for r in predicted])):
    ax.plot(curve, simulated_ms, "-", color="tab:blue", label=t("lc_l9_simulated", LANG))
    ax.plot(rates, 1e3 * measured[:, column], "o", color="tab:red", markersize=8, label=t("lc_l9_measured", LANG))
    ax.set_xlabel(t("lc_l9_rate", LANG))
    ax.set_ylabel(t(label, LANG))
    ax.set_ylim(bottom=0)
axes[0].legend(fontsize=8)
plt.tight_layout()
plt.show()

# %% [markdown] lang="en"
# TPOT rises with the rate while the batch fills up, then stays flat: at most 4 requests share a step,
# however many wait. TTFT stays near one prefill step plus a step's wait while the load is light, then
# climbs: a request waits for a place in the batch. Beyond the rate the server can finish requests, the
# queue grows for as long as the load lasts, and so does TTFT; in a longer run it would grow without bound.
#
# ## Exercise: the rate at which TTFT explodes
# Predict that rate (`ttft_explodes_at`, requests per second) from the step time alone:
#
# 1. When the server is overloaded, `max_num_seqs` requests are in it at once (the waiting ones aside).
# 2. Each request stays for `output_tokens` steps: the step that computes its prompt (beside the others'
#    decodes, with chunked prefill) and makes its first token, then one decode step per further token.
# 3. A step of a full batch takes `step_s` seconds on average: 4 requests sent together (measured again
#    just below) took `output_tokens × step_s` seconds from sending to their last token.
# 4. Little's law (requests in the system = rate × time each spends there) gives the rate.
#
# The check then sends 12 requests at once and measures how many the server finishes per second; it
# passes when your prediction is within 35% of that.

# %% [markdown] lang="zh"
# TPOT 随速率上升，直到批被填满，之后保持不变：无论有多少请求在等待，一步最多只有 4 个请求。负载轻时，TTFT 大约是一次预填充加上等待当前一步结束的时间；之后开始攀升：请求要等批里空出位置。一旦速率超过服务器完成请求的能力，只要负载持续，队列就一直变长，TTFT 也随之增大；如果一直这样运行下去，它会无限增长。
#
# ## 练习：TTFT 在什么速率下急剧增大
# 只根据每步耗时预测这个速率（`ttft_explodes_at`，每秒请求数）：
#
# 1. 服务器过载时，正在服务器里处理的请求始终有 `max_num_seqs` 个（不算等待中的）。
# 2. 每个请求停留 `output_tokens` 步：先是计算它的提示词并生成第一个 token 的那一步（开启分块预填充时，与其他请求的解码在同一步），之后每多一个 token 一步解码。
# 3. 批满时一步平均需要 `step_s` 秒：同时发送的 4 个请求（就在下面重新测一次）从发出到收到最后一个 token 用了 `output_tokens × step_s` 秒。
# 4. 利特尔定律（系统中的请求数 = 速率 × 每个请求停留的时间）给出速率。
#
# 检查会同时发送 12 个请求，实测服务器每秒完成多少个请求；你的预测与实测相差不超过 35% 即为通过。

# %%
together, _ = await send(prompts[:MAX_NUM_SEQS], math.inf)  # a full batch, just before the check's own run
max_num_seqs, output_tokens = MAX_NUM_SEQS, OUTPUT_TOKENS
step_s = float(together[:, 2].mean()) / output_tokens  # their 16 steps took their end-to-end latency
capacity_run = {}  # the check's measured run, made once
print(t("lp9_given", LANG, batch=max_num_seqs, tokens=output_tokens, step=step_s))

# %% tags=["exercise"]
ttft_explodes_at = None  # TODO(student): requests per second

# %% tags=["check"]
async def check():
    from visualize.i18n import t  # the check's messages, in the notebook's language
    if ttft_explodes_at is None:
        return t("l9_fail_none", LANG)
    if "rate" not in capacity_run:  # three full batches at once: the server finishes them as fast as it can
        rows, took = await send(prompts[:3 * MAX_NUM_SEQS], math.inf)
        capacity_run["rate"] = len(rows) / took
    measured_rate = capacity_run["rate"]
    if not 0.65 <= ttft_explodes_at / measured_rate <= 1.35:
        return t("l9_fail_far", LANG, predicted=ttft_explodes_at, measured=measured_rate, ratio=ttft_explodes_at / measured_rate)
    return t("l9_pass", LANG, predicted=ttft_explodes_at, measured=measured_rate)


print(await check())

# %% [markdown] lang="en"
# ## 5. Stop the server
# Its metrics first (`/metrics`, Prometheus text with vLLM's names): every request finished, none left
# running or waiting, every KV block back on the free list. Then SIGTERM.

# %% [markdown] lang="zh"
# ## 5. 停止服务器
# 先看它的指标（`/metrics`，采用 vLLM 指标名的 Prometheus 文本格式）：所有请求都已完成，没有运行中或等待中的请求，所有 KV 块都回到了空闲列表。然后发送 SIGTERM。

# %%
values = {}
for line in httpx.get(f"{base_url}/metrics").text.splitlines():
    if line and not line.startswith("#"):
        name, value = line.rsplit(" ", 1)
        values[name.split("{")[0]] = values.get(name.split("{")[0], 0.0) + float(value)  # summed over labels
print(t("lp9_metrics", LANG, done=values["vllm:request_success_total"], running=values["vllm:num_requests_running"],
        waiting=values["vllm:num_requests_waiting"], free=values["lab:kv_cache_free_blocks"], blocks=values["lab:kv_cache_blocks"]))
print(t("lp9_stopped", LANG, code=stop_server()))

# %% [markdown] lang="en"
# ## Labs
# Write this lesson's parts of the engine yourself, graded in the engine: `open_scheduler` (Open lab: a scheduling policy of your own, 90 min). Copy the starter from `labs/starters/`, fill in the TODOs and run `python -m lessons grade <lab> --impl <your file>`; [the labs](../../docs/labs.md) explains each one.
# %% [markdown] lang="zh"
# ## 实验
# 亲手实现本课讲到的引擎部件，放进引擎中运行并评分：`open_scheduler`（开放实验：自己设计的调度策略，90 分钟）。从 `labs/starters/` 复制起始代码，完成其中的 TODO，然后运行 `python -m lessons grade <lab> --impl <你的文件>`；[实验说明](../../docs/labs.zh.md)逐一介绍每个实验。

# %% [markdown] lang="en"
# ## Self-check
# For discussion or an exam; the answers follow from this lesson.
# - **Warm-up.** Define TTFT, TPOT and ITL. Which of them does one long prompt at the head of the queue hurt most?
# - **Core.** By Little's law, if requests arrive at 2 per second and each spends 6 s in the server, how many are in the server on average? What happens once they arrive faster than the engine can serve them?
# - **Design.** The server steps the engine on a thread of its own. What would break or slow down if the HTTP handling and the engine's steps shared one thread?
# %% [markdown] lang="zh"
# ## 自测题
# 供讨论或考试使用；答案都可以从本课推出。
# - **热身。**给出首 token 延迟（TTFT）、每输出 token 时间（TPOT）和 token 间延迟（ITL）的定义。排在队头的一个长提示词对哪一个伤害最大？
# - **核心。**按利特尔定律，请求速率为每秒 2 个，每个在服务器中停留 6 秒，服务器里平均有多少个请求？到达得比引擎能服务的更快时会怎样？
# - **设计。**服务器在一个单独的线程上让引擎逐步运行。如果 HTTP 处理和引擎的步共用一个线程，什么会出问题或变慢？
