"""The session's engine: settings from the sidebar, the workload, building the engine cheaply, history.

Streamlit reruns the whole script on every click, so anything slow lives in a cache:
- the model weights, once per server process and model name (``st.cache_resource``);
- this browser session's engine and its step reports (``st.session_state``).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field

import pandas as pd
import streamlit as st

from engine import BeamSearchParams, EngineConfig, LLMEngine, SamplingParams
from engine.model_executor.model_loader import DEFAULT_MODEL, load_model, resolve_model

MODEL_ENV = "PAGEDATTENTION_LAB_MODEL"  # tests point the app at a tiny model with this

# Classroom bounds: a laptop must stay responsive whatever a student types.
MAX_REQUESTS = 16
MAX_PROMPT_CHARS = 1000
MAX_NEW_TOKENS = 256
MAX_BLOCKS = 512
MAX_MIB = 256
MAX_STEPS_KEPT = 2000  # reports kept for the memory chart and replays

LONG_PROMPT = (  # about 200 tokens: several chunks under a small token budget
    "Summarise this passage in one sentence. The lighthouse keeper climbed the spiral stairs every evening at dusk, "
    "carrying a lamp, a book and a flask of tea. From the top he could see the harbour, the fishing boats coming home, "
    "the lights of the town and, far out, the dark line where the sea met the sky. He wrote down the weather, the ships "
    "that passed and the birds that rested on the rail. In winter the storms shook the tower and the waves reached the "
    "windows of the lower rooms; in summer children rowed out to visit him and asked for stories about shipwrecks. "
    "When the light was finally automated, he kept climbing the stairs each evening, out of habit, to watch the lamp turn."
)

PRESETS = {
    "preset_short_chat": dict(
        rows=[("What is the capital of France?", 24), ("Name three fruits.", 24),
              ("Name a primary colour.", 16), ("What is 2 + 2?", 16)],
        num_blocks=64,
    ),
    "preset_long_story": dict(
        rows=[("Write a long story about a robot who learns to paint.", 200),
              ("Tell a long fairy tale about a dragon and a baker.", 200)],
        num_blocks=64,
    ),
    # Eight long-ish requests in a pool that holds far fewer tokens than they will need together:
    # the scheduler must evict (preempt) requests and recompute them later.
    "preset_preemption": dict(
        rows=[(f"Write a story about {thing}.", 96) for thing in
              ("a lighthouse", "a cat", "the moon", "a train", "a forest", "a robot", "the sea", "a city")],
        num_blocks=40,
    ),
    # Memory sharing (paper §4.4): four samples of one prompt share its blocks; beams fork and prune.
    "preset_parallel_sampling": dict(
        rows=[("Tell me a short story about a cat.", 24), ("Name three colours.", 16)],
        num_blocks=64, sharing="parallel", sharing_width=4, sample=True,
    ),
    "preset_beam_search": dict(
        rows=[("Tell me a short story about a cat.", 24)],
        num_blocks=64, sharing="beam", sharing_width=4,
    ),
    # Swap preemption (paper §4.5) and chunked prefill (vLLM's enable_chunked_prefill).
    # Six stories of different lengths in a pool of 18 blocks: at step 12 two requests are swapped out to the
    # CPU pool, at step 16 (a short one finished) the first comes back in; nothing is recomputed.
    "preset_swap": dict(
        rows=[(f"Write a story about {thing}.", n) for thing, n in
              (("a lighthouse", 48), ("a cat", 16), ("the moon", 48), ("a train", 24), ("a forest", 48), ("a robot", 32))],
        num_blocks=18, preemption_mode="swap",
    ),
    # Two short chats decode while a long prompt is prefilled in chunks of the 48-token budget.
    "preset_chunked_prefill": dict(
        rows=[("Name a primary colour.", 48), ("What is 2 + 2?", 48), (LONG_PROMPT, 32)],
        num_blocks=64, chunked_prefill=True, token_budget=48,
    ),
}
# Prefix caching: later requests begin with tokens an earlier one computed. A block is cached
# only once its KV is written, so these presets limit the batch: requests admitted in one step cannot hit
# each other (see the "_note" texts in visualize/i18n.py).
SYSTEM_PROMPT = ("You are a patient tutor for a class on large language model inference. Answer in one or two short "
                 "sentences, use plain words, define any technical term you use, and give a small example when it "
                 "helps. The students know Python and basic linear algebra but have never seen a transformer. ")
SYSTEM_PROMPT_ZH = ("你是一门大语言模型推理课程的耐心助教。用一两句简短的话回答，用浅白的词语，解释你用到的每个术语，"
                    "有帮助时举一个小例子。学生会 Python 和基础线性代数，但从没见过 Transformer。")
QUESTIONS = (("What is a token?", "什么是 token？"), ("What is attention?", "什么是注意力？"),
             ("Why is decoding slow?", "为什么解码慢？"), ("What is a KV cache?", "什么是 KV 缓存？"))
# A chat of three questions, one turn each: turn k is sent once turn k-1 has finished, with the model's own
# answers in its history (see ``add_next_chat_turn``), so its history's blocks, answers included, are cached.
CHAT = (("We are talking about the KV cache. What does it store?", "我们在聊 KV 缓存。它存的是什么？"),
        ("Why does it grow during a conversation?", "为什么它在对话中不断变大？"),
        ("What does vLLM do when the cache is full?", "缓存满了，vLLM 会怎么做？"))


PRESETS["preset_shared_system_prompt"] = dict(
    rows=[(SYSTEM_PROMPT + "Question: " + q, 24) for q, _ in QUESTIONS], num_blocks=64, max_batch=2, prefix_caching=True)
PRESETS["preset_multi_turn_chat"] = dict(rows=[(question, 24) for question, _ in CHAT], num_blocks=12, max_batch=1,
                                         prefix_caching=True, chat=True)
SHARING = ("none", "parallel", "beam")  # every request: one sequence, n samples, or beam search

# Every sidebar setting a preset's demo depends on, as a fresh session has it: loading a preset sets
# all of them (its own values over these), so no setting of an earlier preset is left behind.
PRESET_DEFAULTS = dict(block_size=16, pool_unit="blocks", allocator="paged", prefix_caching=True,
                       preemption_mode="recompute", chunked_prefill=False, token_budget=64, max_batch=8,
                       sample=False, temperature=0.7, seed=0, sharing="none", sharing_width=4, chat=False)


def preset_settings(name: str) -> dict:
    """The session-state values (sidebar keys, see ``PRESET_DEFAULTS``) that preset ``name`` sets:
    its own, the defaults for the rest; ``num_blocks`` always (every preset sizes its pool)."""
    preset = PRESETS[name]
    values = {key: preset.get(key, default) for key, default in PRESET_DEFAULTS.items()}
    values["num_blocks"] = preset["num_blocks"]
    return values


# The presets stay in English (the default model answers English well and Chinese poorly); in 中文
# mode each is shown with its translation.
PROMPT_TRANSLATIONS = {
    "What is the capital of France?": "法国的首都是哪里？",
    "Name three fruits.": "说出三种水果。",
    "Name a primary colour.": "说出一种原色。",
    "What is 2 + 2?": "2 + 2 等于几？",
    "Write a long story about a robot who learns to paint.": "写一个关于学画画的机器人的长故事。",
    "Tell me a short story about a cat.": "给我讲一个关于猫的短故事。",
    "Name three colours.": "说出三种颜色。",
    "Tell a long fairy tale about a dragon and a baker.": "讲一个关于龙和面包师的长篇童话。",
    LONG_PROMPT: "用一句话概括这段文字（一位灯塔看守人每晚登上灯塔、记录天气与船只，灯塔自动化后他仍习惯每晚上去看灯旋转）。",
    **{f"Write a story about {en}.": f"写一个关于{zh}的故事。" for en, zh in (
        ("a lighthouse", "灯塔"), ("a cat", "猫"), ("the moon", "月亮"), ("a train", "火车"), ("a forest", "森林"),
        ("a robot", "机器人"), ("the sea", "大海"), ("a city", "城市"))},
    **{SYSTEM_PROMPT + "Question: " + q: SYSTEM_PROMPT_ZH + "问题：" + zh for q, zh in QUESTIONS},
    **dict(CHAT),
}

THREADS_ENV = "PAGEDATTENTION_LAB_THREADS"


def torch_threads() -> int:
    """Threads for torch's CPU kernels: $PAGEDATTENTION_LAB_THREADS, else half the cores (at least 1).

    Why not all cores: the Streamlit server and the browser run on the same laptop, and OpenMP
    threads spin-wait when a core is taken; on a busy 2-core machine a decode step of 8 requests
    took 7 s with 2 threads and 0.35 s with 1.
    """
    value = os.environ.get(THREADS_ENV)
    if value and value.isdigit() and int(value) > 0:
        return int(value)
    return max(1, (os.cpu_count() or 2) // 2)


def default_model() -> str:
    """The model the sidebar starts with: $PAGEDATTENTION_LAB_MODEL or the default SmolLM2."""
    return os.environ.get(MODEL_ENV) or DEFAULT_MODEL


def preset_workload(name: str) -> pd.DataFrame:
    return pd.DataFrame(PRESETS[name]["rows"], columns=["prompt", "max_tokens"])


def clean_workload(frame: pd.DataFrame) -> list[tuple[str, int]]:
    """The editor's rows as (prompt, max_tokens), bounded: empty prompts dropped, prompts cut to
    MAX_PROMPT_CHARS, max_tokens clipped to 1..MAX_NEW_TOKENS, at most MAX_REQUESTS rows."""
    rows = []
    for prompt, max_tokens in zip(frame["prompt"], frame["max_tokens"]):
        if not isinstance(prompt, str) or not prompt.strip():
            continue
        try:
            n = int(max_tokens)
        except (TypeError, ValueError):
            n = 32
        rows.append((prompt[:MAX_PROMPT_CHARS], min(max(n, 1), MAX_NEW_TOKENS)))
    return rows[:MAX_REQUESTS]


@dataclass(frozen=True)
class Settings:
    """What the sidebar chose; two equal Settings build the same engine."""

    model: str = DEFAULT_MODEL
    block_size: int = 16
    num_gpu_blocks: int | None = 64
    kv_cache_memory: int | None = None
    allocator: str = "paged"
    reservation: str = "max"
    attention_backend: str = "torch"
    max_num_seqs: int = 8
    temperature: float = 0.0  # greedy, as SamplingParams
    seed: int = 0
    sharing: str = "none"  # one of SHARING
    sharing_width: int = 4  # n samples, or beam width
    enable_prefix_caching: bool | None = None  # None: the engine's default (on when paged)
    preemption_mode: str = "recompute"  # or "swap": a CPU swap space as large as the pool (paper §4.5)
    enable_chunked_prefill: bool = False
    max_num_batched_tokens: int | None = None  # the step's token budget; None: the engine's default

    def engine_config(self, **overrides) -> EngineConfig:
        fields = asdict(self)
        model = fields.pop("model")
        for key in ("temperature", "sharing", "sharing_width"):
            fields.pop(key)
        fields.update(overrides)
        return EngineConfig(model=None if model == DEFAULT_MODEL else model, device="cpu" if not _has_cuda() else "auto", **fields)


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


@st.cache_resource(show_spinner=False, max_entries=2)
def cached_model(model: str):
    """Config, weights and tokenizer of ``model``, read once per server process (not per click)."""
    return load_model(None if model == DEFAULT_MODEL else model)


def kv_slot_bytes(model: str) -> int | None:
    """Bytes of one token's K and V in the engine the app builds for ``model`` (float32 on CPU,
    bfloat16 on CUDA); None when the model cannot be read (the page shows why)."""
    import torch

    from engine.model_executor.model_runner import kv_bytes_per_slot

    try:
        config = cached_model(model).config
    except Exception:  # noqa: BLE001 - a bad path is reported where the engine is built
        return None
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    dtype = torch.bfloat16 if _has_cuda() else torch.float32
    return kv_bytes_per_slot(config.num_hidden_layers, config.num_key_value_heads, head_dim, dtype)


def build_engine(settings: Settings, progress=None, **overrides) -> LLMEngine:
    """A fresh engine for ``settings`` in a second or so, once the model is cached.

    ``progress(stage, fraction)`` reports the first-time fetch and conversion of the model.
    Raises ValueError (ModelLoadError is one) with a readable message on any bad setting.
    """
    resolve_model(None if settings.model == DEFAULT_MODEL else settings.model, progress)  # no-op once cached
    loaded = cached_model(settings.model)
    llm = LLMEngine(settings.engine_config(**overrides), loaded_model=loaded)
    install_capture(llm)
    return llm


def install_capture(llm: LLMEngine) -> None:
    """Keep, for the last step, every layer's query projection output and attention output, and the
    block tables and context lengths attention read (``llm.captured["tables"]``: the step's
    AttentionMetadata fields, one row per sequence, prefills first as in the flat batch).

    The Kernel lab replays the decode kernel on these real queries through the same block tables
    (a sample or beam is a sequence of its request; a pruned beam's table is gone after the step).
    Forward hooks only keep a reference to tensors the model computes anyway, so stepping costs
    nothing extra.
    """
    llm.captured = {}  # layer -> {"q": q_proj output, "attn": o_proj input}; "tables" -> the step's metadata

    def keep_tables(module, args):
        meta = args[3]
        llm.captured["tables"] = (meta.prefill_block_tables, meta.prefill_context_lens,
                                  meta.decode_block_tables, meta.decode_context_lens)

    llm.runner.model.register_forward_pre_hook(keep_tables)

    for index, layer in enumerate(llm.runner.model.model.layers):
        def keep_q(module, inputs, output, index=index):
            llm.captured.setdefault(index, {})["q"] = output

        def keep_attn(module, inputs, index=index):
            llm.captured.setdefault(index, {})["attn"] = inputs[0]

        layer.self_attn.q_proj.register_forward_hook(keep_q)
        layer.self_attn.o_proj.register_forward_pre_hook(keep_attn)


def add_workload(llm: LLMEngine, rows: list[tuple[str, int]], temperature: float, seed: int,
                 sharing: str = "none", width: int = 4) -> list[tuple[int, str]]:
    """Queue each (prompt, max_tokens) as a chat message, as one sequence, ``width`` parallel samples
    or a beam search of ``width`` beams (``sharing``); returns (row, error) for rejected rows."""
    errors = []
    for row, (prompt, max_tokens) in enumerate(rows):
        if sharing == "beam":
            params = BeamSearchParams(beam_width=width, max_tokens=max_tokens)
        else:
            n = width if sharing == "parallel" else 1
            params = SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed + row, n=n)
        try:
            llm.add_request([{"role": "user", "content": prompt}], params)
        except ValueError as error:
            errors.append((row, str(error)))
    return errors


def run_to_end(llm: LLMEngine, max_steps: int, on_step=None) -> list:
    """Step until every request finished or ``max_steps``; returns the reports."""
    reports = []
    while llm.has_unfinished_requests() and len(reports) < max_steps:
        reports.append(llm.step())
        if on_step:
            on_step(len(reports))
    return reports


def session_engine(settings: Settings, rows: list[tuple[str, int]], progress=None, force: bool = False):
    """This session's engine for these settings and workload, rebuilt (history cleared) when either
    changed or ``force``. Returns (engine or None, list of error messages)."""
    ss = st.session_state
    chat = bool(ss.get("chat"))  # the rows are one chat's turns, sent one after another
    key = (settings, tuple(rows), chat)
    if not force and ss.get("engine_key") == key and ss.get("engine") is not None:
        return ss["engine"], ss.get("engine_errors", [])
    ss["engine"], ss["engine_key"], ss["reports"], ss["playing"] = None, key, [], False
    ss["cache_entries"] = {}
    try:
        llm = build_engine(settings, progress)
    except Exception as error:  # a bad model or setting: say so, keep the app usable
        ss["engine_errors"] = [("engine", str(error))]
        return None, ss["engine_errors"]
    ss["engine"] = llm
    llm.chat = ChatTurns(rows) if chat and rows else None
    first = rows[:1] if llm.chat else rows
    ss["engine_errors"] = add_workload(llm, first, settings.temperature, settings.seed, settings.sharing, settings.sharing_width)
    if ss["engine_errors"]:  # the first turn was rejected: no chat to continue
        llm.chat = None
    return llm, ss["engine_errors"]


@dataclass
class ChatTurns:
    """One conversation whose turns are the workload's rows: ``messages`` so far (user and the model's
    own answers), the rows not yet sent, and the request id of the turn being answered."""

    rows: list[tuple[str, int]]
    messages: list[dict] = field(default_factory=list)
    next_row: int = 1
    request_id: int = 0

    def __post_init__(self):
        self.messages = [{"role": "user", "content": self.rows[0][0]}]


def add_next_chat_turn(llm: LLMEngine, settings: Settings) -> int | None:
    """Chat mode: once the turn being answered has finished, send the next one, as a chat client does:
    the earlier turns, the model's own answer, the new question. Its prompt is the finished turn's
    prompt and output token ids followed by the chat template's text after the answer, so the history
    (answer included) is token for token what was computed, and prefix caching finds its full blocks.
    Returns the new request id, or None (no chat, turn still running, or no turn left)."""
    chat = getattr(llm, "chat", None)
    if chat is None or chat.next_row >= len(chat.rows) or not llm.get_output(chat.request_id).finished:
        return None
    done = llm.get_output(chat.request_id)
    answer_ids = [i for i in done.token_ids if i not in llm.eos_token_ids]
    before = llm.tokenizer.apply_chat_template(chat.messages, add_generation_prompt=True, tokenize=False)
    question, max_tokens = chat.rows[chat.next_row]
    chat.messages += [{"role": "assistant", "content": done.text}, {"role": "user", "content": question}]
    after = llm.tokenizer.apply_chat_template(chat.messages, add_generation_prompt=True, tokenize=False)
    if after.startswith(before + done.text):
        suffix = llm.tokenizer(after[len(before + done.text):], add_special_tokens=False).input_ids
        prompt = list(done.prompt_token_ids) + answer_ids + suffix
    else:  # a template that rewrites earlier turns: send the messages as they are
        prompt = chat.messages
    chat.next_row += 1
    try:
        chat.request_id = llm.add_request(prompt, SamplingParams(max_tokens=max_tokens, temperature=settings.temperature,
                                                                 seed=settings.seed + chat.next_row - 1))
    except ValueError:  # the history no longer fits the pool: the chat ends here
        chat.next_row = len(chat.rows)
        return None
    return chat.request_id


def record(report, cache: dict | None = None) -> None:
    """Keep a step's report and, with prefix caching, ``cache``: the engine's ``PrefixCache.entries()``
    after it (block -> hash, parent hash), for the pool map's hash hover; kept per step for replays."""
    reports = st.session_state.setdefault("reports", [])
    reports.append(report)
    del reports[:-MAX_STEPS_KEPT]
    caches = st.session_state.setdefault("cache_entries", {})
    if cache is not None:
        last = caches.get(report.step - 1)
        caches[report.step] = last if last == cache else cache  # the map changes on few steps: share the dict
    for step in [s for s in caches if s < reports[0].step]:
        del caches[step]


def prefix_cache_entries(llm: LLMEngine) -> dict | None:
    """The engine's cached blocks now (``PrefixCache.entries()``), None without prefix caching."""
    cache = getattr(llm.kv, "prefix_cache", None)
    return cache.entries() if cache is not None else None
