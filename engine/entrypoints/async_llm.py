"""The engine inside an asyncio server: requests join at any step, one loop steps while there is work
(vLLM's ``AsyncLLM``, its ``output_handler`` loop and per-request output queues).

The :class:`~engine.LLMEngine` is not thread-safe, so it lives on one worker thread of its own: every
call into it (add, abort, step) runs there, one at a time, and the event loop only waits for them.
The event loop so stays free to accept requests and stream text while a step computes.

Build the engine on that thread too (:meth:`AsyncLLM.from_config`, what ``python -m engine serve``
does). torch's CPU kernels run on OpenMP, and OpenMP keeps one pool of worker threads per thread that
starts parallel work. An engine loaded on the main thread and stepped on the worker leaves two pools,
more OpenMP threads than cores on a small machine; libgomp then lets its workers spin only briefly
and puts them to sleep between parallel regions, and each of the hundreds of regions in a step pays
a wake-up. On the 2-core machine of the README that made every step of the server 1.4-1.6x slower
than the same step offline (a 128-token prefill 230 against 160 ms, a decode step 32 against 20 ms).

For a class, the loop can be paced (:meth:`AsyncLLM.set_pace`, :meth:`AsyncLLM.step_once`; the lab
endpoints in engine/entrypoints/lab.py): in step mode it runs one step per Step, in run mode it steps
while there is work, at full speed or at most so many steps a second.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable, Protocol

from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.output_processor import RequestDelta
from engine.core.prefix_cache import PrefixCacheStats
from engine.report import StepReport
from engine.sampling_params import SamplingParams

logger = logging.getLogger("engine.serve")

STEP_MODE = "step"  # the loop steps only when told to (a class discusses each step)
RUN_MODE = "run"  # the loop steps while there is work, at full speed or capped
PACE_MODES = (STEP_MODE, RUN_MODE)
MIN_STEPS_PER_S = 0.1  # run mode's slowest cap: a step every 10 s (slower would look like a frozen engine)
MAX_STEPS_PER_S = 1000.0


def check_steps_per_s(value, name: str = "max_steps_per_s") -> float:
    """Run mode's speed cap, checked: a number of steps a second in [MIN_STEPS_PER_S, MAX_STEPS_PER_S].

    Raises:
        ValueError: naming ``name`` and the range.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not MIN_STEPS_PER_S <= value <= MAX_STEPS_PER_S:
        raise ValueError(f"{name} must be a number of steps a second from {MIN_STEPS_PER_S:g} to {MAX_STEPS_PER_S:g}, "
                         f"or null (full speed), got {value!r}")
    return float(value)


class EngineStopping(RuntimeError):
    """The engine is shutting down and takes no new request (HTTP 503)."""


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


def engine_thread() -> ThreadPoolExecutor:
    """The single worker thread an :class:`AsyncLLM` builds and steps its engine on."""
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine")


class AsyncLLM:
    """An :class:`~engine.LLMEngine` stepped by a background loop while requests come and go.

    Args:
        engine: the engine; from then on only this object's worker thread touches it.
        stat_logger: optional :class:`StatLogger` fed after every step and request.
        executor: the one-thread executor to step it on (:func:`engine_thread`); None: a new one.
            Pass the thread the engine was built on (see the module's docstring, and :meth:`from_config`).

    Use: ``await start()``; per request ``request_id = await add_request(ids, params)``, then
    ``async for delta in stream(request_id)``; leaving the stream early aborts the request (its
    blocks are freed in the loop's next turn, which reports the abort event). ``await shutdown()``
    aborts what still runs and stops the loop.
    """

    def __init__(self, engine: LLMEngine, stat_logger: StatLogger | None = None, executor: ThreadPoolExecutor | None = None):
        self.engine = engine
        self.stat_logger = stat_logger
        self.step_callbacks: list[Callable[[StepReport], None]] = []  # called on the event loop after each step
        self._executor = executor or engine_thread()
        self._states: dict[int, _RequestState] = {}  # requests in the engine
        self._unclaimed: dict[int, _RequestState] = {}  # added, their stream() not yet started
        self._aborts: list[int] = []
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._stopping = False
        self.num_aborted = 0
        self.num_finished = 0
        self._init_pacing()

    @classmethod
    def from_config(cls, config: EngineConfig, stat_logger: StatLogger | None = None) -> AsyncLLM:
        """Build the :class:`~engine.LLMEngine` on the worker thread that will step it (see the module's
        docstring for why), and wrap it.

        Raises:
            ValueError: a bad config (as ``LLMEngine``); the worker thread is stopped first.
        """
        executor = engine_thread()
        try:
            engine = executor.submit(LLMEngine, config).result()
        except BaseException:
            executor.shutdown(wait=False)
            raise
        return cls(engine, stat_logger, executor)

    @property
    def num_requests(self) -> int:
        """Requests accepted and not yet finished, failed or aborted."""
        return len(self._states)

    @property
    def stopping(self) -> bool:
        """Shutting down: no new request is taken."""
        return self._stopping

    async def start(self) -> None:
        """Start the loop on the running event loop. The stat logger gets the pool's state at once,
        not only after the first step."""
        self._wake = asyncio.Event()
        if self.stat_logger:
            self.stat_logger.record_step(await self._call(self._snapshot, None))
        self._task = asyncio.create_task(self._run(), name="engine-loop")

    async def _call(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def add_request(self, prompt_token_ids: list[int], params: SamplingParams, client: str = "",
                          kv_transfer_params: dict | None = None) -> int:
        """Queue a request at the engine's next step; returns its request_id (``kv_transfer_params``:
        see :meth:`LLMEngine.add_request <engine.LLMEngine.add_request>`).

        Raises:
            ValueError: the engine refused it (e.g. its n samples could never fit in the KV pool).
            EngineStopping: the server is shutting down.
        """
        if self._stopping:
            raise EngineStopping("the server is shutting down")
        state = _RequestState(asyncio.Queue(), client, len(prompt_token_ids), time.monotonic())

        def add() -> int:
            request_id = self.engine.add_request(prompt_token_ids, params, kv_transfer_params=kv_transfer_params)
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
        self._open_gate()  # the running requests get their time to finish even in step mode
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
        self._open_gate()  # a server stopping in step mode still frees what runs
        running = list(self._states)
        for request_id in running:
            self.abort(request_id)
        self._wake.set()
        if self._task is not None:
            await self._task
        snapshot = await self._call(self._snapshot, None)
        await self._call(self.engine.shutdown_kv_connector)  # its threads stopped, its shared memory unlinked
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
                await self._pace_gate()  # classroom pacing: step mode waits for a Step, run mode may be capped
                if not self._states and not self._aborts:
                    self._paced_step_done(None)  # everything ended while the gate was closed: no step
                    continue
                result = await self._call(self._step)
                self._dispatch(result)
                self._paced_step_done(result)
            except Exception as error:  # never leave a request waiting on a loop that died
                logger.exception("the engine loop failed; failing every request")
                self._fail_all(f"{type(error).__name__}: {error}")
                self._paced_step_done(None)

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
        deltas = engine.output_processor.stream_deltas(report)  # finished requests' outputs taken
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

    # ---- classroom pacing: step mode and run mode (the lab endpoints' control) ------------------
    # Kept apart from the loop above: the loop only calls _pace_gate before a step and
    # _paced_step_done after it.

    def _init_pacing(self) -> None:
        self.pace_mode = RUN_MODE
        self.max_steps_per_s: float | None = None
        self._permit: asyncio.Event | None = None  # step mode: set by step_once, taken by one step
        self._step_done: asyncio.Future | None = None  # step mode: what step_once waits for
        self._step_lock: asyncio.Lock | None = None
        self._last_step_at = 0.0  # time.monotonic() of the last step's start, for the speed cap
        self._in_step = False  # past the gate, its step not yet dispatched

    def set_pace(self, mode: str, max_steps_per_s: float | None = None) -> None:
        """Step mode (the loop runs a step only when :meth:`step_once` asks) or run mode (it steps
        while there is work, at most ``max_steps_per_s`` steps a second; None = full speed).

        Raises:
            ValueError: an unknown mode, or a cap outside [MIN_STEPS_PER_S, MAX_STEPS_PER_S].
        """
        if mode not in PACE_MODES:
            raise ValueError(f"mode must be one of {', '.join(PACE_MODES)}, got {mode!r}")
        if max_steps_per_s is not None:
            check_steps_per_s(max_steps_per_s)
        self.pace_mode = mode
        self.max_steps_per_s = float(max_steps_per_s) if max_steps_per_s is not None and mode == RUN_MODE else None
        if self._permit is None:
            self._permit = asyncio.Event()
        if mode == RUN_MODE:
            self._permit.set()  # a loop waiting in step mode goes on
        else:
            self._permit.clear()  # no step until step_once asks for one
        if self._wake is not None:
            self._wake.set()

    @property
    def has_work(self) -> bool:
        """A request waits, runs, or has an abort for the engine to apply: a step would do something."""
        return bool(self._states or self._aborts)

    async def step_once(self, timeout_s: float = 60.0) -> StepReport | None:
        """Step mode: let the loop run exactly one engine step and return its report (None when no
        request waits or runs, so nothing was stepped). Called in run mode it switches to step mode
        first. Calls are served one at a time, one step each.

        Raises:
            EngineStopping: the server is shutting down.
            TimeoutError: the step did not end within ``timeout_s`` seconds.
        """
        if self._stopping:
            raise EngineStopping("the server is shutting down")
        if self._step_lock is None:
            self._step_lock = asyncio.Lock()
        async with self._step_lock:
            if self.pace_mode != STEP_MODE:
                self.set_pace(STEP_MODE)
            while self._in_step:  # a step begun in run mode ends first; the Step is the one after it
                await asyncio.sleep(0.005)
            if not self.has_work:
                return None
            done = asyncio.get_running_loop().create_future()
            self._step_done = done
            self._permit.set()
            self._wake.set()
            try:
                return await asyncio.wait_for(done, timeout_s)
            finally:
                self._step_done = None

    async def _pace_gate(self) -> None:
        """Before each step: step mode waits for a permit (one step per :meth:`step_once`); run mode
        with a cap waits until 1 / max_steps_per_s seconds have passed since the last step began."""
        if self._permit is None:
            self._permit = asyncio.Event()
        while not self._stopping:
            if self.pace_mode == STEP_MODE:
                if self._permit.is_set():
                    self._permit.clear()  # this step takes the permit
                    break
                await self._permit.wait()  # step_once, a switch to run mode, or shutdown
                continue
            wait = self._last_step_at + 1.0 / self.max_steps_per_s - time.monotonic() if self.max_steps_per_s else 0.0
            if wait <= 0:
                break
            self._wake.clear()
            try:  # a change of pace (set_pace sets _wake) ends the wait early; the loop checks again
                await asyncio.wait_for(self._wake.wait(), wait)
            except asyncio.TimeoutError:
                pass
        self._last_step_at = time.monotonic()
        self._in_step = True

    async def run_on_engine(self, fn, *args):
        """``fn(*args)`` on the engine's thread, between steps (a read of the scheduler's queues)."""
        return await self._call(fn, *args)

    def _open_gate(self) -> None:
        if self._permit is not None:
            self._permit.set()

    def _paced_step_done(self, result: _StepResult | None) -> None:
        """After each step: the :meth:`step_once` waiting for it gets its report (None: no step ran)."""
        self._in_step = False
        done = self._step_done
        if done is not None and not done.done():
            done.set_result(result.report if result is not None else None)
