"""Static (request-level) batching: the FasterTransformer baseline of the paper's Figure 12.

Before iteration-level scheduling (Orca, OSDI 2022, §2; the PagedAttention paper §6.1's
"FasterTransformer" baseline), a serving system formed a batch, ran it until its *longest* request
finished, and only then formed the next one: no request joins a running batch, and the batch's
results are returned together, so every request of a batch finishes, for its latency, when the
batch does. The paper's Figure 12 FasterTransformer has no fine-grained scheduling and manages KV
memory as Orca (Max) does (§6.2), so Figure 12's static line (engine/experiments/figures.py) runs this
policy on Orca (Max)'s allocator: the one difference from Orca (Max) is request-level scheduling.

:class:`StaticBatchScheduler` is that policy over the same :class:`~engine.core.kv_cache_manager.KVCacheManager`
interface as the engine's scheduler (it is the engine's :class:`~engine.core.scheduler.Scheduler` with
admission only into an empty batch): a batch is the head of the queue, first come, first served,
while the pool gives each request its room and the token budget lasts. The simulator runs it with
``SimulationConfig(policy="static")``, step by step or on its lock-step fast path
(``engine.sim.lockstep.LockstepScheduler`` wraps it; between a batch's finishes nothing can happen).

A stated model: a request that has reached its length leaves the batch's compute and its memory is
freed (in FasterTransformer its row is padding until the batch ends; at the paper's batch sizes a
decode step's time is set by reading the weights, so the padding changes the step time little);
since nothing is admitted until the batch is empty, the early free changes no decision.
"""

from __future__ import annotations

from typing import Callable

from engine.core.kv_cache_manager import Group, KVCacheManager
from engine.core.scheduler import Scheduler, SchedulerOutput
from engine.report import WAIT_STATIC_BATCH

POLICIES = ("continuous", "static")


class StaticBatchScheduler(Scheduler):
    """Request-level batching over the engine's scheduler: waiting requests are admitted only into
    an empty running set, then the batch only decodes.

    Args:
        kv_manager, max_num_seqs, max_num_batched_tokens: as :class:`~engine.core.scheduler.Scheduler`'s.
        on_batch_end: called with the request ids of a batch when its last request finishes (the
            simulator's clock sets their finish times to that moment: results return together).
    """

    def __init__(self, kv_manager: KVCacheManager, max_num_seqs: int, max_num_batched_tokens: int,
                 on_batch_end: Callable[[list[int]], None] | None = None):
        super().__init__(kv_manager, max_num_seqs, max_num_batched_tokens)
        self.on_batch_end = on_batch_end
        self.done_in_batch: list[int] = []  # finished requests of the running batch, not yet returned

    def _schedule_prefills(self, out: SchedulerOutput, budget: int) -> str | None:
        if not self.running:  # a new batch; nothing joins a running one
            return super()._schedule_prefills(out, budget)
        return WAIT_STATIC_BATCH if self.waiting else None

    def finish(self, seq: Group, reason: str) -> None:
        super().finish(seq, reason)
        self.done_in_batch.append(seq.request_id)
        if not self.running:
            if self.on_batch_end is not None:
                self.on_batch_end(self.done_in_batch)
            self.done_in_batch = []
