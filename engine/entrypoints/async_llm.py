"""The engine inside an asyncio server: requests join at any step, one loop steps while there is work
(vLLM's ``AsyncLLM``, its ``output_handler`` loop and per-request output queues).

The :class:`~engine.LLMEngine` is not thread-safe, so it lives on one worker thread of its own: every
call into it (add, abort, step) runs there, one at a time, and the event loop only waits for them.
The event loop so stays free to accept requests and stream text while a step computes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable, Protocol

from engine.llm_engine import LLMEngine
from engine.core.prefix_cache import PrefixCacheStats
from engine.report import RequestOutput, StepReport
from engine.sampling_params import SamplingParams

logger = logging.getLogger("engine.serve")


class EngineStopping(RuntimeError):
    """The engine is shutting down and takes no new request (HTTP 503)."""


@dataclass
class RequestDelta:
    """What one engine step gave one request (vLLM's ``RequestOutputKind.DELTA``).

    Attributes:
        texts: choice index (the sample index, 0..n-1) -> the text that step added to that choice,
            a true delta: joining a choice's texts over all deltas gives its final text.
        num_new_tokens: tokens the step added over all the request's sequences.
        finish_reasons: choice index -> finish reason ("stop", "length", "abort", "error") of the
            choices that finished this step.
        token_ids: choice index -> the token ids that step added to that choice (vLLM's
            ``return_token_ids`` stream deltas).
        output: the request's final :class:`~engine.RequestOutput`, in its last delta; else None.
        error: the request failed ("TypeError: ..."): its own part of a step, or the whole step; else None.
    """

    texts: dict[int, str] = field(default_factory=dict)
    num_new_tokens: int = 0
    finish_reasons: dict[int, str] = field(default_factory=dict)
    output: RequestOutput | None = None
    error: str | None = None
    aborted: bool = False
    token_ids: dict[int, list[int]] = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        """The last delta of its request: it finished, failed or was aborted."""
        return self.output is not None or self.error is not None or self.aborted


@dataclass(frozen=True)
class EngineSnapshot:
    """The scheduler's queues and the KV pool after a step, for the server's metrics.

    Attributes:
        num_running, num_waiting, num_swapped: requests in each scheduler queue.
        kv_cache_usage: share of the KV pool's slots not free, 0..1 (vLLM's ``kv_cache_usage_perc``,
            also a fraction; free blocks that still hold cached prefixes count as free).
        num_free_blocks, num_blocks: free and usable blocks of the KV pool.
        num_preemptions: requests preempted in this step (recompute or swap, paper §4.5).
        prefix_cache: the engine-wide prefix-cache counters (None with prefix caching off).
    """

    num_running: int
    num_waiting: int
    num_swapped: int
    kv_cache_usage: float
    num_free_blocks: int
    num_blocks: int
    num_preemptions: int = 0
    prefix_cache: PrefixCacheStats | None = None


class StatLogger(Protocol):
    """Where the loop reports what it saw (the server's Prometheus metrics; vLLM's ``StatLoggerBase``)."""

    def record_step(self, snapshot: EngineSnapshot) -> None: ...

    def record_first_token(self, seconds: float) -> None: ...

    def record_inter_token(self, seconds: float) -> None: ...

    def record_finished(self, reason: str, e2e_seconds: float, num_prompt_tokens: int, num_generation_tokens: int, client: str) -> None: ...


@dataclass
class _RequestState:
    queue: asyncio.Queue
    client: str
    num_prompt_tokens: int
    arrival: float  # time.monotonic(), s
    first_token: float | None = None
    last_token: float | None = None
    num_generation_tokens: int = 0


@dataclass
class _StepResult:
    report: StepReport | None
    deltas: dict[int, RequestDelta]
    snapshot: EngineSnapshot
    error: str | None = None
    failed: list[int] = field(default_factory=list)


class AsyncLLM:
    """An :class:`~engine.LLMEngine` stepped by a background loop while requests come and go.

    Args:
        engine: the engine; from then on only this object's worker thread touches it.
        stat_logger: optional :class:`StatLogger` fed after every step and request.

    Use: ``await start()``; per request ``request_id = await add_request(ids, params)``, then
    ``async for delta in stream(request_id)``; leaving the stream early aborts the request (its
    blocks are freed in the loop's next turn, which reports the abort event). ``await shutdown()``
    aborts what still runs and stops the loop.
    """

    def __init__(self, engine: LLMEngine, stat_logger: StatLogger | None = None):
        self.engine = engine
        self.stat_logger = stat_logger
        self.step_callbacks: list[Callable[[StepReport], None]] = []  # called on the event loop after each step
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine")
        self._states: dict[int, _RequestState] = {}  # requests in the engine
        self._unclaimed: dict[int, _RequestState] = {}  # added, their stream() not yet started
        self._aborts: list[int] = []
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._stopping = False
        self.num_aborted = 0
        self.num_finished = 0

    @property
    def num_requests(self) -> int:
        """Requests accepted and not yet finished, failed or aborted."""
        return len(self._states)

    @property
    def stopping(self) -> bool:
        """Shutting down: no new request is taken."""
        return self._stopping

    async def start(self) -> None:
        """Start the loop on the running event loop."""
        self._wake = asyncio.Event()
        self._task = asyncio.create_task(self._run(), name="engine-loop")

    async def _call(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def add_request(self, prompt_token_ids: list[int], params: SamplingParams, client: str = "") -> int:
        """Queue a request at the engine's next step; returns its request_id.

        Raises:
            ValueError: the engine refused it (e.g. its n samples could never fit in the KV pool).
            EngineStopping: the server is shutting down.
        """
        if self._stopping:
            raise EngineStopping("the server is shutting down")
        state = _RequestState(asyncio.Queue(), client, len(prompt_token_ids), time.monotonic())

        def add() -> int:
            request_id = self.engine.add_request(prompt_token_ids, params)
            self._states[request_id] = state  # before any step can report it
            self._unclaimed[request_id] = state  # until stream() takes it, however fast the request ends
            return request_id

        request_id = await self._call(add)
        self._wake.set()
        return request_id

    async def stream(self, request_id: int) -> AsyncIterator[RequestDelta]:
        """The request's deltas, one per step that gave it text, until its final one
        (``delta.finished``). Leaving early (break, cancellation, a closed client) aborts it."""
        state = self._unclaimed.pop(request_id, None)
        if state is None:
            raise KeyError(f"request {request_id}: unknown, aborted, or already streamed")
        finished = False
        try:
            while not finished:
                delta = await state.queue.get()
                finished = delta.finished
                yield delta
        finally:
            if not finished:
                self.abort(request_id)

    def abort(self, request_id: int) -> None:
        """Abort a request at the loop's next turn: the engine frees its blocks (finish reason
        "abort") and the step after reports it. Safe to call twice or after it finished."""
        state = self._states.pop(request_id, None)
        if state is None:
            return
        self._aborts.append(request_id)
        self.num_aborted += 1
        state.queue.put_nowait(RequestDelta(aborted=True))
        if self.stat_logger:
            self.stat_logger.record_finished("abort", time.monotonic() - state.arrival, state.num_prompt_tokens,
                                             state.num_generation_tokens, state.client)
        self._wake.set()

    async def drain(self, timeout_s: float) -> int:
        """Take no new request, give the running ones up to ``timeout_s`` seconds to finish, then
        abort the rest (their streams end with an abort); returns how many were aborted."""
        self._stopping = True
        deadline = time.monotonic() + timeout_s
        while self._states and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        left = list(self._states)
        for request_id in left:
            self.abort(request_id)
        return len(left)

    async def shutdown(self) -> dict:
        """Abort every request still running, step once so that the engine frees and reports them,
        stop the loop and the worker thread.

        Returns:
            ``{"finished": requests that completed, "aborted": requests aborted (by their clients
            or now), "aborted_at_shutdown": of those, aborted now, "num_free_blocks", "num_blocks"}``.
        """
        self._stopping = True
        running = list(self._states)
        for request_id in running:
            self.abort(request_id)
        self._wake.set()
        if self._task is not None:
            await self._task
        snapshot = await self._call(self._snapshot, None)
        self._executor.shutdown(wait=True)
        return {"finished": self.num_finished, "aborted": self.num_aborted, "aborted_at_shutdown": len(running),
                "num_free_blocks": snapshot.num_free_blocks, "num_blocks": snapshot.num_blocks}

    # ---- the loop -----------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            if not self._states and not self._aborts:
                if self._stopping:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            try:
                self._dispatch(await self._call(self._step))
            except Exception as error:  # never leave a request waiting on a loop that died
                logger.exception("the engine loop failed; failing every request")
                self._fail_all(f"{type(error).__name__}: {error}")

    def _fail_all(self, error: str) -> None:
        for request_id, state in list(self._states.items()):
            del self._states[request_id]
            self._aborts.append(request_id)  # the next turn frees its blocks
            state.queue.put_nowait(RequestDelta(error=f"the engine loop failed: {error}"))

    def _step(self) -> _StepResult:
        """On the engine thread: apply pending aborts, run one step if there is work, and turn the
        report into per-request deltas (final outputs taken from the engine)."""
        engine = self.engine
        aborted = False
        while self._aborts:
            request_id = self._aborts.pop(0)
            if request_id in engine.requests:
                engine.abort_request(request_id)
                engine.take_output(request_id)
                aborted = True
        if not engine.has_unfinished_requests() and not aborted:
            return _StepResult(None, {}, self._snapshot(None))
        try:
            report = engine.step()
        except Exception as error:  # the engine put the batch back; fail every request rather than retry forever
            logger.exception("engine step failed; failing every request in the engine")
            failed = [rid for rid in list(engine.requests)]
            for request_id in failed:
                engine.abort_request(request_id)
                engine.take_output(request_id)
            return _StepResult(None, {}, self._snapshot(None), f"{type(error).__name__}: {error}", failed)
        deltas: dict[int, RequestDelta] = {}
        touched = set(report.seq_new_text) | set(report.seq_finished) | set(report.finished)
        for request_id in touched:
            request = engine.requests.get(request_id)
            if request is None:
                continue
            index_of = {seq.seq_id: seq.index for seq in request.seqs}
            last_token = {seq.seq_id: seq.token_ids[-1] for seq in request.seqs if seq.token_ids}
            texts = report.seq_new_text.get(request_id, {})
            delta = RequestDelta(
                texts={index_of[sid]: text for sid, text in texts.items()},
                num_new_tokens=len(texts),
                finish_reasons={index_of[sid]: reason for sid, reason in report.seq_finished.get(request_id, {}).items()},
                token_ids={index_of[sid]: [last_token[sid]] for sid in texts},  # one new token per sequence per step
            )
            if request_id in report.finished:
                delta.output = engine.take_output(request_id)
                delta.error = delta.output.error
                for completion in delta.output.outputs:
                    delta.finish_reasons.setdefault(completion.index, completion.finish_reason)
            deltas[request_id] = delta
        return _StepResult(report, deltas, self._snapshot(report))

    def _snapshot(self, report: StepReport | None) -> EngineSnapshot:
        engine = self.engine
        memory = report.memory if report is not None else engine.memory_usage()
        block_size = engine.config.block_size
        return EngineSnapshot(
            num_running=len(engine.scheduler.running), num_waiting=len(engine.scheduler.waiting),
            num_swapped=len(engine.scheduler.swapped),
            kv_cache_usage=1 - memory.free / memory.capacity if memory.capacity else 0.0,
            num_free_blocks=memory.free // block_size, num_blocks=memory.capacity // block_size,
            num_preemptions=len(report.preempted) if report is not None else 0,
            prefix_cache=engine.prefix_cache_stats(),
        )

    def _dispatch(self, result: _StepResult) -> None:
        """On the event loop: hand each request its delta, time its tokens, count what finished."""
        now = time.monotonic()
        for request_id, delta in result.deltas.items():
            state = self._states.get(request_id)
            if state is None:
                continue  # aborted while the step ran
            if delta.num_new_tokens:
                self._time_tokens(state, now, delta.num_new_tokens)
            if delta.finished:
                del self._states[request_id]
                self.num_finished += 1
                if self.stat_logger:
                    reason = delta.output.finish_reason if delta.output else "error"
                    self.stat_logger.record_finished(reason, now - state.arrival, state.num_prompt_tokens,
                                                     state.num_generation_tokens, state.client)
            state.queue.put_nowait(delta)
        for request_id in result.failed:
            state = self._states.pop(request_id, None)
            if state is not None:
                state.queue.put_nowait(RequestDelta(error=f"the engine step failed: {result.error}"))
                if self.stat_logger:
                    self.stat_logger.record_finished("error", now - state.arrival, state.num_prompt_tokens,
                                                     state.num_generation_tokens, state.client)
        if self.stat_logger:
            self.stat_logger.record_step(result.snapshot)
        if result.report is not None:
            for callback in self.step_callbacks:
                callback(result.report)

    def _time_tokens(self, state: _RequestState, now: float, num_tokens: int) -> None:
        state.num_generation_tokens += num_tokens
        if self.stat_logger is None:
            pass
        elif state.first_token is None:
            self.stat_logger.record_first_token(now - state.arrival)
        else:
            self.stat_logger.record_inter_token(now - state.last_token)
        if state.first_token is None:
            state.first_token = now
        state.last_token = now
