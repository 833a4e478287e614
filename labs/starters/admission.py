"""Lab admission: Scheduler admission (vLLM v1) / vLLM v1 调度器的准入规则.

Whether the request at the head of the waiting queue joins this step: its prompt must fit the token
budget left of max_num_batched_tokens (a chunk always does) and its blocks the free pool less the
watermark.

等待队列队头的请求能否加入本步：它的提示词必须放得进 max_num_batched_tokens 剩下的 token 预算（分块总能放下），它的块必须放得进扣除水位线后的空闲块。

Your part plugs into the engine in place of its own, in engine/core/scheduler.py (the engine module's names are in
scope here). Grade it in your copy of the starters (labs/README.md), where the labs build on
each other:

    python -m lessons grade admission --impl labs/mine

Cut by `python -m lessons labs build` from engine/core/scheduler.py; work on a copy.

The module engine/core/scheduler.py, for context:

Iteration-level scheduling: which requests run in the next step, and who is preempted.

Continuous batching (Orca's iteration-level scheduling, vLLM's scheduler): every step, each running
request decodes one token and, if no one had to be preempted, waiting requests are admitted first
come, first served, with their whole prompt as a prefill in the same batch. When the pool cannot
give a running request its next slot, the most recently admitted request is preempted (PagedAttention
paper §4.5), in one of two ways:

- *recompute* (the default): its blocks are freed and it goes back to the front of the waiting
  queue, to be prefilled again later with its prompt and the tokens it had produced;
- *swap*: its blocks are copied to the CPU swap space and it waits in the ``swapped`` queue. While
  any request is swapped out no new request is admitted, and swapped requests come back (their
  blocks copied in again) before waiting ones; when the CPU pool is full it falls back to recompute.

With *chunked prefill* (vLLM's ``enable_chunked_prefill``) each step spends one token budget,
``max_num_batched_tokens``: running decodes first, then the prompt that did not fit last step (a
partial prefill), then new requests, whose prompts may be cut into chunks. A long prompt then
spans several steps and no longer stalls every decode.

Which part of the batch comes first is ``schedule_first``, the one place where vLLM's two schedulers differ:

- ``"decodes"``: running requests decode first and waiting prompts join the same step within the
  token budget those decodes leave. This is vLLM v1's scheduler, v0's with chunked prefill, and
  also the scheduler of the paper's own prototype and of vLLM 0.1 (2023: decodes reserved their
  slots first, then prompts were admitted while ``running + prompt tokens <= max_num_batched_tokens``,
  2,560 by default). Without chunked prefill, and with a budget under ``max_model_len +
  max_num_seqs``, a long prompt at the head of the queue can wait until enough running requests
  have finished for it to fit beside their decodes (head-of-line blocking), however much memory
  is free.
- ``"prefills"`` (vLLM v0's default scheduler from 0.2 on, without chunked prefill): while no
  request is swapped out, waiting prompts are admitted first with the whole token budget, and a
  step that admits any runs prefills only; the running requests decode in the next step without
  one. Whole prompts only: vLLM v0's chunked prefill put decodes first.

The unit of scheduling is the *sequence group* (a request and all its sequences, ``engine/core/sequence.py``):
a group's sequences decode together, a preemption frees or swaps all of them, and it is finished as
a whole. Every request is one, whether it holds one sequence or several (the simulator's lock-step
path alone schedules a bare ``Sequence``, which answers the same interface).

With a KV connector (prefill/decode disaggregation, vLLM v1's ``KVConnector``; ``engine/kv_transfer/``)
the scheduler asks it at admission how many prompt tokens another engine computed. Such a request gets
its blocks and waits in ``waiting_for_remote_kvs`` (``WAITING_FOR_REMOTE_KVS``) while the workers read
the KV into them; once read, it is admitted before the waiting queue with one prompt token left to
compute (the last one, whose logits choose its first token). A load that fails is recomputed: the
request goes back to the head of the queue and prefills its prompt itself. On the prefill side a
finished request's blocks may outlive it, lent under a lease until its decode instance has read them.
In the push order (SGLang's) a prefill request first waits in ``bootstrapping``, outside the queue and
holding no block, until its decode instance has reserved blocks for its KV.

The scheduler knows nothing of models or tensors: the engine runs it on a real model and the
simulator runs the very same code on lengths alone (its lock-step fast path, for one-sequence
requests under recompute without chunking, wraps it: ``engine/sim/lockstep.py``).
"""

from __future__ import annotations
import bisect
from collections import deque
from typing import TYPE_CHECKING
from engine.config import PREEMPTION_MODES, check_schedule_first
from engine.core.kv_cache_manager import KVCacheManager
from engine.core.prefix_cache import PrefixCacheStats
from engine.core.scheduler_output import SchedulerOutput
from engine.core.scheduling_policy import LONGEST_PREFIX, lpm_order
from engine.report import (PREEMPT, PREEMPTED_BY_RECOMPUTE, PREEMPTED_BY_SWAP, RECOMPUTE_CPU_POOL_FULL, RECOMPUTE_PARTIAL_PREFILL,
                           WAIT_BUDGET, WAIT_LPM_PASSED_OVER, WAIT_MAX_NUM_SEQS, WAIT_NO_FREE_BLOCK, WAIT_PREEMPTION, WAIT_QUEUE,
                           WAIT_SWAPPED)
from engine.core.sequence import Sequence, SequenceGroup, SequenceStatus

LAB = "admission"  # the lab whose parts this file holds


class Scheduler:
    """First come, first served continuous batching over a :class:`KVCacheManager`.

    Args:
        kv_manager: the paged or contiguous allocator.
        max_num_seqs: most running requests.
        max_num_batched_tokens: most tokens per step (prefill tokens + one per decode).
        preemption_mode: "recompute" or "swap" (paper §4.5; swap needs the paged allocator with a
            CPU pool, ``PagedBlockManager(num_cpu_blocks=...)``).
        enable_chunked_prefill: cut prompts to fit the token budget (vLLM's name).
        schedule_first: "decodes" (vLLM v1: running decodes first, prompts get what they leave) or
            "prefills" (vLLM v0 from 0.2 on: waiting prompts first with the whole budget, a step that
            admits any runs no decodes); see the module docstring.
        scheduling_policy: "fcfs" (waiting requests in arrival order) or "lpm" (longest cached
            prefix first, with a starvation guard of ``lpm_max_wait_steps`` steps;
            ``engine/core/scheduling_policy.py``). Each LPM admission is recorded in
            ``SchedulerOutput.admissions`` with its reason.
        report_waiting: fill ``SchedulerOutput.waiting`` (why each waiting request was not admitted)
            every step; the simulator turns it off unless it records steps (it costs a pass over the queue).
        connector: a KV connector's scheduler side (``engine/kv_transfer/base.py``); None = this engine
            computes every prompt itself.

    Prefix caching (vLLM v1's cut): each admission asks the allocator once for the prompt's cached
    blocks (``get_computed_blocks``) and hands them to ``can_allocate``/``allocate``; the scheduler
    sets ``num_computed_tokens`` and counts queries and hits in ``prefix_cache_stats``.

    Invariants: ``running`` is in admission order (oldest first); a request (a sequence group) is
    in exactly one of ``waiting``, ``running``, ``swapped``, or none
    (finished). ``swapped`` is in arrival order. With chunked prefill at most one running request
    is a partial prefill, the newest.

    Raises:
        ValueError: an unknown preemption_mode or schedule_first; swap without a CPU pool;
            schedule_first="prefills" with chunked prefill.
    """

    # Given (the engine's own, not swapped): the attributes and special methods the parts below use.
    def __init__(self, kv_manager: KVCacheManager, max_num_seqs: int, max_num_batched_tokens: int,
                 preemption_mode: str = "recompute", enable_chunked_prefill: bool = False,
                 schedule_first: str = "decodes", scheduling_policy: str = "fcfs", lpm_max_wait_steps: int = 64,
                 report_waiting: bool = True, connector: KVConnectorScheduler | None = None):
        check_schedule_first(schedule_first, enable_chunked_prefill)
        if scheduling_policy not in ("fcfs", "lpm"):
            raise ValueError(f"scheduling_policy must be one of fcfs, lpm; got {scheduling_policy!r}")
        if scheduling_policy == "lpm" and not kv_manager.enable_caching:
            raise ValueError("scheduling_policy='lpm' orders requests by their cached prefix: it needs prefix caching")
        self.scheduling_policy = scheduling_policy
        self.lpm_max_wait_steps = lpm_max_wait_steps
        self.num_steps = 0
        self.waiting_since: dict[int, int] = {}  # lpm: request id -> the step it was queued
        if preemption_mode not in PREEMPTION_MODES:
            raise ValueError(f"preemption_mode must be one of {', '.join(PREEMPTION_MODES)}; got {preemption_mode!r}")
        if preemption_mode == "swap" and getattr(kv_manager, "cpu_allocator", None) is None:
            raise ValueError("preemption_mode='swap' needs a CPU swap space: the paged allocator with num_cpu_blocks > 0")
        self.kv = kv_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.preemption_mode = preemption_mode
        self.enable_chunked_prefill = enable_chunked_prefill
        self.schedule_first = schedule_first
        self.report_waiting = report_waiting
        self.waiting: deque[SequenceGroup] = deque()
        self.running: list[SequenceGroup] = []
        self.swapped: list[SequenceGroup] = []
        self.num_swap_fallbacks = 0  # swap preemptions that had to recompute: the CPU pool was full
        # Prefix caching: tokens looked up and found at admissions (evictions: the allocator's).
        self.prefix_cache_stats = PrefixCacheStats() if kv_manager.enable_caching else None
        self.events = kv_manager.events  # one ordered log (engine/core/events.py): the allocator's and the scheduler's
        self.connector = connector
        self.waiting_for_remote_kvs: dict[int, SequenceGroup] = {}  # request id -> request whose KV is being read in
        self.remote_kv_ready: deque[SequenceGroup] = deque()  # read in: admitted first, its last prompt token to compute
        self.lent: dict[int, SequenceGroup] = {}  # finished requests whose blocks are lent to a decode instance
        self.bootstrapping: dict[int, SequenceGroup] = {}  # push order: prefill requests waiting for their decode instance's reservation

    def _can_admit(self, group: SequenceGroup, num_tokens: int, chunk: int | None, budget: int, out: SchedulerOutput,
                   computed_blocks: list[int]) -> bool:
        """vLLM v1's admission rule for the request at the head of the waiting queue, checked after
        the running requests took their share of the step (``len(self.running) < max_num_seqs`` is
        checked by the caller):

        - tokens: an unchunked prefill (``chunk is None``) of ``num_tokens`` tokens must fit the
          ``budget`` left of ``max_num_batched_tokens``, except a group re-prefilling several
          sequences (``len(group.unfinished_seqs()) > 1``) that would run alone in the step (nothing
          running, no prefill admitted yet in ``out.prefill_seqs``); a chunk fits by construction.
        - memory: ``self.kv.can_allocate(group, chunk, computed_blocks)`` (free blocks less the
          watermark).

        Returns True when the request is admitted now; False stops admission for this step.
        """
        # TODO(admission): write this part (see the docstring and labs/README.md)
        raise NotImplementedError("lab admission: Scheduler._can_admit")
