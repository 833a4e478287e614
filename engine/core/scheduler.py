"""Iteration-level scheduling: which requests run in the next step, and who is preempted.

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
from engine.core.lab_impl import plug_lab_parts
from engine.core.prefix_cache import PrefixCacheStats
from engine.core.scheduler_output import SchedulerOutput
from engine.core.scheduling_policy import LONGEST_PREFIX, lpm_order
from engine.report import (PREEMPT, PREEMPTED_BY_RECOMPUTE, PREEMPTED_BY_SWAP, RECOMPUTE_CPU_POOL_FULL, RECOMPUTE_PARTIAL_PREFILL,
                           WAIT_BUDGET, WAIT_LPM_PASSED_OVER, WAIT_MAX_NUM_SEQS, WAIT_NO_FREE_BLOCK, WAIT_PREEMPTION, WAIT_QUEUE,
                           WAIT_SWAPPED)
from engine.core.sequence import Sequence, SequenceGroup, SequenceStatus

if TYPE_CHECKING:  # the connector sits above core (engine/kv_transfer/): the scheduler only calls it
    from engine.kv_transfer.base import KVConnectorOutput, KVConnectorScheduler


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

    def add(self, group: SequenceGroup) -> None:
        self._set_status(group, SequenceStatus.WAITING)
        if self.connector is not None and self.connector.request_bootstrapping(group):
            self.bootstrapping[group.request_id] = group  # outside the queue: it holds no block while it waits
            return
        self.waiting.append(group)
        if self.scheduling_policy == "lpm":
            self.waiting_since[group.request_id] = self.num_steps

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.swapped or self.waiting_for_remote_kvs or self.remote_kv_ready or self.bootstrapping)

    def schedule(self) -> SchedulerOutput:
        """Pick the next step's batch, allocating KV room for every token it will compute."""
        if self.connector is not None:
            self.free_lent_blocks()
            for request_id in self.connector.take_bootstrapped() if self.bootstrapping else ():
                self.waiting.append(self.bootstrapping.pop(request_id))  # reserved on the decode side: it may prefill now
        out = self._schedule_step()
        self._mark_passed_over(out)
        out.kv_offload_out, out.kv_offload_in = self.kv.take_offload_copies()  # the CPU tier's copies (prefix caching)
        if self.connector is not None:
            out.kv_connector_metadata = self.connector.build_connector_meta(out)
        return out

    # --- KV transfer (engine/kv_transfer/): vLLM v1's connector calls -------------------------

    def free_lent_blocks(self, now: float | None = None) -> list[int]:
        """Free the blocks of lent requests whose decode instance has read them, or whose lease
        expired (``KVConnectorScheduler.take_freeable``). Returns their request ids."""
        freed = [rid for rid in self.connector.take_freeable(now) if rid in self.lent]
        for request_id in freed:
            group = self.lent.pop(request_id)
            for seq in group.seqs:  # finished: every sequence's blocks were kept
                self.kv.free(seq)
            self.kv.free_group(group)
        return freed

    def update_from_kv_xfer_finished(self, output: KVConnectorOutput) -> None:
        """The workers' finished loads: a request read in waits in ``remote_kv_ready`` with all but
        its last prompt token computed; a failed one goes back to the head of the queue and
        prefills its prompt itself (vLLM's ``kv_load_failure_policy="recompute"``; the connector's
        ``request_load_failed`` records why, in the request's ``kv_transfer_params``)."""
        for request_id in sorted(output.finished_recving):
            group = self.waiting_for_remote_kvs.pop(request_id, None)
            if group is None:
                continue  # aborted while loading
            seq = group.seqs[0]
            seq.num_computed_tokens = max(seq.num_computed_tokens, seq.num_tokens - 1)
            group.status = seq.status = SequenceStatus.WAITING
            self.connector.request_loaded(group)
            self.remote_kv_ready.append(group)
        for request_id, why in sorted(output.failed_recving.items()):
            group = self.waiting_for_remote_kvs.pop(request_id, None)
            if group is None:
                continue
            self._release(group)
            self._reset(group)
            self.connector.request_load_failed(group, why)
            self.waiting.appendleft(group)

    def _start_remote_load(self, group: SequenceGroup, computed: tuple[list[int], int], num_external: int) -> str | None:
        """Admission of a request whose prompt another engine computed (``num_external`` tokens after
        its prefix-cache hit ``computed``): allocate its blocks and wait for the load in
        ``waiting_for_remote_kvs``, outside the step's batch and budget. Returns None when it went
        there, else why it waits."""
        if not self.kv.can_allocate(group, None, computed[0]):
            return WAIT_NO_FREE_BLOCK
        self.waiting.popleft()
        self.kv.allocate(group, None, computed[0])
        seq = group.seqs[0]
        seq.num_computed_tokens = computed[1]
        self.connector.update_state_after_alloc(group, list(seq.block_table), num_external)
        group.status = seq.status = SequenceStatus.WAITING_FOR_REMOTE_KVS
        self.waiting_for_remote_kvs[group.request_id] = group
        return None

    def _admit_remote_kv_ready(self, out: SchedulerOutput, budget: int) -> int:
        """Requests whose KV was read in run first: each computes what its prompt lacks (its last
        token) in this step's batch, within ``budget``. Returns the budget left."""
        while self.remote_kv_ready and len(self.running) < self.max_num_seqs:
            seq = self.remote_kv_ready[0].seqs[0]
            if seq.num_new_tokens > budget:
                break
            group = self.remote_kv_ready.popleft()
            self._set_status(group, SequenceStatus.RUNNING)
            self.running.append(group)
            out.prefill_seqs.append(seq)
            out.num_scheduled_tokens[seq.seq_id] = seq.num_new_tokens
            budget -= seq.num_new_tokens
        return budget

    def _schedule_step(self) -> SchedulerOutput:
        out = SchedulerOutput(blocks_to_copy=self.kv.take_pending_copies())
        admit = not self.swapped  # nothing new is admitted while any request is swapped out (§4.5)
        stop = WAIT_SWAPPED  # why the head of the queue waits
        self.num_steps += 1
        if self.scheduling_policy == "lpm" and admit and self.waiting and len(self.running) < self.max_num_seqs:
            out.admission_reasons = lpm_order(self.waiting, self.kv, self.num_steps, self.waiting_since, self.lpm_max_wait_steps)
        if self.schedule_first == "prefills" and admit:
            stop = self._schedule_prefills(out, self.max_num_batched_tokens)
            if out.prefill_seqs:
                out.waiting = self._why_waiting(out, stop)
                return out  # vLLM v0: a prefill step; the running requests decode in the next one
            admit = False  # the head of the queue does not fit: decodes only
        budget = self._schedule_running(out)
        if not out.preempted:
            budget = self._schedule_swapped(out, budget)  # swapped requests come back first
        if out.preempted and admit:
            stop = WAIT_PREEMPTION
        elif admit:
            stop = self._schedule_prefills(out, budget)
        out.waiting = self._why_waiting(out, stop)
        return out

    def _mark_passed_over(self, out: SchedulerOutput) -> None:
        """Longest prefix match: a waiting request that a later arrival overtook this step (admitted
        first for its longer cached prefix) waits WAIT_LPM_PASSED_OVER, ``out.passed_over`` names the
        first request that overtook it. A preempted request keeps its own reason."""
        if out.admission_reasons is None or not self.report_waiting:
            return
        admitted = {g.request_id: g for g in self.running}
        later = [(admitted[rid].arrival_time, rid) for rid, reason, _ in out.admissions if reason == LONGEST_PREFIX and rid in admitted]
        for group in self.waiting:
            by = next((rid for arrival, rid in later if (arrival, rid) > (group.arrival_time, group.request_id)), None)
            if by is not None and out.waiting.get(group.request_id) not in (None, WAIT_PREEMPTION):
                out.waiting[group.request_id] = WAIT_LPM_PASSED_OVER
                out.passed_over[group.request_id] = by

    def _why_waiting(self, out: SchedulerOutput, stop: str | None) -> dict[int, str]:
        """Every waiting request's reason, in queue order: WAIT_PREEMPTION for one preempted this
        step; ``stop`` for the first other one (the head); behind it the same when no one could be
        admitted whoever they were (batch full, swapped, preemption), else WAIT_QUEUE."""
        if not self.report_waiting:
            return {}
        own = stop in (WAIT_BUDGET, WAIT_NO_FREE_BLOCK)
        preempted = {id(g) for g in out.preempted}
        reasons, head = {}, True
        for group in self.waiting:
            if id(group) in preempted:
                reasons[group.request_id] = WAIT_PREEMPTION
                continue
            reasons[group.request_id] = stop if head or not own else WAIT_QUEUE
            head = False
        return reasons

    def update_from_output(self, out: SchedulerOutput) -> list[Sequence]:
        """After the step's forward pass: advance every scheduled sequence's ``num_computed_tokens``
        by what it computed and cache the blocks it filled. Returns the sequences whose tokens are
        now all computed, in batch order: they sample a token (a partial prefill does not)."""
        seqs = out.prefill_seqs + out.decode_seqs
        # BEGIN SOLUTION chunked_prefill
        ready = []
        for seq in seqs:
            seq.num_computed_tokens += out.num_tokens_of(seq)
            if seq.num_computed_tokens == seq.num_tokens:
                seq.is_prefill = False
                ready.append(seq)
        # END SOLUTION
        self.kv.cache_blocks(seqs)  # their KV is written now: hashed before anyone frees them
        return ready

    def finish(self, group: SequenceGroup, reason: str) -> None:
        """Take a request out of the running set (or a queue) and free its KV cache (every
        unfinished sequence; a swapped-out one's CPU blocks)."""
        if group in self.running:
            self.running.remove(group)
            group.finish_reason = reason  # the connector lends blocks only of a request that completed
            self._release_or_lend(group)
        elif group in self.waiting:
            self.waiting.remove(group)
            self.waiting_since.pop(group.request_id, None)
            if self.connector is not None:  # a decode request that never loaded: its prefill instance's lease is given back
                self.connector.request_finished(group, [])
        elif group in self.swapped:
            self.swapped.remove(group)
            self.kv.free_swapped(group)
        elif self.bootstrapping.pop(group.request_id, None) is not None:
            group.finish_reason = reason
            self.connector.request_finished(group, [])  # its room fails: the decode instance recomputes
        elif self.waiting_for_remote_kvs.pop(group.request_id, None) is not None:
            self._release(group)
            self.connector.request_aborted_while_loading(group.request_id)
        elif group in self.remote_kv_ready:
            self.remote_kv_ready.remove(group)
            self._release(group)
        for s in group.unfinished_seqs():
            s.status = SequenceStatus.FINISHED
            s.finish_reason = s.finish_reason or reason
        group.status = SequenceStatus.FINISHED
        group.finish_reason = reason

    def _release_or_lend(self, group: SequenceGroup) -> None:
        """A running request leaves: free its memory, unless the connector lends its blocks to a
        decode instance (``request_finished``: delay_free); then they are freed by
        :meth:`free_lent_blocks`. The connector's parameters go to ``group.kv_transfer_params``."""
        if self.connector is not None and group.is_single and group.seqs[0].block_table:
            delay_free, params = self.connector.request_finished(group, list(group.seqs[0].block_table))
            if params is not None:
                group.kv_transfer_params = params
            if delay_free:
                self.lent[group.request_id] = group
                return
        self._release(group)

    def finish_seq(self, seq: Sequence, reason: str) -> None:
        """One sequence of a running group is done (a sample hit EOS, a beam was pruned or
        finished): free its blocks now; the group runs on with the others."""
        self.kv.free(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """Make ``child`` share ``parent``'s blocks (vLLM's ``Scheduler.fork_seq``)."""
        self.kv.fork(parent, child)
        child.status = parent.status

    def requeue(self, batch: SchedulerOutput) -> None:
        """Undo a step that failed before its tokens were produced: its requests go back to the head
        of the queue, in first-come-first-served order, with their KV freed (they will be recomputed).
        Requests it swapped out are recomputed too: their copies may not have run."""
        scheduled = {id(s) for s in batch.decode_seqs + batch.prefill_seqs}
        groups = [g for g in self.running if any(id(s) in scheduled for s in g.seqs)]
        for group in batch.swapped_out:
            if group in self.swapped:
                self.swapped.remove(group)
                self.kv.free_swapped(group)
                groups.append(group)
        groups.sort(key=_arrival)
        for group in reversed(groups):
            if group in self.running:
                self.running.remove(group)
                self._release(group)
            self._reset(group)
            self.waiting.appendleft(group)

    # --- The policy: who gets memory first, who gives it up -----------------------------------

    def _running_order(self, groups: list[SequenceGroup] | None = None, admission_rank: dict[SequenceGroup, int] | None = None) -> list[SequenceGroup]:
        """The order in which running requests get the step's memory (vLLM's): decodes first, then
        the partial prefill (chunked prefill only), each part in admission order, oldest first.

        Args:
            groups: some of the running requests, with ``admission_rank`` giving each one's place
                in admission order (the simulator's lock-step path visits only the requests that
                need a block); None = all of ``running``, whose list order is admission order.
        """
        if groups is None:
            return sorted(self.running, key=self._is_prefilling)  # stable: admission order within each part
        if not self.enable_chunked_prefill:  # every running request decodes
            return sorted(groups, key=admission_rank.__getitem__)
        return sorted(groups, key=lambda g: (self._is_prefilling(g), admission_rank[g]))

    @staticmethod
    def _pick_victim(pending: deque[SequenceGroup] | list[SequenceGroup], group: SequenceGroup) -> SequenceGroup:
        """Who is preempted when running request ``group`` cannot get its memory (paper §4.5,
        vLLM's rule): the newest request that has not had its turn this step, else ``group``
        itself; requests served before it keep what they got.

        Args:
            pending: the running requests whose turn comes after ``group``'s, in running order;
                the victim is taken off its end. (The lock-step path passes all of ``running``,
                ``group`` and the requests before it included: its end is the same request.)
        """
        # BEGIN SOLUTION preemption
        return pending.pop() if pending else group
        # END SOLUTION

    # --- The step's three parts ----------------------------------------------------------------

    def _schedule_running(self, out: SchedulerOutput) -> int:
        """Running requests in :meth:`_running_order`: decodes, then a partial prefill's next chunk
        (chunked prefill). While one cannot get its memory, :meth:`_pick_victim` is preempted.
        Returns the budget left."""
        budget = self.max_num_batched_tokens
        queue = deque(self._running_order())
        preempted: set[int] = set()
        while queue:
            group = queue.popleft()
            chunk = min(group.num_new_tokens, budget) if self._is_prefilling(group) else 0
            if self._is_prefilling(group) and chunk == 0:
                continue  # the budget is spent: it goes on next step
            while not self._has_room(group, chunk):
                victim = self._pick_victim(queue, group)
                self._preempt(victim, out)
                preempted.add(id(victim))
                if victim is group:
                    break
            else:
                budget -= self._run(group, out, chunk)
        self.running = [g for g in self.running if id(g) not in preempted]
        return budget

    def _has_room(self, group: SequenceGroup, chunk: int) -> bool:
        """Can the pool give a running group this step's memory: ``chunk`` more prompt tokens, or
        (0) one decode slot per sequence?"""
        if chunk:
            return self.kv.can_allocate_slots(group.unfinished_seqs()[0], chunk)
        return self.kv.can_append_slots(group)

    def _run(self, group: SequenceGroup, out: SchedulerOutput, chunk: int) -> int:
        """Put a running group in the batch: ``chunk`` tokens of its prompt, or (0) one decode per
        sequence. Returns the tokens it computes."""
        if chunk:
            seq = group.unfinished_seqs()[0]  # a partial prefill is one sequence's
            self.kv.allocate_slots(seq, chunk)
            out.prefill_seqs.append(seq)
            out.num_scheduled_tokens[seq.seq_id] = chunk
            return chunk
        for seq in group.unfinished_seqs():
            copy = self.kv.append_slot(seq)
            if copy is not None:
                out.blocks_to_copy.append(copy)
            out.decode_seqs.append(seq)
        return len(group.unfinished_seqs())

    def _schedule_swapped(self, out: SchedulerOutput, budget: int) -> int:
        """Swap requests back in, oldest first, while their blocks and next tokens fit."""
        while self.swapped and len(self.running) < self.max_num_seqs:
            group = self.swapped[0]
            if len(group.unfinished_seqs()) > budget or not self.kv.can_swap_in(group):
                break
            self.swapped.pop(0)
            out.blocks_to_swap_in += self.kv.swap_in(group)
            out.swapped_in.append(group)
            self._set_status(group, SequenceStatus.RUNNING)
            self.running.append(group)
            budget -= self._run(group, out, 0)
        return budget

    def order_waiting(self, waiting: list[SequenceGroup]) -> list[SequenceGroup]:
        """The scheduling policy's one choice (vLLM's ``--scheduling-policy``, ``--scheduler-cls``):
        the order in which waiting requests are offered admission, head first. Admission then
        takes them in that order while they fit (:meth:`_can_admit`); the first that does not fit
        stops it for this step.

        A policy is a subclass that overrides this method (the open lab; ``SimulationConfig.scheduler_cls``).
        The base scheduler is first come, first served: the queue as it stands, arrival order with
        preempted requests back at its front. Called once per step before admission, only when
        overridden.

        Args:
            waiting: every waiting request (a ``SequenceGroup``: ``request_id``, ``arrival_time``,
                ``num_preemptions``, ``seqs[0].num_prompt_tokens``, ``seqs[0].num_tokens``, ``seqs[0].max_len``).

        Returns:
            the same requests, each once, in the order to offer them.
        """
        return waiting

    def _schedule_prefills(self, out: SchedulerOutput, budget: int) -> str | None:
        """Admit waiting requests in :meth:`order_waiting`'s order while they fit. Returns why the head
        of the queue was left waiting (WAIT_BUDGET, WAIT_NO_FREE_BLOCK, WAIT_MAX_NUM_SEQS), None when
        no one is left."""
        if type(self).order_waiting is not Scheduler.order_waiting and len(self.waiting) > 1:
            ordered = self.order_waiting(list(self.waiting))
            if sorted(map(id, ordered)) != sorted(map(id, self.waiting)):
                raise ValueError(f"{type(self).__name__}.order_waiting must return the waiting requests, each once")
            self.waiting = deque(ordered)
        if self.remote_kv_ready:
            budget = self._admit_remote_kv_ready(out, budget)
        while self.waiting:
            if len(self.running) >= self.max_num_seqs:
                return WAIT_MAX_NUM_SEQS
            group = self.waiting[0]
            computed = self.kv.get_computed_blocks(group) if self.kv.enable_caching else _NO_HIT  # once per admission
            if self.connector is not None and group.kv_transfer_params and group.kv_transfer_params.get("do_remote_prefill"):
                num_external, load_async = self.connector.get_num_new_matched_tokens(group, computed[1])
                if num_external is None:
                    return WAIT_QUEUE
                if load_async:
                    why = self._start_remote_load(group, computed, num_external)
                    if why is not None:
                        return why
                    continue
            num_tokens = self.kv.num_prefill_tokens(group, computed[0])
            chunk = self._prefill_chunk(group, num_tokens, budget)
            if chunk is not None and chunk <= 0:  # no budget left (a re-prefilling group may have overdrawn it)
                return WAIT_BUDGET
            # Head-of-line blocking: the first request that does not fit stops admission (FCFS).
            if not self._can_admit(group, num_tokens, chunk, budget, out, computed[0]):
                return self._why_not_admitted(group, num_tokens, chunk, budget, out)
            self.waiting.popleft()
            if out.admission_reasons is not None:
                out.admissions.append((group.request_id, out.admission_reasons[group.request_id][0], computed[1]))
                self.waiting_since.pop(group.request_id, None)
            self._admit(group, chunk, computed)
            self._set_status(group, SequenceStatus.RUNNING)
            self.running.append(group)
            for seq in group.unfinished_seqs():
                out.prefill_seqs.append(seq)
                if chunk is not None:
                    out.num_scheduled_tokens[seq.seq_id] = chunk
            budget -= num_tokens if chunk is None else chunk
        return None

    def _prefill_chunk(self, group: SequenceGroup, num_tokens: int, budget: int) -> int | None:
        """Chunked prefill (vLLM's ``enable_chunked_prefill``): how many of a waiting request's
        ``num_tokens`` prompt tokens this step computes, given the ``budget`` tokens the step has left.

        Returns:
            None: the whole prompt, unchunked (chunking off, or a group re-prefilling several
            sequences, which share its prompt blocks in one pass); else ``min(num_tokens, budget)``
            (0 or less: no budget left, admission stops). The rest of the prompt follows in later
            steps as a partial prefill, its ``num_computed_tokens`` advanced by
            :meth:`update_from_output`.
        """
        # BEGIN SOLUTION chunked_prefill
        return min(num_tokens, budget) if self.enable_chunked_prefill and len(group.unfinished_seqs()) == 1 else None
        # END SOLUTION

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
        # BEGIN SOLUTION admission
        alone = not self.running and not out.prefill_seqs
        too_long = chunk is None and num_tokens > budget and not (len(group.unfinished_seqs()) > 1 and alone)
        return not too_long and self.kv.can_allocate(group, chunk, computed_blocks)
        # END SOLUTION

    def _why_not_admitted(self, group: SequenceGroup, num_tokens: int, chunk: int | None, budget: int,
                          out: SchedulerOutput) -> str:
        """Which half of :meth:`_can_admit`'s rule refused the head of the queue, for the step report:
        WAIT_BUDGET when its unchunked prefill is over the budget left (and it would not run alone as a
        re-prefilling group), else WAIT_NO_FREE_BLOCK."""
        alone = not self.running and not out.prefill_seqs
        over_budget = chunk is None and num_tokens > budget and not (len(group.unfinished_seqs()) > 1 and alone)
        return WAIT_BUDGET if over_budget else WAIT_NO_FREE_BLOCK

    def _admit(self, group: SequenceGroup, chunk: int | None = None, computed: tuple[list[int], int] = ([], 0)) -> None:
        """Allocate an admitted group's KV, its prefix-cache hit first: its first sequence starts
        with ``computed``'s tokens computed (vLLM v1: the scheduler owns ``num_computed_tokens``)."""
        blocks, num_computed = computed
        self.kv.allocate(group, chunk, blocks)
        first = group.unfinished_seqs()[0]
        first.num_computed_tokens = num_computed
        stats = self.prefix_cache_stats
        if stats is None:
            return
        if group.num_preemptions:  # a re-prefill hits its own blocks: counted apart (vllm-project/vllm#25780)
            stats.preempted_queries += first.num_tokens
            stats.preempted_hits += num_computed
        else:
            stats.queries += first.num_tokens
            stats.hits += num_computed
            first.num_prefix_hit_tokens = num_computed

    # --- Preemption (§4.5) ---------------------------------------------------------------------

    def _preempt(self, group: SequenceGroup, out: SchedulerOutput) -> None:
        """Preempt running request ``group`` (paper §4.5): count it (``group.num_preemptions``),
        add it to ``out.preempted``, then either

        - swap (``preemption_mode == "swap"``, the group is not a partial prefill and
          ``self.kv.can_swap_out(group)``): :meth:`_swap_out`, and nothing else; or
        - recompute: emit ``PREEMPT`` with the reason as detail (``PREEMPTED_BY_RECOMPUTE``;
          under swap ``RECOMPUTE_PARTIAL_PREFILL`` or ``RECOMPUTE_CPU_POOL_FULL``, the latter also
          counted in ``num_swap_fallbacks``), free its blocks (:meth:`_release`), reset it
          (:meth:`_reset`) and put it back at the *front* of ``waiting``.
        """
        # BEGIN SOLUTION preemption
        group.num_preemptions += 1
        out.preempted.append(group)
        detail = PREEMPTED_BY_RECOMPUTE
        if self.preemption_mode == "swap":
            if self._is_prefilling(group):
                detail = RECOMPUTE_PARTIAL_PREFILL
            elif self.kv.can_swap_out(group):
                self._swap_out(group, out)
                return
            else:
                detail = RECOMPUTE_CPU_POOL_FULL
                self.num_swap_fallbacks += 1
        self.events.emit(PREEMPT, group.request_id, detail=detail)
        self._release(group)
        self._reset(group)
        self.waiting.appendleft(group)
        # END SOLUTION

    def _swap_out(self, group: SequenceGroup, out: SchedulerOutput) -> None:
        self.events.emit(PREEMPT, group.request_id, detail=PREEMPTED_BY_SWAP)
        out.blocks_to_swap_out += self.kv.swap_out(group)
        out.swapped_out.append(group)
        self._set_status(group, SequenceStatus.SWAPPED)
        bisect.insort(self.swapped, group, key=_arrival)

    def _reset(self, group: SequenceGroup) -> None:
        """Back to waiting with nothing cached: recompute prefills every token again."""
        group.status = SequenceStatus.WAITING
        for seq in group.unfinished_seqs():
            seq.num_computed_tokens = 0
            seq.is_prefill = True
            seq.status = SequenceStatus.WAITING

    def _release(self, group: SequenceGroup) -> None:
        """Free a running request's memory (it has just left ``running``)."""
        for seq in group.unfinished_seqs():
            self.kv.free(seq)
        self.kv.free_group(group)

    # --- Helpers -------------------------------------------------------------------------------

    def _is_prefilling(self, group: SequenceGroup) -> bool:
        """A running request whose prompt is not all computed yet (chunked prefill only: without
        it every running request decodes)."""
        return self.enable_chunked_prefill and group.unfinished_seqs()[0].is_prefill

    @staticmethod
    def _set_status(group: SequenceGroup, status: SequenceStatus) -> None:
        group.status = status
        for seq in group.unfinished_seqs():
            seq.status = status


class ShortestPromptFirstScheduler(Scheduler):
    """A policy beside first come, first served: requests preempted while running come back
    first, then the shortest prompt first (shortest job first on the part a scheduler knows; the
    open lab's model answer, measured against FCFS on TTFT p90 and throughput by the simulator)."""

    def order_waiting(self, waiting: list[SequenceGroup]) -> list[SequenceGroup]:
        """Preempted requests first (they held memory and made progress), then the shortest
        prompt (``seqs[0].num_tokens``, tokens to prefill), ties by arrival."""
        # BEGIN SOLUTION open_scheduler
        return sorted(waiting, key=lambda g: (g.num_preemptions == 0, g.seqs[0].num_tokens, _arrival(g)))
        # END SOLUTION


_NO_HIT: tuple[list[int], int] = ([], 0)  # no prefix caching: nothing is ever found computed


def _arrival(group: SequenceGroup) -> tuple[float, int]:
    return group.arrival_time, group.request_id


plug_lab_parts(globals())  # labs: a student's part in place of the engine's (engine/core/lab_impl.py)
