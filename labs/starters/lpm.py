"""Lab lpm: Cache-aware scheduling: longest prefix match / 缓存感知调度：最长前缀匹配.

SGLang's LPM order for the waiting queue: preempted requests first, then those waiting too long (the
starvation guard, oldest first), then the rest by their prompt tokens already cached, longest first.

SGLang 的 LPM 等待队列顺序：先是被抢占的请求，再是等得太久的请求（防饥饿，最早到达的在前），其余的按已缓存的提示词 token 数从多到少排序。

Your part plugs into the engine in place of its own, in engine/core/scheduling_policy.py (the engine module's names are in
scope here). Grade it in your copy of the starters (labs/README.md), where the labs build on
each other:

    python -m lessons grade lpm --impl labs/mine

Cut by `python -m lessons labs build` from engine/core/scheduling_policy.py; work on a copy.

The module engine/core/scheduling_policy.py, for context:

Cache-aware scheduling: the order in which waiting requests are admitted.

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
from engine.core.sequence import SequenceGroup

LAB = "lpm"  # the lab whose parts this file holds


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
    # TODO(lpm): write this part (see the docstring and labs/README.md)
    raise NotImplementedError("lab lpm: lpm_order")
