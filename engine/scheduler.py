"""Iteration-level scheduling: which requests run in the next step, and who is preempted.

Continuous batching (Orca's iteration-level scheduling, vLLM's scheduler): every step, each running
request decodes one token and, if no one had to be preempted, waiting requests are admitted first
come, first served, with their whole prompt as a prefill in the same batch. When the pool cannot
give a running request its next slot, the most recently admitted request is preempted by
*recompute*: its blocks are freed and it goes back to the front of the waiting queue, to be
prefilled again later with its prompt and the tokens it had produced (PagedAttention paper §4.5).

The scheduler knows nothing of models or tensors: the engine runs it on a real model and the
simulator runs the very same code on lengths alone.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from engine.block_manager import KVCacheManager
from engine.report import PREEMPT, Event
from engine.sequence import Sequence, SequenceStatus


@dataclass
class SchedulerOutput:
    """One step's batch: prefills (whole prompts) then decodes (one token each).

    Attributes:
        prefill_seqs: admitted this step; each computes ``seq.num_new_tokens`` tokens.
        decode_seqs: running requests computing their one newest token.
        preempted: requests preempted by recompute this step, in order.
    """

    prefill_seqs: list[Sequence] = field(default_factory=list)
    decode_seqs: list[Sequence] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

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

    Invariants: ``running`` is in admission order (oldest first); a request is in exactly one of
    ``waiting``, ``running``, or neither (finished).
    """

    def __init__(self, kv_manager: KVCacheManager, max_num_seqs: int, max_num_batched_tokens: int):
        self.kv = kv_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.events = kv_manager.events  # one ordered log: the allocator's and the scheduler's events

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        """Pick the next step's batch, allocating KV room for every token it will compute."""
        out = SchedulerOutput()
        self._schedule_decodes(out)
        if not out.preempted:
            self._schedule_prefills(out)
        return out

    def finish(self, seq: Sequence, reason: str) -> None:
        """Take a request out of the running set (or the queue) and free its KV cache."""
        if seq in self.running:
            self.running.remove(seq)
            self.kv.free(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason

    def _schedule_decodes(self, out: SchedulerOutput) -> None:
        queue = deque(self.running)
        kept: list[Sequence] = []
        while queue:
            seq = queue.popleft()
            while not self.kv.can_append_slot(seq):
                victim = queue.pop() if queue else seq
                self._preempt(victim, out)
                if victim is seq:
                    break
            else:
                self.kv.append_slot(seq)
                kept.append(seq)
                out.decode_seqs.append(seq)
        self.running = kept

    def _schedule_prefills(self, out: SchedulerOutput) -> None:
        budget = self.max_num_batched_tokens - len(out.decode_seqs)
        while self.waiting and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            # Head-of-line blocking: the first request that does not fit stops admission (FCFS).
            if seq.num_new_tokens > budget or not self.kv.can_allocate(seq):
                break
            self.waiting.popleft()
            self.kv.allocate(seq)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            out.prefill_seqs.append(seq)
            budget -= seq.num_new_tokens

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        self.events.append(Event(PREEMPT, seq.request_id, detail="recompute"))
        self.kv.free(seq)
        seq.num_computed_tokens = 0
        seq.num_preemptions += 1
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        out.preempted.append(seq)

    # --- Lock-step decode (the simulator's fast-forward) -------------------------------------------
    # Between events every running request decodes one token per step and nothing else changes, so
    # the model-free simulator applies k such steps at once. Same result as k calls to schedule(),
    # at a cost that does not grow with k.

    def steps_until_event(self, limit: int) -> int:
        """How many of the next steps (at most ``limit``) are pure lock-step decode: no admission,
        no preemption, and no request reaching its ``max_len`` before the last of them.

        0 means "take a normal step": nothing runs, or the head of the queue could be admitted now.
        Free memory only shrinks during decode, so a head that does not fit now will not fit
        before the next finish. The step in which the first request reaches ``max_len`` is
        included: it finishes after that step.
        """
        if not self.running or self._could_admit():
            return 0
        k = min(limit, min(seq.max_len - seq.num_tokens for seq in self.running))
        return self.kv.max_decode_steps(self.running, k) if k > 0 else 0

    def advance_decode(self, k: int) -> None:
        """Apply ``k`` lock-step decode steps, each computing and sampling one token per running
        request (the simulator's model). Requires ``k <= steps_until_event(k)``."""
        self.kv.advance_decode(self.running, k)
        for seq in self.running:
            seq.num_tokens += k
            seq.num_computed_tokens = seq.num_tokens - 1

    def _could_admit(self) -> bool:
        if not self.waiting or len(self.running) >= self.max_num_seqs:
            return False
        seq = self.waiting[0]
        budget = self.max_num_batched_tokens - len(self.running)
        return seq.num_new_tokens <= budget and self.kv.can_allocate(seq)
