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

import heapq
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
        self.lockstep = False  # see start_lockstep

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
            self._schedule_prefills(out, len(out.decode_seqs))
        return out

    def finish(self, seq: Sequence, reason: str) -> None:
        """Take a request out of the running set (or the queue) and free its KV cache."""
        if seq in self.running:
            self.running.remove(seq)
            self._release(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason

    def requeue(self, batch: SchedulerOutput) -> None:
        """Undo a step that failed before its tokens were produced: its requests go back to the head
        of the queue, in first-come-first-served order, with their KV freed (they will be recomputed)."""
        for seq in reversed(batch.decode_seqs + batch.prefill_seqs):
            if seq in self.running:
                self.running.remove(seq)
                self._release(seq)
            seq.num_computed_tokens = 0
            seq.status = SequenceStatus.WAITING
            self.waiting.appendleft(seq)

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

    def _schedule_prefills(self, out: SchedulerOutput, num_decodes: int) -> None:
        budget = self.max_num_batched_tokens - num_decodes
        while self.waiting and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            # Head-of-line blocking: the first request that does not fit stops admission (FCFS).
            if seq.num_new_tokens > budget or not self.kv.can_allocate(seq):
                break
            self.waiting.popleft()
            if self.lockstep:
                self._lockstep_admit(seq)
            else:
                self.kv.allocate(seq)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            out.prefill_seqs.append(seq)
            budget -= seq.num_new_tokens

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        self.events.append(Event(PREEMPT, seq.request_id, detail="recompute"))
        self._release(seq)
        seq.num_computed_tokens = 0
        seq.num_preemptions += 1
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        out.preempted.append(seq)

    def _release(self, seq: Sequence) -> None:
        """Free a running request's memory (it has just left ``running``)."""
        if self.lockstep:
            self._lockstep_release(seq)
        else:
            self.kv.free(seq)

    def _could_admit(self) -> bool:
        """Would the head of the queue be admitted if the next step had no preemption?"""
        if not self.waiting or len(self.running) >= self.max_num_seqs:
            return False
        seq = self.waiting[0]
        budget = self.max_num_batched_tokens - len(self.running)
        return seq.num_new_tokens <= budget and self.kv.can_allocate(seq)

    # --- Lock-step mode (the model-free simulator) --------------------------------------------------
    # The simulator runs no model: in each step every scheduled request computes its new tokens and
    # samples exactly one, and ``max_len`` is its final length. So a running request's length is a
    # function of a step clock (num_tokens = offset + clock), its finish step is known when it is
    # admitted, and the allocator knows in which steps it needs memory (KVCacheManager's lock-step
    # methods). A step then costs O(log n) for what happens in it — an admission, a preemption, a
    # request needing a block, a finish — instead of a pass over all running requests, and a
    # stretch of k steps without any of these costs O(block_size). The policy is the one of
    # schedule(): FCFS admission with head-of-line blocking, recompute preemption of the newest.
    # While a request runs, its num_tokens / num_computed_tokens are only brought up to date when
    # it leaves ``running`` (finish or preemption).

    def start_lockstep(self) -> None:
        """Switch to lock-step mode (for good); call it before anything has run."""
        assert not self.running, "lock-step mode starts with nothing running"
        self.lockstep = True
        self.clock = 0  # steps done
        self.offsets: dict[Sequence, int] = {}  # running request -> num_tokens - clock
        self.offset_sum = 0
        self.admission_number: dict[Sequence, int] = {}  # running request -> its place in running order
        self.admissions = 0
        self.finish_heap: list[tuple[int, int, Sequence]] = []  # (clock it finishes at, admission number, request)
        self.kv.start_lockstep()

    def lockstep_step(self) -> SchedulerOutput:
        """Schedule one step as :meth:`schedule` would and run it. ``decode_seqs`` stays empty:
        every request in ``running`` that was not admitted this step decoded one token."""
        out = SchedulerOutput()
        self._lockstep_decodes(out)
        if not out.preempted:
            self._schedule_prefills(out, len(self.running))
        self.clock += 1
        return out

    def steps_until_event(self, limit: int) -> int:
        """How many of the next steps (at most ``limit``) are pure decode: no admission, no
        preemption, and no request reaching its ``max_len`` before the last of them (the step in
        which the first one does is included: it finishes after it).

        0 means "take a normal step" (:meth:`lockstep_step`): nothing runs, or the head of the queue
        could be admitted now. Free memory only shrinks during decode, so a head that does not fit
        now will not fit before the next finish or preemption.
        """
        if not self.running or self._could_admit():
            return 0
        k = min(limit, self._next_finish_clock() - self.clock)
        return self.kv.lockstep_free_steps(self.clock, k)

    def lockstep_decode(self, k: int, next_waiting: Sequence | None) -> dict[str, int]:
        """Run ``k`` pure decode steps and return each memory category summed over them
        (slot-steps, measured after each step). Requires ``k <= steps_until_event(k)``."""
        # Token states after step clock + j: offset_sum + R * (clock + j - 1); summed over j = 1..k.
        running = len(self.running)
        token_states = k * self._token_states(self.clock) + running * k * (k + 1) // 2
        sums = self.kv.lockstep_decode(self.clock, k, token_states, next_waiting)
        self.clock += k
        return sums

    def lockstep_finished(self) -> list[Sequence]:
        """Running requests that have reached ``max_len`` (pass each to :meth:`finish`), synced."""
        done = []
        while self.finish_heap and self.finish_heap[0][0] <= self.clock:
            _, number, seq = heapq.heappop(self.finish_heap)
            if self.admission_number.get(seq) == number:  # else it was preempted since
                self._sync(seq)
                done.append(seq)
        return done

    def lockstep_usage(self, next_waiting: Sequence | None) -> dict[str, int]:
        """The memory categories now (slots)."""
        return self.kv.lockstep_usage(self._token_states(self.clock), next_waiting)

    def _token_states(self, clock: int) -> int:
        """Cached tokens of the running requests at ``clock``: all but each one's newest."""
        return self.offset_sum + len(self.running) * (clock - 1)

    def _lockstep_decodes(self, out: SchedulerOutput) -> None:
        # As _schedule_decodes, visiting only the requests that need a block this step, in running
        # order; the victim is the newest running request not yet visited (or the request itself).
        needing = self.kv.lockstep_needing_block(self.clock)
        if len(needing) > 1:
            needing.sort(key=self.admission_number.__getitem__)
        for seq in needing:
            if seq not in self.admission_number:
                continue  # preempted earlier in this step
            while not self.kv.lockstep_take_block(seq):
                victim = self.running.pop()
                self._preempt(victim, out)
                if victim is seq:
                    break

    def _lockstep_admit(self, seq: Sequence) -> None:
        # Prefilled in step clock + 1: num_tokens + 1 tokens at clock + 1.
        self.kv.lockstep_admit(seq, self.clock)
        offset = seq.num_tokens - self.clock
        self.offsets[seq] = offset
        self.offset_sum += offset
        self.admissions += 1
        self.admission_number[seq] = self.admissions
        heapq.heappush(self.finish_heap, (seq.max_len - offset, self.admissions, seq))

    def _lockstep_release(self, seq: Sequence) -> None:
        self._sync(seq)
        self.kv.lockstep_release(seq, seq.num_tokens)
        self.offset_sum -= self.offsets.pop(seq)
        del self.admission_number[seq]

    def _sync(self, seq: Sequence) -> None:
        """Bring a running request's lengths up to the clock (after a step: newest token uncached)."""
        seq.num_tokens = self.offsets[seq] + self.clock
        seq.num_computed_tokens = seq.num_tokens - 1

    def _next_finish_clock(self) -> int:
        while self.admission_number.get(self.finish_heap[0][2]) != self.finish_heap[0][1]:
            heapq.heappop(self.finish_heap)  # a preempted request's stale entry
        return self.finish_heap[0][0]
