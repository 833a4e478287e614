"""The simulator's lock-step fast path: the engine's scheduler and allocators, stepped by events.

The simulator runs no model: in each step every scheduled request computes its new tokens and
samples exactly one, and ``max_len`` is its final length. So for one-sequence requests under
recompute preemption, with whole prompts and no prefix caching, a running request's length is a
function of a step clock (num_tokens = offset + clock), its finish step is known when it is
admitted, and the steps in which it needs a new block are known too. Nothing about a request has
to be looked at between the steps in which it is admitted, needs memory, is preempted or finishes.

Two wrappers use that, around the real objects rather than inside them:

- a *lock-step pool* (:class:`PagedLockstepPool`, :class:`ContiguousLockstepPool`) wraps an
  allocator and keeps only what decides admission and preemption (free memory, who needs memory
  when) as counters updated per event, with closed-form sums of each memory category over a
  stretch of decode steps: a step costs the same whatever the pool size;
- :class:`LockstepScheduler` holds the step clock and the requests' offsets and finish steps, and
  wraps the engine's own :class:`~engine.core.scheduler.Scheduler` (or the static-batching one),
  whose admission code (FCFS, head-of-line blocking, the watermark), preemption code and rules
  (``_running_order``, ``_pick_victim``) it calls. That scheduler sees the pool through a small
  allocator of its own (:class:`_LockstepKV`), so the allocators have no lock-step methods.

A step then costs O(log n) for what happens in it — an admission, a preemption, a request needing
a block, a finish — instead of a pass over all running requests, and a stretch of k steps without
any of these costs O(block_size). Decisions and memory are those of stepping one by one through
``Scheduler.schedule()``: tests/test_simulator.py compares whole runs step by step.
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import Callable

from engine.baselines.contiguous import ContiguousAllocator
from engine.baselines.static_batching import StaticBatchScheduler
from engine.core.block_manager import PagedBlockManager
from engine.core.kv_cache_manager import KVCacheManager
from engine.core.lab_impl import is_engines_own
from engine.core.scheduler import Scheduler, SchedulerOutput
from engine.report import WAIT_NO_FREE_BLOCK
from engine.core.sequence import Sequence
from engine.core.events import EventLog, NullEventLog

# ``clock`` below is the number of decode steps done; "step clock + 1" is the next one.


class PagedLockstepPool:
    """The paged pool in lock-step mode: a count of free blocks, no block ids.

    Block ids are not handed out: only the number of free blocks decides admissions and
    preemptions, so that is all it keeps (``seq.block_table`` stays empty). After every step a
    running request with n tokens holds ceil((n - 1) / block_size) blocks (all but the newest
    token are cached), and it needs a new block in the next step exactly when n - 1 is a multiple
    of block_size: once every block_size steps, at clocks of one residue modulo block_size.
    ``due[r]`` holds the running requests whose blocks fill at clocks ≡ r, in admission order.

    Args:
        kv: an empty paged allocator without prefix caching; admission keeps its watermark rule
            (``PagedBlockManager.fits_admission``).
    """

    def __init__(self, kv: PagedBlockManager):
        assert kv.allocator.num_free == kv.num_blocks, "lock-step mode starts on an empty pool"
        assert kv.prefix_cache is None, "lock-step mode has no prefix caching"
        self.kv = kv
        self.block_size = kv.block_size
        self.num_slots = kv.num_slots  # read every round: kept here, not through the allocator's property
        self.num_free_blocks = kv.num_blocks
        self.due: list[dict[Sequence, None]] = [{} for _ in range(self.block_size)]  # ordered sets
        self.due_residue: dict[Sequence, int] = {}
        # len(due[r]) at r and at r + block_size, for the per-step arithmetic: the residues of any
        # block_size consecutive steps are then one slice, due_counts[clock % block_size:][:block_size].
        self.due_counts = [0] * (2 * self.block_size)

    def can_admit(self, seq: Sequence) -> bool:
        """Room now to prefill ``seq``'s ``num_tokens`` tokens (``KVCacheManager.can_allocate``)."""
        return self.kv.fits_admission(self.kv.blocks_needed(seq.num_tokens), self.num_free_blocks)

    def admit(self, seq: Sequence, clock: int) -> None:
        """``KVCacheManager.allocate`` for ``seq`` prefilled with its ``num_tokens`` tokens in step ``clock + 1``."""
        # After that step seq has n + 1 tokens, so at clock t it has n + t - clock and needs a
        # block in step t + 1 when (n + t - clock - 1) % block_size == 0.
        n = seq.num_tokens
        self.num_free_blocks -= self.kv.blocks_needed(n)
        assert self.num_free_blocks >= 0, "admitted without room (the scheduler checks can_allocate first)"
        residue = (clock + 1 - n) % self.block_size
        self.due[residue][seq] = None
        self.due_residue[seq] = residue
        self.due_counts[residue] += 1
        self.due_counts[residue + self.block_size] += 1

    def release(self, seq: Sequence, num_tokens: int) -> None:
        """``KVCacheManager.free`` for a running ``seq`` that now has ``num_tokens`` tokens, all but the newest cached."""
        self.num_free_blocks += self.kv.blocks_needed(num_tokens - 1)
        residue = self.due_residue.pop(seq)
        del self.due[residue][seq]
        self.due_counts[residue] -= 1
        self.due_counts[residue + self.block_size] -= 1

    def needing_block(self, clock: int) -> list[Sequence]:
        """Running requests that need new memory to decode in step ``clock + 1``, in admission order."""
        return list(self.due[clock % self.block_size])

    def take_block(self, seq: Sequence) -> bool:
        """Give ``seq`` the memory it needs this step; False (and nothing taken) when none is free."""
        if self.num_free_blocks == 0:
            return False
        self.num_free_blocks -= 1
        return True

    def free_steps(self, clock: int, limit: int) -> int:
        """Most decode steps from step ``clock + 1`` on (<= ``limit``) in which every running
        request gets the memory it needs without a preemption."""
        # Every block_size steps each of the R running requests takes one block, so the free blocks
        # last free // R whole rounds; within the next round, walk the residues in step order.
        running = len(self.due_residue)
        if running == 0:
            return limit
        bs = self.block_size
        rounds, left = divmod(self.num_free_blocks, running)
        steps = rounds * bs
        if steps >= limit:
            return limit
        start = clock % bs
        for needed in self.due_counts[start:start + min(bs, limit - steps)]:  # stops early: left < running = their sum
            if needed > left:
                break
            left -= needed
            steps += 1
        return steps

    def usage(self, token_states: int, next_waiting: Sequence | None) -> dict[str, int]:
        """The memory categories now (slots), given the running requests' ``token_states``."""
        allocated = (self.kv.num_blocks - self.num_free_blocks) * self.block_size
        return self._categories(allocated, token_states, 1)

    def decode(self, clock: int, k: int, token_states: int, next_waiting: Sequence | None) -> dict[str, int]:
        """Give every running request the memory of decode steps ``clock + 1 .. clock + k`` and
        return each memory category summed over those steps (slot-steps, measured after each
        step); ``token_states`` is the running requests' token states summed over the same steps.
        Requires ``k <= free_steps(clock, k)``."""
        taken, held_block_steps = self._blocks(clock, k)
        assert taken <= self.num_free_blocks, "decoded past a preemption (see free_steps)"
        self.num_free_blocks -= taken
        return self._categories(held_block_steps * self.block_size, token_states, k)

    def block_steps(self, clock: int, k: int) -> int:
        """Blocks held after each of the next k decode steps, summed (changes nothing)."""
        return self._blocks(clock, k)[1]

    def _blocks(self, clock: int, k: int) -> tuple[int, int]:
        """(blocks taken, held block-steps) over the next k decode steps."""
        # The requests of the residue of step clock + 1 + i (i from 0) take one block each in that
        # step and every block_size steps after it: `times` blocks, the first held after k - i of
        # the k steps, each next one block_size steps fewer.
        bs, start = self.block_size, clock % self.block_size
        held_block_steps = k * (self.kv.num_blocks - self.num_free_blocks)
        taken = 0
        if k <= bs:  # (most stretches) each takes its one block, held for the rest of the stretch
            steps_held = k
            for count in self.due_counts[start:start + k]:
                taken += count
                held_block_steps += count * steps_held
                steps_held -= 1
            return taken, held_block_steps
        for i, count in enumerate(self.due_counts[start:start + bs]):
            if count:
                times = (k - 1 - i) // bs + 1
                taken += count * times
                held_block_steps += count * (times * (k - i) - bs * times * (times - 1) // 2)
        return taken, held_block_steps

    def _categories(self, allocated: int, token_states: int, k: int) -> dict[str, int]:
        """Paged categories (summed over k steps): no reservation and no external fragmentation."""
        return {
            "token_states": token_states,
            "reserved": 0,
            "internal_fragmentation": allocated - token_states,
            "external_fragmentation": 0,
            "free": k * self.num_slots - allocated,
        }


class ContiguousLockstepPool:
    """The contiguous arena in lock-step mode, with its real ranges and gaps.

    A range is reserved for the whole request when it is admitted (every reservation policy
    reserves at least its final length ``max_len``), so decoding never needs memory and never
    preempts. Reserved and internal fragmentation follow from two sums over the running requests,
    kept per admission and release. Same methods as :class:`PagedLockstepPool`.
    """

    def __init__(self, kv: ContiguousAllocator):
        assert not kv.ranges, "lock-step mode starts on an empty arena"
        self.kv = kv
        self.final_len_sum = 0  # sum of max_len over running requests (tokens)
        self.range_len_sum = 0  # sum of their range lengths (slots)

    def can_admit(self, seq: Sequence) -> bool:
        return self.kv.can_allocate(seq)

    def admit(self, seq: Sequence, clock: int) -> None:
        self.kv.allocate(seq)
        start, end = self.kv.ranges[seq.seq_id]
        assert end - start >= seq.max_len, "lock-step mode needs ranges of at least the final length"
        self.final_len_sum += seq.max_len
        self.range_len_sum += end - start

    def release(self, seq: Sequence, num_tokens: int) -> None:
        start, end = self.kv.ranges[seq.seq_id]
        self.final_len_sum -= seq.max_len
        self.range_len_sum -= end - start
        self.kv.free(seq)

    def needing_block(self, clock: int) -> list[Sequence]:
        return []

    def take_block(self, seq: Sequence) -> bool:
        raise AssertionError("a contiguous range never grows")

    def free_steps(self, clock: int, limit: int) -> int:
        return limit

    def usage(self, token_states: int, next_waiting: Sequence | None) -> dict[str, int]:
        return self.decode(0, 1, token_states, next_waiting)

    def decode(self, clock: int, k: int, token_states: int, next_waiting: Sequence | None) -> dict[str, int]:
        # Decode takes no memory. Per request: max_len - computed tokens reserved, range - max_len
        # over-reserved; the ranges and gaps do not change during decode.
        reserved = k * self.final_len_sum - token_states
        internal = k * (self.range_len_sum - self.final_len_sum)
        external = k * self.kv.external_fragmentation(next_waiting)
        return {
            "token_states": token_states,
            "reserved": reserved,
            "internal_fragmentation": internal,
            "external_fragmentation": external,
            "free": k * self.kv.num_slots - token_states - reserved - internal - external,
        }

    def block_steps(self, clock: int, k: int) -> int:
        return 0  # one contiguous range per request: no blocks to walk


LockstepPool = PagedLockstepPool | ContiguousLockstepPool


def lockstep_pool(kv: KVCacheManager) -> LockstepPool:
    """The lock-step pool that wraps ``kv`` (an empty paged or contiguous allocator)."""
    if isinstance(kv, PagedBlockManager):
        return PagedLockstepPool(kv)
    if isinstance(kv, ContiguousAllocator):
        return ContiguousLockstepPool(kv)
    raise TypeError(f"no lock-step mode for {type(kv).__name__}")


class _LockstepKV:
    """The allocator the wrapped scheduler sees in lock-step mode: what admission and recompute
    preemption call (``KVCacheManager``'s names), answered by the lock-step pool and dated by
    the step clock. One-sequence requests, whole prompts, no prefix caching, no swap."""

    cpu_allocator = None  # no swap space: recompute preemption only
    enable_caching = False  # no prefix caching: admission asks for no computed blocks

    def __init__(self, lockstep: LockstepScheduler):
        self.lockstep = lockstep
        self.events = NullEventLog()  # the scheduler's own (PREEMPT): nobody reads them here

    def num_prefill_tokens(self, seq: Sequence, computed_blocks: list[int] | None = None) -> int:
        return seq.num_new_tokens

    def can_allocate(self, seq: Sequence, num_new_tokens: int | None = None, computed_blocks: list[int] | None = None) -> bool:
        return self.lockstep.pool.can_admit(seq)

    def allocate(self, seq: Sequence, num_new_tokens: int | None = None, computed_blocks: list[int] | None = None) -> None:
        assert num_new_tokens is None, "lock-step mode does not chunk prefills"
        self.lockstep._admitted(seq)

    def free(self, seq: Sequence) -> None:
        self.lockstep._released(seq)

    def free_group(self, seq: Sequence) -> None:
        pass  # a one-sequence request holds nothing beyond its sequence's memory

    def take_pending_copies(self) -> list[tuple[int, int]]:
        return []


class LockstepScheduler:
    """The engine's scheduler on the simulator's fast path, for one-sequence requests.

    It wraps a :class:`~engine.core.scheduler.Scheduler` (or, with ``policy="static"``, a
    :class:`~engine.baselines.static_batching.StaticBatchScheduler`) and a lock-step pool around
    ``kv``: admission is that scheduler's own code, preemption its ``_preempt`` of the request
    its ``_pick_victim`` names, so the policy is the one of ``Scheduler.schedule()``: FCFS
    admission with head-of-line blocking, recompute preemption of the newest request. While a
    request runs, its num_tokens / num_computed_tokens are only brought up to date when it leaves
    ``running`` (finish or preemption).

    Args:
        kv: an empty paged allocator (no prefix caching) or contiguous allocator.
        max_num_seqs, max_num_batched_tokens, schedule_first: as the scheduler's.
        policy: "continuous" or "static" (``engine/baselines/static_batching.py``: between a
            batch's finishes nothing can happen, so a stretch runs to the next finish at once).
        on_batch_end: static batching only (see ``StaticBatchScheduler``).
    """

    num_swap_fallbacks = 0  # recompute only

    def __init__(self, kv: KVCacheManager, max_num_seqs: int, max_num_batched_tokens: int,
                 schedule_first: str = "decodes", policy: str = "continuous",
                 on_batch_end: Callable[[list[int]], None] | None = None):
        self.kv = kv
        self.pool = lockstep_pool(kv)
        view = _LockstepKV(self)
        self.static = policy == "static"
        if self.static:  # request-level batching, admitted with the budget decodes leave
            self.scheduler = StaticBatchScheduler(view, max_num_seqs, max_num_batched_tokens, on_batch_end)
        else:
            self.scheduler = Scheduler(view, max_num_seqs, max_num_batched_tokens, schedule_first=schedule_first)
        self.schedule_first = self.scheduler.schedule_first
        # A step whose head of the queue :meth:`_could_admit` found not fitting skips admission, when the
        # admission rule is the engine's own (a student's part in its place is always called: lab_impl.py).
        self.skip_refused_admission = (not self.static and all(is_engines_own(part) for part in (
            Scheduler._schedule_prefills, Scheduler._can_admit, Scheduler._prefill_chunk, Scheduler.order_waiting)))
        self.head_refused = False  # set by steps_until_event for the step it hands to lockstep_step
        # The pool lists the requests needing a block in admission order, the engine's own running order
        # without chunked prefill; a _running_order in its place is asked.
        self.order_needing = not is_engines_own(Scheduler._running_order)
        self._out = SchedulerOutput()
        # A queue head found not fitting stays so while only decode steps run (free memory only shrinks): it is
        # not asked again until a step, an admission or a release, when the block count is the engine's own.
        self.refused_head: Sequence | None = None
        self.remember_refusal = is_engines_own(PagedBlockManager.blocks_needed)
        # The clock counts decode steps: a prefill-only step (schedule_first="prefills") leaves it
        # where it is, since no running request grew; its admissions are dated one step earlier.
        self.clock = 0  # decode steps done
        self.admit_clock = 0  # the clock admissions are dated from (prefilled in step admit_clock + 1)
        self.offsets: dict[Sequence, int] = {}  # running request -> num_tokens - clock
        self.offset_sum = 0
        self.admission_number: dict[Sequence, int] = {}  # running request -> its place in running order
        self.admissions = 0
        self.finish_heap: list[tuple[int, int, Sequence]] = []  # (clock it finishes at, admission number, request)

    # --- As the scheduler -------------------------------------------------------------------------

    @property
    def running(self) -> list[Sequence]:
        return self.scheduler.running

    @property
    def waiting(self) -> deque[Sequence]:
        return self.scheduler.waiting

    @property
    def events(self) -> EventLog:
        return self.scheduler.events

    def add(self, seq: Sequence) -> None:
        assert isinstance(seq, Sequence), "lock-step mode serves one-sequence requests, as bare sequences"
        self.scheduler.add(seq)

    def finish(self, seq: Sequence, reason: str) -> None:
        self.scheduler.finish(seq, reason)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    # --- Steps --------------------------------------------------------------------------------------

    def lockstep_step(self) -> SchedulerOutput:
        """Schedule one step as ``Scheduler.schedule()`` would and run it. ``decode_seqs`` stays
        empty: every request in ``running`` that was not admitted this step decoded one token.
        The output is one object for all steps, read before the next: a lock-step step fills only its
        ``prefill_seqs`` and ``preempted`` (no swap, no chunks, no LPM), new lists each step, and a
        new SchedulerOutput's sixteen fields would cost more than most steps' own work."""
        out = self._out
        out.prefill_seqs, out.preempted = [], []
        sched = self.scheduler
        head_refused, self.head_refused, self.refused_head = self.head_refused, False, None
        if self.schedule_first == "prefills" and not head_refused:
            self.admit_clock = self.clock - 1  # prefilled in this step, which is no decode step
            why = sched._schedule_prefills(out, sched.max_num_batched_tokens)
            self.admit_clock = self.clock
            if out.prefill_seqs:
                self._remember_refusal(why)
                return out  # vLLM v0: a prefill step; the running requests decode in the next one
        self._decodes(out)
        if not out.preempted and self.schedule_first == "decodes":
            self._remember_refusal(sched._schedule_prefills(out, sched.max_num_batched_tokens - len(self.running)))
        self.clock += 1
        self.admit_clock = self.clock
        return out

    def last_step_decoded(self, out: SchedulerOutput) -> bool:
        """Did the running requests decode in the step :meth:`lockstep_step` returned ``out`` for?"""
        return not (self.schedule_first == "prefills" and out.prefill_seqs)

    def steps_until_event(self, limit: int) -> int:
        """How many of the next steps (at most ``limit``) are pure decode: no admission, no
        preemption, and no request reaching its ``max_len`` before the last of them (the step in
        which the first one does is included: it finishes after it).

        0 means "take a normal step" (:meth:`lockstep_step`): nothing runs, or the head of the queue
        could be admitted now. Free memory only shrinks during decode, so a head that does not fit
        now will not fit before the next finish or preemption.
        """
        if not self.offsets:  # one entry per running request
            self.head_refused = False
            return 0
        waiting = self.scheduler.waiting
        if not (waiting and waiting[0] is self.refused_head):
            if self._could_admit():
                self.head_refused = False
                return 0
            if waiting and self.remember_refusal:
                self.refused_head = waiting[0]
        heap = self.finish_heap
        finish_clock, number, seq = heap[0]
        while self.admission_number.get(seq) != number:
            heapq.heappop(heap)  # a preempted request's stale entry
            finish_clock, number, seq = heap[0]
        k = self.pool.free_steps(self.clock, min(limit, finish_clock - self.clock))
        self.head_refused = k == 0 and self.skip_refused_admission
        return k

    def lockstep_decode(self, k: int, next_waiting: Sequence | None) -> dict[str, int]:
        """Run ``k`` pure decode steps and return each memory category summed over them
        (slot-steps, measured after each step). Requires ``k <= steps_until_event(k)``."""
        sums = self.pool.decode(self.clock, k, self.lockstep_token_state_steps(k), next_waiting)
        self.clock += k
        self.admit_clock = self.clock
        return sums

    def lockstep_token_state_steps(self, k: int) -> int:
        """Token states after each of the next k decode steps, summed (changes nothing)."""
        # Token states after step clock + j: offset_sum + R * (clock + j - 1); summed over j = 1..k.
        return k * self._token_states(self.clock) + len(self.offsets) * k * (k + 1) // 2

    def finish_due(self) -> bool:
        """Might a running request have reached ``max_len`` (then call :meth:`lockstep_finished`)?"""
        return bool(self.finish_heap) and self.finish_heap[0][0] <= self.clock

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
        return self.pool.usage(self._token_states(self.clock), next_waiting)

    # --- Inside a step ------------------------------------------------------------------------------

    def _decodes(self, out: SchedulerOutput) -> None:
        """The running part of ``Scheduler.schedule()``, visiting only the requests that need a
        block this step, in the scheduler's running order."""
        sched = self.scheduler
        needing = self.pool.needing_block(self.clock)
        if len(needing) > 1 and self.order_needing:
            needing = sched._running_order(needing, self.admission_number)
        for seq in needing:
            if seq not in self.admission_number:
                continue  # preempted earlier in this step
            while not self.pool.take_block(seq):
                # ``running`` is in running order and every request after seq has not had its turn:
                # its end is the scheduler's victim (seq itself when seq is the newest).
                victim = sched._pick_victim(self.running, seq)
                sched._preempt(victim, out)
                if victim is seq:
                    break

    def _remember_refusal(self, why: str | None) -> None:
        """Admission ended the step (nothing changes memory after it) refusing the head of the queue for
        memory: it stays refused while only decodes run (see ``refused_head``)."""
        if why == WAIT_NO_FREE_BLOCK and self.skip_refused_admission and self.remember_refusal:
            self.refused_head = self.scheduler.waiting[0]

    def _could_admit(self) -> bool:
        """Would the head of the queue be admitted if the next step had no preemption?"""
        sched, num_running = self.scheduler, len(self.offsets)
        if self.static and num_running:
            return False  # static batching admits only into an empty batch
        if not sched.waiting or num_running >= sched.max_num_seqs:
            return False
        seq = sched.waiting[0]
        budget = sched.max_num_batched_tokens - (num_running if self.schedule_first == "decodes" else 0)
        return seq.num_new_tokens <= budget and self.pool.can_admit(seq)

    def _admitted(self, seq: Sequence) -> None:
        """The scheduler admitted ``seq``: prefilled in step admit_clock + 1, num_tokens + 1 tokens after it."""
        self.pool.admit(seq, self.admit_clock)
        self.refused_head = None
        offset = seq.num_tokens - self.admit_clock
        self.offsets[seq] = offset
        self.offset_sum += offset
        self.admissions += 1
        self.admission_number[seq] = self.admissions
        heapq.heappush(self.finish_heap, (seq.max_len - offset, self.admissions, seq))

    def _released(self, seq: Sequence) -> None:
        """``seq`` left ``running`` (finished or preempted): bring it up to the clock, free its memory."""
        self._sync(seq)
        self.pool.release(seq, seq.num_tokens)
        self.refused_head = None
        self.offset_sum -= self.offsets.pop(seq)
        del self.admission_number[seq]

    def _token_states(self, clock: int) -> int:
        """Cached tokens of the running requests at ``clock``: all but each one's newest."""
        return self.offset_sum + len(self.offsets) * (clock - 1)

    def _sync(self, seq: Sequence) -> None:
        """Bring a running request's lengths up to the clock (after a step: newest token uncached)."""
        seq.num_tokens = self.offsets[seq] + self.clock
        seq.num_computed_tokens = seq.num_tokens - 1
