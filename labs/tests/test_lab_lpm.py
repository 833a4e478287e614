"""Lab lpm: SGLang's longest-prefix-match order of the waiting queue, with preempted requests first and
the starvation guard (engine/core/scheduling_policy.py), and the scheduler admitting in that order."""

from collections import deque

from engine.core.block_manager import PagedBlockManager
from engine.core.scheduling_policy import LONG_QUEUE, LONGEST_PREFIX, LPM_MAX_WAITING, PREEMPTED, STARVED, lpm_order

from labkit import request, scheduler, step

BS = 4
SHARED = list(range(500, 512))  # three blocks, cached below


def cached_pool() -> PagedBlockManager:
    """A pool whose cache holds SHARED's three blocks (a finished request's)."""
    kv = PagedBlockManager(32, BS, watermark=0.0, enable_caching=True)
    done = request(99, 12)
    done.seqs[0].token_ids = list(SHARED)
    kv.allocate(done)
    done.seqs[0].num_computed_tokens = 12
    kv.cache_blocks(done.seqs)
    kv.free(done.seqs[0])
    return kv


def sharing(request_id: int, shared_blocks: int, arrival: float = 0.0):
    """A request whose prompt (13 tokens) starts with ``shared_blocks`` of SHARED's blocks."""
    group = request(request_id, 13)
    own = group.seqs[0].token_ids
    group.seqs[0].token_ids = SHARED[: shared_blocks * BS] + own[shared_blocks * BS :]
    group.arrival_time = arrival
    return group


def ids(waiting) -> list[int]:
    return [g.request_id for g in waiting]


def test_the_longest_cached_prefix_goes_first():
    kv = cached_pool()
    waiting = deque([sharing(0, 0), sharing(1, 2), sharing(2, 3), sharing(3, 1)])
    reasons = lpm_order(waiting, kv, step=0, waiting_since={}, max_wait_steps=64)
    assert ids(waiting) == [2, 1, 3, 0], f"sorted by cached prompt tokens, most first: {ids(waiting)}"
    assert reasons == {0: (LONGEST_PREFIX, 0), 1: (LONGEST_PREFIX, 8), 2: (LONGEST_PREFIX, 12), 3: (LONGEST_PREFIX, 4)}, \
        "each request's reason and its cached prompt tokens (kv.get_computed_blocks(group)[1])"


def test_ties_keep_the_queue_order():
    kv = cached_pool()
    waiting = deque([sharing(0, 1), sharing(1, 2), sharing(2, 1), sharing(3, 2)])
    lpm_order(waiting, kv, step=0, waiting_since={}, max_wait_steps=64)
    assert ids(waiting) == [1, 3, 0, 2], "equal hits stay in the order they waited in (a stable sort)"


def test_preempted_requests_keep_the_head():
    kv = cached_pool()
    back = sharing(5, 0)
    back.num_preemptions = 1
    waiting = deque([back, sharing(1, 3)])
    reasons = lpm_order(waiting, kv, step=0, waiting_since={}, max_wait_steps=64)
    assert ids(waiting) == [5, 1] and reasons[5] == (PREEMPTED, 0), "a preempted request stays first, whatever the others hit"


def test_the_starvation_guard_lets_the_oldest_waiting_go_first():
    kv = cached_pool()
    waiting = deque([sharing(0, 0, arrival=2.0), sharing(1, 0, arrival=1.0), sharing(2, 3, arrival=3.0)])
    reasons = lpm_order(waiting, kv, step=10, waiting_since={0: 0, 1: 0, 2: 9}, max_wait_steps=10)
    assert ids(waiting) == [1, 0, 2], f"requests that waited max_wait_steps go first, oldest arrival first: {ids(waiting)}"
    assert reasons[0][0] == reasons[1][0] == STARVED and reasons[2] == (LONGEST_PREFIX, 12)


def test_a_long_queue_is_served_first_come_first_served():
    kv = cached_pool()
    waiting = deque([sharing(i, 0) for i in range(LPM_MAX_WAITING - 1)] + [sharing(LPM_MAX_WAITING - 1, 3), sharing(LPM_MAX_WAITING, 2)])
    reasons = lpm_order(waiting, kv, step=0, waiting_since={}, max_wait_steps=64)
    assert ids(waiting) == list(range(LPM_MAX_WAITING + 1)), \
        "more than LPM_MAX_WAITING waiting: the queue stays in its order, as SGLang turns LPM off (and none is lost)"
    assert reasons == {i: (LONG_QUEUE, 0) for i in range(LPM_MAX_WAITING + 1)}, "every request's reason is LONG_QUEUE, nothing matched"
    waiting.pop()
    lpm_order(waiting, kv, step=0, waiting_since={}, max_wait_steps=64)
    assert ids(waiting)[0] == LPM_MAX_WAITING - 1, "exactly LPM_MAX_WAITING waiting: LPM still orders them"


def test_the_scheduler_admits_in_lpm_order():
    sched = scheduler(32, BS, max_num_seqs=1, max_num_batched_tokens=64, enable_caching=True, scheduling_policy="lpm")
    first = sharing(0, 3)
    sched.add(first)
    while sched.has_unfinished():  # request 0 computes SHARED and finishes: its blocks stay cached
        step(sched)
        if first.seqs[0].num_output_tokens >= 1:
            sched.finish(first, "length")
    for group in (sharing(1, 0), sharing(2, 3)):
        sched.add(group)
    out = step(sched)
    assert [s.request_id for s in out.prefill_seqs] == [2], "with one seat, the request whose prompt is cached is admitted first"
