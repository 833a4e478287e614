"""The CPU swap space beside the GPU pool, the blocks swapped in one step, the three queues, and the
progress of chunked prefills, drawn from one :class:`StepReport`.

Swap preemption (paper §4.5): a preempted request's blocks are copied to a second pool of the same
layout in CPU memory (``blocks_to_swap_out``: ``(gpu_block, cpu_block)`` pairs) and back later
(``blocks_to_swap_in``: ``(cpu_block, gpu_block)``). Chunked prefill (vLLM's
``enable_chunked_prefill``): a prompt longer than the step's token budget is computed over several
steps; ``ScheduledRequest.num_computed_tokens / num_prefill_tokens`` is its progress.

Data first (``swap_marks``, ``cpu_pool_blocks``, ``queues``, ``prefill_progress``: plain dicts and
lists the app, the lessons and the tests read), then the Vega-Lite specs built on
:func:`visualize.pool.pool_map_spec`.
"""

from __future__ import annotations

import dataclasses

from engine.report import StepReport
from visualize.i18n import t
from visualize.pool import pool_blocks, pool_map_spec

SWAP_OUT_COLOR = "#6a3d9a"  # a block copied GPU -> CPU this step (both ends of the copy)
SWAP_IN_COLOR = "#00897b"  # a block copied CPU -> GPU this step (both ends of the copy)
SWAP_COLORS = {"out": SWAP_OUT_COLOR, "in": SWAP_IN_COLOR}
SWAP_DASHES = {"out": [6, 3], "in": [1, 0]}  # swapped out: dashed; swapped in: solid


def swap_marks(report: StepReport) -> dict[str, dict[int, tuple[str, int]]]:
    """The step's swap copies, keyed by side and block: ``{"gpu": {block: (direction, other block)},
    "cpu": {...}}`` with direction "out" (GPU -> CPU) or "in" (CPU -> GPU) and the block at the other
    end of the copy. A GPU block swapped out may be handed out again in the same step; it is marked
    all the same (its old KV left for the CPU block named)."""
    gpu: dict[int, tuple[str, int]] = {}
    cpu: dict[int, tuple[str, int]] = {}
    for g, c in report.blocks_to_swap_out:
        gpu[g], cpu[c] = ("out", c), ("out", g)
    for c, g in report.blocks_to_swap_in:
        gpu[g], cpu[c] = ("in", c), ("in", g)
    return {"gpu": gpu, "cpu": cpu}


def cpu_report(report: StepReport) -> StepReport | None:
    """The CPU swap space as a report of its own (its memory, the swapped requests' block tables in
    CPU block ids, no events, no prefix cache: the CPU pool caches nothing, so its map has no cache
    marks or their legend), so that the GPU pool's drawing draws it; None without a swap space."""
    if report.cpu_memory is None:
        return None
    return dataclasses.replace(report, memory=report.cpu_memory, block_tables=report.cpu_block_tables, events=[],
                               free_queue=[], cached_free={}, prefix_cache=None)


def cpu_pool_blocks(report: StepReport, block_size: int, columns: int = 16) -> list[dict]:
    """One row per CPU block after the step (the keys of :func:`visualize.pool.pool_blocks`), plus
    ``swap`` ("out" / "in" / None: copied this step, and which way) and ``partner`` (the GPU block at
    the other end of that copy). Empty without a swap space."""
    cpu = cpu_report(report)
    if cpu is None:
        return []
    marks = swap_marks(report)["cpu"]
    return [{**b, "swap": marks.get(b["block"], (None, None))[0], "partner": marks.get(b["block"], (None, None))[1]}
            for b in pool_blocks(cpu, block_size, columns)]


def _swap_text(direction: str | None, partner: int | None, side: str, lang: str) -> str:
    if direction is None:
        return ""
    return t(f"swap_{side}_{direction}", lang, block=partner)


def add_swap_marks(spec: dict, marks: dict[int, tuple[str, int]], side: str, lang: str = "en") -> dict:
    """``spec`` (a :func:`~visualize.pool.pool_map_spec`) with the blocks in ``marks`` (one side of
    :func:`swap_marks`; side "gpu" or "cpu") outlined in the swap colours, dashed for a swap-out, and
    a tooltip line naming the other end of the copy. Changes and returns ``spec``."""
    for record in spec["data"]["values"]:
        direction, partner = marks.get(record["block"], (None, None))
        record["swap"] = direction or ""
        record["swap_text"] = _swap_text(direction, partner, side, lang)
    entry = {"field": "swap_text", "type": "nominal", "title": t("swap_tooltip", lang)}
    for layer in spec["layer"]:
        tooltip = layer.get("encoding", {}).get("tooltip")
        if tooltip is not None and entry not in tooltip:
            tooltip.append(entry)
    box = {key: spec["layer"][0]["encoding"][key] for key in ("x", "x2", "y", "y2")}
    for direction in ("out", "in"):  # a layer each, with its own colour and dash (no shared scale to mix them up)
        spec["layer"].insert(-1, {  # under the block numbers
            "transform": [{"filter": f"datum.swap == '{direction}'"}],
            "mark": {"type": "rect", "fillOpacity": 0, "strokeWidth": 3.5, "stroke": SWAP_COLORS[direction],
                     "strokeDash": SWAP_DASHES[direction]},
            "encoding": {**box, "tooltip": spec["layer"][0]["encoding"]["tooltip"]},
        })
    return spec


def gpu_swap_spec(spec: dict, report: StepReport, lang: str = "en") -> dict:
    """The GPU pool map ``spec`` with this step's swapped blocks marked (unchanged when none were).

    A block swapped out and handed to another request in the same step is drawn in its new owner's
    colour inside the swap-out outline; its tooltip names both: whose KV went to which CPU block, and
    that the block was then given to the request it now shows."""
    marks = swap_marks(report)["gpu"]
    if not marks:
        return spec
    spec = add_swap_marks(spec, marks, "gpu", lang)
    swapped_owner = {c: snap.request_id for snap in report.cpu_block_tables for c in snap.block_table}
    holder = {b: snap.request_id for snap in report.block_tables for b in snap.block_table}
    for record in spec["data"]["values"]:
        direction, partner = marks.get(record["block"], (None, None))
        if direction == "out" and record["block"] in holder and partner in swapped_owner:
            record["swap_text"] = t("swap_gpu_out_reused", lang, block=partner, old=swapped_owner[partner],
                                    new=holder[record["block"]])
    return spec


def cpu_pool_map_spec(report: StepReport, block_size: int, lang: str = "en", columns: int = 16) -> dict | None:
    """The CPU swap space drawn like the GPU pool (a cell per CPU block in its swapped request's
    colour), this step's copies outlined; None without a swap space."""
    cpu = cpu_report(report)
    if cpu is None:
        return None
    spec = pool_map_spec(cpu, block_size, lang, columns)
    spec["description"] = t("cpu_pool", lang)  # not a title: Streamlit then squeezed the map into a thin line
    return add_swap_marks(spec, swap_marks(report)["cpu"], "cpu", lang)


def queues(report: StepReport, request_ids: list[int], finished: set[int] | frozenset = frozenset()) -> dict[str, list[int]]:
    """The scheduler's three queues after the step (paper §4.5): running (holding GPU blocks),
    swapped (their KV in the CPU pool) and waiting (every other unfinished request of
    ``request_ids``), each as sorted request ids."""
    running = sorted({s.request_id for s in report.block_tables})
    swapped = sorted(set(report.swapped))
    done = set(finished) | set(report.finished)
    waiting = sorted(set(request_ids) - set(running) - set(swapped) - done)
    return {"waiting": waiting, "running": running, "swapped": swapped}


def prefill_progress(report: StepReport, previous: StepReport | None = None) -> list[dict]:
    """The step's chunked prefills: one dict per request whose prefill this step left unfinished,
    or finished after an unfinished one in ``previous`` (the step before): request_id, chunk (tokens
    this step), computed (tokens with KV after the step), total (the sequence's tokens: the whole
    prefill), fraction (computed / total), done (its last chunk)."""
    before = {s.request_id for s in previous.scheduled if _partial(s)} if previous is not None else set()
    return [dict(request_id=s.request_id, chunk=s.num_tokens, computed=s.num_computed_tokens, total=s.num_prefill_tokens,
                 fraction=min(1.0, s.num_computed_tokens / s.num_prefill_tokens), done=not _partial(s))
            for s in report.scheduled
            if s.phase == "prefill" and s.num_prefill_tokens and (_partial(s) or s.request_id in before)]


def _partial(s) -> bool:
    """A prefill that left part of its prompt for a later step (a chunk of a chunked prefill)."""
    return s.phase == "prefill" and s.num_computed_tokens < s.num_prefill_tokens
