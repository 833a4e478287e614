"""Lab preemption: the victim is the newest request not served yet; recompute or swap."""

from collections import deque

from engine.core.scheduler import Scheduler
from engine.core.sequence import SequenceStatus
from engine.report import PREEMPT, PREEMPTED_BY_RECOMPUTE, PREEMPTED_BY_SWAP, RECOMPUTE_CPU_POOL_FULL

from labkit import request, scheduler, step


def test_the_victim_is_the_newest_pending_request():
    a, b, c = request(0, 2), request(1, 2), request(2, 2)
    pending = deque([b, c])
    assert Scheduler._pick_victim(pending, a) is c, "the newest request whose turn is still to come is preempted"
    assert list(pending) == [b], "the victim leaves the pending queue"
    assert Scheduler._pick_victim(deque(), a) is a, "nobody after it: the request preempts itself"


def full_pool(**kw):
    """Two requests of 3 tokens in a pool of 4 blocks of 2: their first decode needs a block there is not."""
    sched = scheduler(num_blocks=4, block_size=2, **kw)
    groups = [request(0, 3), request(1, 3)]
    for g in groups:
        sched.add(g)
    step(sched)  # both prefill: 4 blocks held
    step(sched)  # position 3 fits their second blocks
    return sched, groups


def test_recompute_frees_the_victim_and_requeues_it_first():
    sched, (a, b) = full_pool()
    sched.events.drain()
    out = sched.schedule()
    assert out.preempted == [b], "request 1, the newest, is preempted"
    assert [g.request_id for g in sched.waiting] == [1], "the victim waits at the front of the queue"
    assert b.seqs[0].block_table == [] and b.seqs[0].num_computed_tokens == 0, "recompute frees its blocks and resets it"
    assert b.num_preemptions == 1 and b.status is SequenceStatus.WAITING
    preempts = [e for e in sched.events.drain() if e.kind == PREEMPT]
    assert [(e.request_id, e.detail) for e in preempts] == [(1, PREEMPTED_BY_RECOMPUTE)]
    assert [s.request_id for s in out.decode_seqs] == [0], "the older request decodes"


def test_swap_moves_the_victim_to_the_cpu_pool():
    sched, (a, b) = full_pool(num_cpu_blocks=4, preemption_mode="swap")
    sched.events.drain()
    out = sched.schedule()
    assert out.preempted == [b] and out.swapped_out == [b] and sched.swapped == [b], "swap mode: the victim waits in `swapped`"
    assert len(out.blocks_to_swap_out) == 2 and b.status is SequenceStatus.SWAPPED
    assert b.seqs[0].num_computed_tokens == 4, "a swapped request keeps its computed tokens"
    details = [e.detail for e in sched.events.drain() if e.kind == PREEMPT]
    assert details == [PREEMPTED_BY_SWAP]


def test_swap_falls_back_to_recompute_when_the_cpu_pool_is_full():
    sched, (a, b) = full_pool(num_cpu_blocks=1, preemption_mode="swap")
    sched.events.drain()
    out = sched.schedule()
    assert out.preempted == [b] and not sched.swapped and sched.waiting[0] is b, "no room on the CPU: recompute"
    assert sched.num_swap_fallbacks == 1
    assert [e.detail for e in sched.events.drain() if e.kind == PREEMPT] == [RECOMPUTE_CPU_POOL_FULL]
