"""Cache-aware scheduling: the order in which waiting requests are admitted.

``"fcfs"`` (first come, first served) is vLLM's: the waiting queue is admitted from its head.
``"lpm"`` is SGLang's *longest prefix match* (Zheng et al. 2024, RadixAttention §3, "cache-aware
scheduling"; ``sglang/srt/managers/schedule_policy.py``): before admitting, the waiting requests
are sorted by the number of their prompt tokens already in the prefix cache, longest first, so that
requests sharing a prefix run while it is cached instead of evicting each other's. Sorting by hit
length alone can starve a request whose prompt shares nothing; here a request that has waited
``max_wait_steps`` scheduler steps goes first (oldest first), and a preempted request keeps its
place at the head of the queue, as under FCFS.

SGLang falls back to FCFS when more than 128 requests wait (matching each one costs a tree walk);
here LPM looks at the first ``LPM_WINDOW`` waiting requests and leaves the rest in arrival order.
"""

from __future__ import annotations

from collections import deque

from engine.core.kv_cache_manager import KVCacheManager
from engine.core.lab_impl import plug_lab_parts
from engine.core.sequence import SequenceGroup

LPM_WINDOW = 128

PREEMPTED = "preempted"  # back at the head after a preemption
STARVED = "starved"  # waited max_wait_steps or more: the starvation guard
LONGEST_PREFIX = "longest-prefix"  # the longest cached prefix among the rest


def lpm_order(waiting: deque[SequenceGroup], kv: KVCacheManager, step: int, waiting_since: dict[int, int],
              max_wait_steps: int) -> dict[int, tuple[str, int]]:
    """Reorder ``waiting`` in place for longest-prefix-match admission.

    Args:
        waiting: the scheduler's waiting queue, preempted requests first, then arrival order.
        kv: the allocator, asked for each request's cached prefix (``get_computed_blocks``).
        step: the scheduler's step count now; waiting_since: request id -> the step it was queued.
        max_wait_steps: the starvation guard's limit, in steps.

    Returns:
        request id -> (why it is where it is: PREEMPTED, STARVED or LONGEST_PREFIX; its cached
        prompt tokens), for the requests looked at.

    The first ``LPM_WINDOW`` requests are reordered, the rest stay behind them as they were. In the
    window: preempted requests first (``group.num_preemptions``, their hit is reported as 0), in queue
    order; then the starved (waited ``max_wait_steps`` or more), oldest ``arrival_time`` first (ties by
    request id); then the rest by cached prompt tokens, most first (``kv.get_computed_blocks(group)[1]``),
    ties in queue order.
    """
    # BEGIN SOLUTION lpm
    window = [waiting.popleft() for _ in range(min(len(waiting), LPM_WINDOW))]
    reasons, keys = {}, {}
    for position, group in enumerate(window):
        if group.num_preemptions:
            reason, hit = PREEMPTED, 0
        else:
            hit = kv.get_computed_blocks(group)[1]
            reason = STARVED if step - waiting_since.get(group.request_id, step) >= max_wait_steps else LONGEST_PREFIX
        reasons[group.request_id] = (reason, hit)
        keys[id(group)] = {PREEMPTED: (0, position), STARVED: (1, group.arrival_time, group.request_id)}.get(reason, (2, -hit, position))
    window.sort(key=lambda g: keys[id(g)])
    waiting.extendleft(reversed(window))
    return reasons
    # END SOLUTION


plug_lab_parts(globals())  # labs: a student's part in place of the engine's (engine/core/lab_impl.py)
