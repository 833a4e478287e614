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
from engine.config import SpeculativeConfig
from engine.model_executor.model_loader import DEFAULT_MODEL, load_model, resolve_model

MODEL_ENV = "PAGEDATTENTION_LAB_MODEL"  # tests point the app at a tiny model with this

# Classroom bounds: a laptop must stay responsive whatever a student types.
MAX_REQUESTS = 16
MAX_PROMPT_CHARS = 4000  # a prompt past Gemma 3's 512-token sliding window (its preset's: 2,727) fits
MAX_NEW_TOKENS = 256
MAX_BLOCKS = 512
MAX_MIB = 256
MAX_STEPS_KEPT = 2000  # reports kept for the memory chart and replays

SHARING = ("none", "parallel", "beam")  # every request: one sequence, n samples, or beam search

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
    prefix_cache: str = "hash"  # or "radix" (SGLang's radix tree), with prefix caching
    scheduling_policy: str = "fcfs"  # or "lpm" (longest prefix match), with prefix caching
    kv_offload_blocks: int = 0  # the CPU tier under the prefix cache; 0: none
    preemption_mode: str = "recompute"  # or "swap": a CPU swap space as large as the pool (paper §4.5)
    enable_chunked_prefill: bool = False
    max_num_batched_tokens: int | None = None  # the step's token budget; None: the engine's default
    num_speculative_tokens: int = 0  # speculative decoding by prompt lookup ("ngram"), k drafts per step; 0: off
    kv_cache_dtype: str = "auto"  # vLLM's kv_cache_dtype: auto, fp8, fp8_e4m3, fp8_e5m2 (engine/model_executor/kv_quant.py)

    def engine_config(self, **overrides) -> EngineConfig:
        fields = asdict(self)
        model = fields.pop("model")
        for key in ("temperature", "sharing", "sharing_width"):
            fields.pop(key)
        k = fields.pop("num_speculative_tokens")
        if k:
            fields["speculative_config"] = SpeculativeConfig(method="ngram", num_speculative_tokens=k)
        fields.update(overrides)
        return EngineConfig(model=None if model == DEFAULT_MODEL else model, device="cpu" if not _has_cuda() else "auto", **fields)


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


@st.cache_resource(show_spinner=False, max_entries=2)
def cached_model(model: str):
    """Config, weights and tokenizer of ``model``, read once per server process (not per click)."""
    return load_model(None if model == DEFAULT_MODEL else model)


def kv_slot_bytes(model: str, kv_cache_dtype: str = "auto") -> int | None:
    """Bytes of one token's K and V in the engine the app builds for ``model`` (float32 on CPU,
    bfloat16 on CUDA; one byte per element with an fp8 ``kv_cache_dtype``); None when the model cannot
    be read (the page shows why)."""
    import torch

    from engine.model_executor.model_runner import kv_bytes_per_slot

    try:
        config = cached_model(model).config
    except Exception:  # noqa: BLE001 - a bad path is reported where the engine is built
        return None
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    from engine.model_executor.kv_quant import cache_dtype

    dtype = cache_dtype(kv_cache_dtype, torch.bfloat16 if _has_cuda() else torch.float32)
    return kv_bytes_per_slot(config.num_hidden_layers, config.num_key_value_heads, head_dim, dtype)


def build_engine(settings: Settings, progress=None, **overrides) -> LLMEngine:
    """A fresh engine for ``settings`` in a second or so, once the model is cached.

    ``progress(stage, fraction)`` reports the first-time fetch and conversion of the model.
    Raises ValueError (ModelLoadError is one) with a readable message on any bad setting.
    """
    resolve_model(None if settings.model == DEFAULT_MODEL else settings.model, progress)  # no-op once cached
    loaded = cached_model(settings.model)
    return LLMEngine(settings.engine_config(**overrides), loaded_model=loaded)


def workload_requests(rows: list[tuple[str, int]], temperature: float, seed: int, sharing: str = "none",
                      width: int = 4) -> list[tuple[list[dict], SamplingParams | BeamSearchParams]]:
    """Each (prompt, max_tokens) as a chat message and its parameters: one sequence, ``width`` parallel
    samples or a beam search of ``width`` beams (``sharing``); row ``i`` samples with ``seed + i``."""
    out = []
    for row, (prompt, max_tokens) in enumerate(rows):
        if sharing == "beam":
            params = BeamSearchParams(beam_width=width, max_tokens=max_tokens)
        else:
            n = width if sharing == "parallel" else 1
            params = SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed + row, n=n)
        out.append(([{"role": "user", "content": prompt}], params))
    return out


def add_workload(llm: LLMEngine, rows: list[tuple[str, int]], temperature: float, seed: int,
                 sharing: str = "none", width: int = 4, request_ids: list[int] | None = None,
                 accepted: list | None = None) -> list[tuple[int, str]]:
    """Queue :func:`workload_requests`; returns (row, error) for rejected rows. The accepted requests'
    ids are appended to ``request_ids`` and their (prompt, params) to ``accepted`` when given."""
    errors = []
    for row, (prompt, params) in enumerate(workload_requests(rows, temperature, seed, sharing, width)):
        try:
            request_id = llm.add_request(prompt, params)
            if request_ids is not None:
                request_ids.append(request_id)
            if accepted is not None:
                accepted.append((prompt, params))
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
    changed or ``force``. Returns (engine or None, list of error messages).

    Beside it in the session: ``attention`` (the runner's attention recorder, for the Kernel lab),
    ``request_ids`` (every request added, in order), ``engine_requests`` (the workload's accepted
    (prompt, params), in order: a student's engine beside this one gets the same) and ``chat_turns`` (a :class:`ChatTurns` in chat mode)."""
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
    ss["engine"], ss["attention"], ss["request_ids"], ss["engine_requests"] = llm, llm.runner.capture_attention(), [], []
    ss["chat_turns"] = ChatTurns(rows) if chat and rows else None
    first = rows[:1] if ss["chat_turns"] else rows
    ss["engine_errors"] = add_workload(llm, first, settings.temperature, settings.seed, settings.sharing, settings.sharing_width,
                                       ss["request_ids"], ss["engine_requests"])
    if ss["engine_errors"]:  # the first turn was rejected: no chat to continue
        ss["chat_turns"] = None
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


def add_next_chat_turn(llm: LLMEngine, chat: ChatTurns | None, settings: Settings) -> int | None:
    """Chat mode: once the turn being answered has finished, send the next one, as a chat client does:
    the earlier turns, the model's own answer, the new question. Its prompt is the finished turn's
    prompt and output token ids followed by the chat template's text after the answer, so the history
    (answer included) is token for token what was computed, and prefix caching finds its full blocks.
    Returns the new request id, or None (no chat, turn still running, or no turn left)."""
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
    return llm.prefix_cache_entries()
