"""Cache-aware scheduling: the order in which waiting requests are admitted.

``"fcfs"`` (first come, first served) is vLLM's: the waiting queue is admitted from its head.
``"lpm"`` is SGLang's *longest prefix match* (Zheng et al. 2024, RadixAttention §3, "cache-aware
scheduling"; ``sglang/srt/managers/schedule_policy.py``): before admitting, the waiting requests
are sorted by the number of their prompt tokens already in the prefix cache, longest first, so that
requests sharing a prefix run while it is cached instead of evicting each other's. Sorting by hit
length alone can starve a request whose prompt shares nothing; here a request that has waited
``max_wait_steps`` scheduler steps goes first (oldest first), and a preempted request keeps its
place at the head of the queue, as under FCFS.

As in SGLang (``SchedulePolicy._determine_active_policy``), LPM ranks the queue only while at most
``LPM_MAX_WAITING`` (128) requests wait: above that, matching every waiting request would cost a
tree walk each per step, so the step admits first come, first served, without matching any.

Not modelled: SGLang's in-batch prefix deprioritization (``IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD``,
``..._DEPRIORITIZE_THRESHOLD``, 32 tokens each): a waiting request with a short cached prefix that
shares a long uncached one with a request ahead of it in the same step goes to the back of the
order, so that the first computes the shared prefix and the others hit it a step later. Here such
requests may be admitted together and each computes the shared prefix.
"""

from __future__ import annotations

from collections import deque

from engine.core.kv_cache_manager import KVCacheManager
from engine.core.lab_impl import plug_lab_parts
from engine.core.sequence import SequenceGroup

LPM_MAX_WAITING = 128  # SGLang's switch: LPM while at most this many requests wait, FCFS above

PREEMPTED = "preempted"  # back at the head after a preemption
STARVED = "starved"  # waited max_wait_steps or more: the starvation guard
LONGEST_PREFIX = "longest-prefix"  # the longest cached prefix among the rest
LONG_QUEUE = "long-queue"  # more than LPM_MAX_WAITING waiting: first come, first served, nothing matched


def lpm_order(waiting: deque[SequenceGroup], kv: KVCacheManager, step: int, waiting_since: dict[int, int],
              max_wait_steps: int) -> dict[int, tuple[str, int]]:
    """Reorder ``waiting`` in place for longest-prefix-match admission.

    Args:
        waiting: the scheduler's waiting queue, preempted requests first, then arrival order.
        kv: the allocator, asked for each request's cached prefix (``get_computed_blocks``).
        step: the scheduler's step count now; waiting_since: request id -> the step it was queued.
        max_wait_steps: the starvation guard's limit, in steps.

    Returns:
        request id -> (why it is where it is: PREEMPTED, STARVED, LONGEST_PREFIX or LONG_QUEUE; its
        cached prompt tokens as LPM counted them, 0 when it did not), for every waiting request.

    With more than ``LPM_MAX_WAITING`` requests waiting the queue stays as it is (first come, first
    served) and no prefix is looked up: every request's reason is LONG_QUEUE, its hit 0. Otherwise
    the whole queue is reordered: preempted requests first (``group.num_preemptions``, their hit is
    reported as 0), in queue order; then the starved (waited ``max_wait_steps`` or more), oldest
    ``arrival_time`` first (ties by request id); then the rest by cached prompt tokens, most first
    (``kv.get_computed_blocks(group)[1]``), ties in queue order.
    """
    # BEGIN SOLUTION lpm
    if len(waiting) > LPM_MAX_WAITING:
        return {group.request_id: (LONG_QUEUE, 0) for group in waiting}
    reasons, keys = {}, {}
    for position, group in enumerate(waiting):
        if group.num_preemptions:
            reason, hit = PREEMPTED, 0
        else:
            hit = kv.get_computed_blocks(group)[1]
            reason = STARVED if step - waiting_since.get(group.request_id, step) >= max_wait_steps else LONGEST_PREFIX
        reasons[group.request_id] = (reason, hit)
        keys[id(group)] = {PREEMPTED: (0, position), STARVED: (1, group.arrival_time, group.request_id)}.get(reason, (2, -hit, position))
    ordered = sorted(waiting, key=lambda g: keys[id(g)])
    waiting.clear()
    waiting.extend(ordered)
    return reasons
    # END SOLUTION


plug_lab_parts(globals())  # labs: a student's part in place of the engine's (engine/core/lab_impl.py)
