"""Iteration-level scheduling: which requests run in the next step, and who is preempted.

Continuous batching (Orca's iteration-level scheduling, vLLM's scheduler): every step, each running
request decodes one token and, if no one had to be preempted, waiting requests are admitted first
come, first served, with their whole prompt as a prefill in the same batch. When the pool cannot
give a running request its next slot, the most recently admitted request is preempted by
*recompute*: its blocks are freed and it goes back to the front of the waiting queue, to be
prefilled again later with its prompt and the tokens it had produced (PagedAttention paper §4.5).

The unit of scheduling is the *sequence group* (a request and all its sequences, ``engine/sequence.py``):
a group's sequences decode together, a preemption frees all of them, and it is finished as a
whole. A one-sequence request is its own group.

The scheduler knows nothing of models or tensors: the engine runs it on a real model and the
simulator runs the very same code on lengths alone (its lock-step fast path, for one-sequence
requests, is a subclass in ``engine/simulator.py``).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from engine.block_manager import Group, KVCacheManager
from engine.report import PREEMPT, Event
from engine.sequence import Sequence, SequenceStatus


@dataclass
class SchedulerOutput:
    """One step's batch: prefills (whole prompts) then decodes (one token each).

    Attributes:
        prefill_seqs: sequences admitted this step; each computes ``seq.num_new_tokens`` tokens.
        decode_seqs: running sequences computing their one newest token.
        preempted: requests (groups) preempted by recompute this step, in order.
        blocks_to_copy: copy-on-write ``(src, dst)`` block pairs (attention blocks) to copy before
            the forward pass, in order (vLLM's ``blocks_to_copy``).
    """

    prefill_seqs: list[Sequence] = field(default_factory=list)
    decode_seqs: list[Sequence] = field(default_factory=list)
    preempted: list[Group] = field(default_factory=list)
    blocks_to_copy: list[tuple[int, int]] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        return not self.prefill_seqs and not self.decode_seqs

    @property
    def phase(self) -> str:
        if self.prefill_seqs and self.decode_seqs:
            return "mixed"
        return "prefill" if self.prefill_seqs else "decode" if self.decode_seqs else "idle"


class Scheduler:
    """First come, first served continuous batching over a :class:`KVCacheManager`.

    Args:
        kv_manager: the paged or contiguous allocator.
        max_num_seqs: most running requests.
        max_num_batched_tokens: most tokens per step (prefill tokens + one per decode).

    Invariants: ``running`` is in admission order (oldest first); a request (a sequence group, or
    a one-sequence request) is in exactly one of ``waiting``, ``running``, or neither (finished).
    """

    def __init__(self, kv_manager: KVCacheManager, max_num_seqs: int, max_num_batched_tokens: int):
        self.kv = kv_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Group] = deque()
        self.running: list[Group] = []
        self.events = kv_manager.events  # one ordered log: the allocator's and the scheduler's events

    def add(self, seq: Group) -> None:
        seq.status = SequenceStatus.WAITING
        for s in seq.unfinished_seqs():
            s.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        """Pick the next step's batch, allocating KV room for every token it will compute."""
        out = SchedulerOutput(blocks_to_copy=self.kv.take_pending_copies())
        self._schedule_decodes(out)
        if not out.preempted:
            self._schedule_prefills(out, len(out.decode_seqs))
        return out

    def finish(self, seq: Group, reason: str) -> None:
        """Take a request out of the running set (or the queue) and free its KV cache (every
        unfinished sequence of a group)."""
        if seq in self.running:
            self.running.remove(seq)
            self._release(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        for s in seq.unfinished_seqs():
            s.status = SequenceStatus.FINISHED
            s.finish_reason = s.finish_reason or reason
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason

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
        of the queue, in first-come-first-served order, with their KV freed (they will be recomputed)."""
        groups = list(dict.fromkeys(self._group_of(s) for s in batch.decode_seqs + batch.prefill_seqs))
        for group in reversed(groups):
            if group in self.running:
                self.running.remove(group)
                self._release(group)
            self._reset(group)
            self.waiting.appendleft(group)

    def _schedule_decodes(self, out: SchedulerOutput) -> None:
        queue = deque(self.running)
        kept: list[Group] = []
        while queue:
            group = queue.popleft()
            while not self.kv.can_append_slots(group):
                victim = queue.pop() if queue else group
                self._preempt(victim, out)
                if victim is group:
                    break
            else:
                for seq in group.unfinished_seqs():
                    copy = self.kv.append_slot(seq)
                    if copy is not None:
                        out.blocks_to_copy.append(copy)
                    out.decode_seqs.append(seq)
                kept.append(group)
        self.running = kept

    def _schedule_prefills(self, out: SchedulerOutput, num_decodes: int) -> None:
        budget = self.max_num_batched_tokens - num_decodes
        while self.waiting and len(self.running) < self.max_num_seqs:
            group = self.waiting[0]
            num_tokens = self.kv.num_prefill_tokens(group)
            # Head-of-line blocking: the first request that does not fit stops admission (FCFS).
            # A group re-prefilling more than the budget still runs when it would run alone.
            alone = not self.running and not out.prefill_seqs
            if (num_tokens > budget and not (group.is_group and alone)) or not self.kv.can_allocate(group):
                break
            self.waiting.popleft()
            self._admit(group)
            group.status = SequenceStatus.RUNNING
            self.running.append(group)
            for seq in group.unfinished_seqs():
                seq.status = SequenceStatus.RUNNING
                out.prefill_seqs.append(seq)
            budget -= num_tokens

    def _admit(self, group: Group) -> None:
        self.kv.allocate(group)

    def _preempt(self, group: Group, out: SchedulerOutput) -> None:
        self.events.append(Event(PREEMPT, group.request_id, detail="recompute"))
        self._release(group)
        self._reset(group)
        group.num_preemptions += 1
        if group.is_group:
            for seq in group.unfinished_seqs():
                seq.num_preemptions += 1
        self.waiting.appendleft(group)
        out.preempted.append(group)

    def _reset(self, group: Group) -> None:
        """Back to waiting with nothing cached: recompute prefills every token again."""
        group.status = SequenceStatus.WAITING
        for seq in group.unfinished_seqs():
            seq.num_computed_tokens = 0
            seq.status = SequenceStatus.WAITING

    def _release(self, group: Group) -> None:
        """Free a running request's memory (it has just left ``running``)."""
        for seq in group.unfinished_seqs():
            self.kv.free(seq)
        if group.is_group:
            self.kv.free_group(group)

    def _group_of(self, seq: Sequence) -> Group:
        for group in self.running:
            if seq in group.seqs:
                return group
        return seq

    def _could_admit(self) -> bool:
        """Would the head of the queue be admitted if the next step had no preemption?"""
        if not self.waiting or len(self.running) >= self.max_num_seqs:
            return False
        seq = self.waiting[0]
        budget = self.max_num_batched_tokens - len(self.running)
        return seq.num_new_tokens <= budget and self.kv.can_allocate(seq)
