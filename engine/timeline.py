"""A per-request timeline built from step reports: what each request did in every step, and its latencies.

One row per request, time across: it waits (and why: ``StepReport.waiting``), prefills (each chunk
of a chunked prompt is one step), decodes, is preempted (recompute or swap), waits swapped out, sits
in the running batch without being scheduled (stalled), and finishes. Marks: its arrival, its first
token, its end. Everything comes from the reports alone, so a live run, a saved run file
(``engine/runfile.py``), a classroom session and the simulator's recorded steps give the same timeline.

Time is the engine's clock (``StepReport.start_ms``, ms): for the engine its busy time (the sum of its
steps' durations, so a pause between Step clicks is not counted), for the simulator the simulated
clock. Reports without ``start_ms`` (older run files) are laid end to end by their ``timings_ms["total"]``.

Latencies are ``vllm bench serve``'s (``engine/tools/bench_serve.py``), with "sent" = the request's
arrival and a chunk = a step that gave it tokens:

- TTFT = end of the step that gave its first token - arrival;
- E2EL = end of the step in which it finished - arrival;
- TPOT = (E2EL - TTFT) / (output tokens - 1), for two tokens or more;
- ITL = the gaps between the ends of the steps that gave it tokens.

A chrome trace (:func:`chrome_trace`) writes the same spans in the Trace Event Format (one track per
request, one "X" slice per step), which ui.perfetto.dev and chrome://tracing open.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace

from engine.report import PREEMPT, PREEMPTED_BY_RECOMPUTE, PREEMPTED_BY_SWAP, WAIT_PREEMPTION, WAIT_QUEUE, StepReport

# A request's state in one step (Span.state).
WAITING = "waiting"  # in the waiting queue, not admitted (Span.reason says why)
PREFILL = "prefill"  # computing its prompt, or a chunk of it
DECODE = "decode"  # computing its newest token (with speculative decoding: verifying drafts too)
PREEMPTED = "preempted"  # evicted this step (Span.reason: recompute or swap)
SWAPPED = "swapped"  # waiting in the CPU pool, swapped out
STALLED = "stalled"  # admitted, holding its blocks, but not in this step's batch (the token budget went to others)
KV_TRANSFER = "kv_transfer"  # disaggregation: its prompt's KV is being read in, or its blocks are lent (Span.reason)
STATES = (WAITING, PREFILL, DECODE, PREEMPTED, SWAPPED, STALLED, KV_TRANSFER)


@dataclass(frozen=True)
class Span:
    """One request in one step.

    Attributes:
        request_id, step: the request and the step (``StepReport.step``).
        state: one of STATES.
        start_ms, end_ms: the step's start and end on the engine's clock (ms).
        batch_size: requests in the step's batch; step_tokens: tokens the whole step computed.
        num_tokens: tokens this request computed in the step (prefill chunk, or its decodes).
        reason: WAITING: a ``engine.report.WAIT_*`` code ("" in run files without it);
            PREEMPTED: the PREEMPT event's detail (recompute, swap, or why a swap recomputed);
            KV_TRANSFER: "loading" (decode instance) or "lent" (prefill instance).
        blocker: WAITING with WAIT_QUEUE: the head of the queue it waits behind; with
            WAIT_LPM_PASSED_OVER: the later arrival admitted before it (``StepReport.passed_over``); else None.
        blocker_cached: WAIT_LPM_PASSED_OVER: the prompt tokens the blocker found cached (``StepReport.admissions``).
        computed, prompt_tokens: PREFILL: the tokens with KV after the step and the tokens the
            whole (re)prefill computes, so a chunk is ``computed / prompt_tokens`` of the way.
        new_tokens: output tokens the step gave the request.
        rejected: speculative decoding: draft tokens given back (rejected) this step.
        largest_prefill, largest_prefill_tokens: the request with the step's largest prefill (or
            chunk) and its tokens; None when the step prefilled nothing.
    """

    request_id: int
    step: int
    state: str
    start_ms: float
    end_ms: float
    batch_size: int
    step_tokens: int
    num_tokens: int = 0
    reason: str = ""
    blocker: int | None = None
    blocker_cached: int = 0
    computed: int = 0
    prompt_tokens: int = 0
    new_tokens: int = 0
    rejected: int = 0
    largest_prefill: int | None = None
    largest_prefill_tokens: int = 0


@dataclass
class RequestTimeline:
    """One request's row and its latencies (ms on the engine's clock; None while unknown).

    Attributes:
        arrival_ms: when it was queued (``StepReport.arrived``), else the start of the first step
            that names it. arrival_step: that step.
        first_token_ms, first_token_step: end of the step that gave its first output token.
        end_ms, end_step: end of the step in which it finished; finish_reason: its reason.
        output_tokens: output tokens it was given (``StepReport.new_token_ids``).
        token_times_ms: end of each step that gave it tokens, in order.
        num_preemptions: times it was preempted.
        spans: one :class:`Span` per step it was known in, in step order.
    """

    request_id: int
    arrival_ms: float
    arrival_step: int
    first_token_ms: float | None = None
    first_token_step: int | None = None
    end_ms: float | None = None
    end_step: int | None = None
    finish_reason: str | None = None
    output_tokens: int = 0
    token_times_ms: list[float] = field(default_factory=list)
    num_preemptions: int = 0
    spans: list[Span] = field(default_factory=list)

    @property
    def ttft_ms(self) -> float | None:
        """Time to first token: first token - arrival (ms)."""
        return None if self.first_token_ms is None else self.first_token_ms - self.arrival_ms

    @property
    def e2el_ms(self) -> float | None:
        """End-to-end latency: finish - arrival (ms); None while running."""
        return None if self.end_ms is None else self.end_ms - self.arrival_ms

    @property
    def tpot_ms(self) -> float | None:
        """Time per output token after the first: (E2EL - TTFT) / (output tokens - 1) (ms);
        None while running or for one token."""
        if self.end_ms is None or self.first_token_ms is None or self.output_tokens < 2:
            return None
        return (self.e2el_ms - self.ttft_ms) / (self.output_tokens - 1)

    @property
    def itl_ms(self) -> list[float]:
        """Inter-token latencies: gaps between the steps that gave it tokens (ms)."""
        return [b - a for a, b in zip(self.token_times_ms, self.token_times_ms[1:])]

    @property
    def ttft_steps(self) -> int | None:
        """Steps from its arrival to its first token, both counted."""
        return None if self.first_token_step is None else self.first_token_step - self.arrival_step + 1


def step_times(reports: list[StepReport]) -> list[tuple[float, float]]:
    """(start, end) of each report on the engine's clock, ms: ``start_ms`` where the report has it,
    else right after the previous step; each lasts its ``timings_ms["total"]`` (0 when absent)."""
    times, clock = [], 0.0
    for report in reports:
        start = report.start_ms if report.start_ms is not None else clock
        clock = start + report.timings_ms.get("total", 0.0)
        times.append((start, clock))
    return times


def build_timeline(reports: list[StepReport]) -> list[RequestTimeline]:
    """Every request the reports name, by request id: its spans, marks and latencies.

    Args:
        reports: consecutive step reports, oldest first (a live run's, a run file's, a classroom
            session's, or the simulator's ``SimulationResult.step_reports``).

    Returns:
        One :class:`RequestTimeline` per request, sorted by request id.
    """
    rows: dict[int, RequestTimeline] = {}
    for report, (start, end) in zip(reports, step_times(reports)):
        for rid, ms in getattr(report, "arrived", {}).items():
            rows.setdefault(rid, RequestTimeline(rid, ms, report.step))
        for span in _spans(report, start, end, rows):
            row = rows.setdefault(span.request_id, RequestTimeline(span.request_id, start, report.step))
            row.spans.append(span)
            row.num_preemptions += span.state == PREEMPTED
        for rid, ids in report.new_token_ids.items():
            row = rows.setdefault(rid, RequestTimeline(rid, start, report.step))
            if ids:
                row.output_tokens += len(ids)
                row.token_times_ms.append(end)
                if row.first_token_ms is None:
                    row.first_token_ms, row.first_token_step = end, report.step
        for rid, reason in report.finished.items():
            row = rows.setdefault(rid, RequestTimeline(rid, start, report.step))
            row.end_ms, row.end_step, row.finish_reason = end, report.step, reason
    return [rows[rid] for rid in sorted(rows)]


def _spans(report: StepReport, start: float, end: float, rows: dict[int, RequestTimeline]) -> list[Span]:
    """Each request's span in one step."""
    prefills = [(s.num_tokens, s.request_id) for s in report.scheduled if s.phase == "prefill"]
    tokens, largest = max(prefills) if prefills else (0, None)
    base = dict(step=report.step, start_ms=start, end_ms=end, batch_size=len({s.request_id for s in report.scheduled}),
                step_tokens=report.num_tokens, largest_prefill=largest, largest_prefill_tokens=tokens)
    spans: dict[int, Span] = {}
    for s in report.scheduled:  # several sequences of one request: one span, their tokens summed
        old = spans.get(s.request_id)
        if s.phase == "prefill":
            spans[s.request_id] = Span(s.request_id, state=PREFILL, num_tokens=s.num_tokens + (old.num_tokens if old else 0),
                                       computed=s.num_computed_tokens, prompt_tokens=s.num_prefill_tokens, **base)
        elif old is None or old.state == DECODE:
            spans[s.request_id] = Span(s.request_id, state=DECODE, num_tokens=s.num_tokens + (old.num_tokens if old else 0), **base)
    for rid, span in spans.items():
        rejected = len(report.spec[rid].rejected) if rid in report.spec else 0
        spans[rid] = replace(span, new_tokens=len(report.new_token_ids.get(rid, ())), rejected=rejected)
    how = {e.request_id: e.detail for e in report.events if e.kind == PREEMPT}
    for rid in report.preempted:
        spans[rid] = Span(rid, state=PREEMPTED, reason=how.get(rid, PREEMPTED_BY_SWAP if rid in report.swapped_out else PREEMPTED_BY_RECOMPUTE), **base)
    waiting = getattr(report, "waiting", {})
    head = next((rid for rid, reason in waiting.items() if reason not in (WAIT_QUEUE, WAIT_PREEMPTION)), None)
    passed_over, cached = getattr(report, "passed_over", {}), {rid: hit for rid, _, hit in report.admissions or ()}
    for rid, reason in waiting.items():
        if rid not in spans:
            blocker = head if reason == WAIT_QUEUE else passed_over.get(rid)
            spans[rid] = Span(rid, state=WAITING, reason=reason, blocker=blocker, blocker_cached=cached.get(blocker, 0), **base)
    for rid in report.swapped:
        spans.setdefault(rid, Span(rid, state=SWAPPED, **base))
    for rid, what in getattr(report, "kv_transfers", {}).items():
        spans.setdefault(rid, Span(rid, state=KV_TRANSFER, reason=what, **base))
    live = {b.request_id for b in report.block_tables}
    for rid, row in rows.items():
        if rid in spans or rid in report.finished or row.end_ms is not None:
            continue
        if report.start_ms is not None:  # the report names every waiting request: the others known and unfinished are admitted
            if any(s.state in (PREFILL, DECODE, STALLED) for s in row.spans):
                spans[rid] = Span(rid, state=STALLED, **base)
        else:  # an older run file: live and not scheduled, or else waiting (for a reason it does not say)
            spans[rid] = Span(rid, state=STALLED if rid in live else WAITING, **base)
    return [spans[rid] for rid in sorted(spans)]


def latency_table(timelines: list[RequestTimeline]) -> list[dict]:
    """One row per request: request_id, arrival_ms, ttft_ms, tpot_ms, e2el_ms, output_tokens,
    ttft_steps, num_preemptions, finish_reason (None where not known yet)."""
    return [dict(request_id=r.request_id, arrival_ms=r.arrival_ms, ttft_ms=r.ttft_ms, tpot_ms=r.tpot_ms, e2el_ms=r.e2el_ms,
                 output_tokens=r.output_tokens, ttft_steps=r.ttft_steps, num_preemptions=r.num_preemptions,
                 finish_reason=r.finish_reason) for r in timelines]


# ---- Chrome / Perfetto trace --------------------------------------------------------------------

TRACE_PID = 1


def chrome_trace(reports: list[StepReport], name: str = "PagedAttention Lab", pid: int = TRACE_PID) -> dict:
    """The timeline in the Trace Event Format (Chrome's ``chrome://tracing``, ui.perfetto.dev).

    One process (``pid``, 1 by default, named ``name``); one thread (track) per request, tid = request id, named
    "request <id>" by "M" metadata events and sorted by id; one complete event ("X", ``ts`` and
    ``dur`` in µs) per request per step, named by its state (STATES), with the step, its batch and
    tokens, and the reason it waited in ``args``; instant events ("i", thread scope) for its arrival,
    first token and finish.

    Returns:
        ``{"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}``, ready for ``json.dump``.
    """
    events: list[dict] = [{"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": name}},
                          {"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": pid}}]
    for row in build_timeline(reports):
        tid = row.request_id
        events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": f"request {tid}"}})
        events.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
        for span in row.spans:
            events.append({"name": span.state, "cat": "request", "ph": "X", "pid": pid, "tid": tid,
                           "ts": _us(span.start_ms), "dur": _us(span.end_ms - span.start_ms), "args": _span_args(span)})
        for mark, ms in (("arrival", row.arrival_ms), ("first token", row.first_token_ms), ("finished", row.end_ms)):
            if ms is not None:
                events.append({"name": mark, "cat": "request", "ph": "i", "s": "t", "pid": pid, "tid": tid, "ts": _us(ms)})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"source": name, "clock": "the engine's busy time (simulated time for the simulator)"}}


def chrome_trace_json(reports: list[StepReport], name: str = "PagedAttention Lab") -> str:
    """:func:`chrome_trace` of ``reports`` as JSON text. Strict JSON: trace viewers cannot open
    ``Infinity`` or ``NaN``, so a time that is not finite raises ValueError rather than being
    written (run files bound their times, engine/runfile.py's MAX_TIME_MS)."""
    return json.dumps(chrome_trace(reports, name), allow_nan=False)


def disagg_chrome_trace(instances: list[tuple[str, list[StepReport]]]) -> dict:
    """Prefill/decode disaggregation: several engines' timelines in one trace, one process track per
    engine (pid 1, 2, ... in order, each named), on the wall clock (``StepReport.wall_start_ms``,
    which engines with a KV connector record), 0 at the earliest step. A handover shows as a
    ``kv_transfer`` slice on both tracks: "lent" on the prefill instance's request (in the steps it
    took while the blocks were held), "loading" on the decode instance's while its KV is read in.

    Raises:
        ValueError: a report without ``wall_start_ms`` (an engine without a KV connector).
    """
    if any(r.wall_start_ms is None for _, reports in instances for r in reports):
        raise ValueError("disagg_chrome_trace needs StepReport.wall_start_ms: reports of engines with a kv_transfer_config")
    t0 = min((r.wall_start_ms for _, reports in instances for r in reports), default=0.0)
    events: list[dict] = []
    for pid, (name, reports) in enumerate(instances, start=1):
        on_wall = [replace(r, start_ms=r.wall_start_ms - t0, arrived={rid: r.wall_start_ms - t0 for rid in r.arrived}) for r in reports]
        events += chrome_trace(on_wall, name, pid)["traceEvents"]
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"source": "prefill/decode disaggregation", "clock": "wall clock"}}


def write_chrome_trace(reports: list[StepReport], path: str, name: str = "PagedAttention Lab") -> None:
    """Write :func:`chrome_trace_json` of ``reports`` to ``path`` (UTF-8). Raises OSError when the
    file cannot be written."""
    text = chrome_trace_json(reports, name)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def _us(ms: float) -> float:
    return round(ms * 1000.0, 3)


def _span_args(span: Span) -> dict:
    args = {"step": span.step, "batch_size": span.batch_size, "step_tokens": span.step_tokens}
    if span.num_tokens:
        args["num_tokens"] = span.num_tokens
    if span.state == PREFILL:
        args["computed"] = f"{span.computed}/{span.prompt_tokens}"
    if span.new_tokens:
        args["new_tokens"] = span.new_tokens
    if span.rejected:
        args["rejected_drafts"] = span.rejected
    if span.reason:
        args["reason"] = span.reason
    if span.blocker is not None:
        args["behind_request"] = span.blocker
    if span.largest_prefill is not None and span.largest_prefill != span.request_id:
        n = span.largest_prefill_tokens
        args["largest_prefill"] = f"request {span.largest_prefill}: {n} token{'' if n == 1 else 's'}"
    return args
