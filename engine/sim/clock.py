"""The simulator's wall clock: each step lasts what the cost model says, arrivals interleave with steps.

The clock counts integer picoseconds (``engine.sim.cost_model.PicosecondCost``), so a stretch of decode
steps applied at once (the lock-step fast path) ends at exactly the time that stepping one by one
would reach, and the two paths queue every arrival before the same step. A request arriving at t is
queued before the first step that starts at or after t. Per request it keeps the time of its first
token (the end of the step that first prefilled it) and of its last (the end of the step in which
it reached its length), which give the paper's metrics (§6.1):

- latency: finish - arrival; **normalized latency**: the mean over requests of latency / output
  length (s/token), the paper's y axis in Figure 12;
- time to first token (TTFT): first token - arrival; time per output token (TPOT): (finish - first
  token) / (output length - 1), for outputs of more than one token;
- throughput: completed requests (and their output tokens) / the simulated time.

With ``cost_model=None`` every step lasts ``step_ms`` and a stretch with nothing to run counts as
idle steps (the simulator's original clock); with a cost model, idle time is not a step: the clock
jumps to the next arrival.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from engine.core.kv_cache_manager import KVCacheManager
from engine.core.block_manager import PagedBlockManager
from engine.core.kv_cache_coordinator import HybridKVCacheCoordinator
from engine.sim.cost_model import PS_PER_S, CostModel, PicosecondCost, StepShape, get_setup
from engine.core.scheduler import SchedulerOutput
from engine.core.sequence import Sequence
from engine.sim.workloads import Request


def resolve_cost_model(cost_model: str | CostModel | None, step_ms: float) -> CostModel:
    """A preset key, a :class:`CostModel`, or None (every step lasts ``step_ms``).

    Raises:
        ValueError: an unknown preset, or "this-machine" before calibration.
    """
    if cost_model is None:
        return CostModel.fixed(step_ms)
    if isinstance(cost_model, CostModel):
        return cost_model
    return get_setup(cost_model).cost_model


class SimClock:
    """Simulated time of one run, and each request's first- and last-token times (picoseconds)."""

    def __init__(self, cost_model: str | CostModel | None, step_ms: float, requests: list[Request], kv: KVCacheManager):
        self.model = resolve_cost_model(cost_model, step_ms)
        self.fixed = cost_model is None
        self.ps = PicosecondCost.of(self.model)
        # Only the paged kernel walks blocks; a contiguous kernel reads one range (no block cost).
        self.block_size = kv.block_size if isinstance(kv, (PagedBlockManager, HybridKVCacheCoordinator)) else None
        self.kv = kv
        self.arrival = [round(r.arrival * PS_PER_S) for r in requests]
        self.output_len = np.array([r.output_len for r in requests], dtype=np.int64)
        self.first_token = np.full(len(requests), -1, dtype=np.int64)
        self.finish = np.full(len(requests), -1, dtype=np.int64)
        self.now = 0

    def has_arrived(self, index: int) -> bool:
        return self.arrival[index] <= self.now

    def idle_until(self, index: int) -> int:
        """Nothing runs: move to request ``index``'s arrival. Returns the idle steps to record."""
        if not self.fixed:
            self.now = max(self.now, self.arrival[index])
            return 0
        k = max(1, -(-(self.arrival[index] - self.now) // self.ps.step_ps))
        self.now += k * self.ps.step_ps
        return k

    # --- One step --------------------------------------------------------------------------------

    def shape_of(self, out: SchedulerOutput) -> StepShape:
        """The shape of a step from ``schedule()``'s output, before its tokens are computed. KV
        blocks: every scheduled sequence's, after the step (ceil(context / block_size) each)."""
        prefills = [(out.num_tokens_of(s), s.num_computed_tokens + out.num_tokens_of(s)) for s in out.prefill_seqs]
        contexts = [s.num_tokens for s in out.decode_seqs]
        bs = self.block_size
        blocks = sum(-(-c // bs) for _, c in prefills) + sum(-(-c // bs) for c in contexts) if bs else 0
        swap_blocks = len(out.blocks_to_swap_out) + len(out.blocks_to_swap_in) + len(out.kv_offload_out) + len(out.kv_offload_in)
        return StepShape(len(prefills), sum(q for q, _ in prefills), sum(q * c - q * (q - 1) // 2 for q, c in prefills),
                         len(contexts), sum(contexts), blocks, swap_blocks, swap_blocks * self.kv.block_size)

    def lockstep_shape(self, out: SchedulerOutput, sums: dict[str, int], running: int, decoded: bool = True) -> StepShape:
        """The same shape in lock-step mode, from the step's memory categories: the decodes'
        contexts are the token states after the step less the prefilled prompts. ``decoded``
        False: a prefill-only step (vLLM v0's scheduler), its prompts' blocks alone."""
        prefill_tokens = prefill_pairs = prompt_blocks = 0
        bs = self.block_size
        for seq in out.prefill_seqs:  # one pass, no generators: ~67,000 such steps in a 100,000-request run
            n = seq.num_tokens
            prefill_tokens += n
            prefill_pairs += n * (n + 1) // 2
            if bs:
                prompt_blocks += -(-n // bs)
        num_prefills = len(out.prefill_seqs)
        if not decoded:
            return StepShape(num_prefills, prefill_tokens, prefill_pairs, 0, 0, prompt_blocks)
        return StepShape(num_prefills, prefill_tokens, prefill_pairs, running - num_prefills,
                         sums["token_states"] - prefill_tokens, self._blocks(sums))

    def run_step(self, shape: StepShape, prefilled: list[Sequence]) -> None:
        self.now += self.ps.step(shape)
        for seq in prefilled:
            if self.first_token[seq.request_id] < 0:
                self.first_token[seq.request_id] = self.now

    def run_decode_steps(self, k: int, running: int, sums: dict[str, int]) -> None:
        """k lock-step decode steps of ``running`` sequences whose categories summed to ``sums``."""
        self.now += self.ps.decode_steps(k, running, sums["token_states"], self._blocks(sums))

    def finished(self, request_id: int) -> None:
        self.finish[request_id] = self.now

    def return_together(self, request_ids: list[int]) -> None:
        """Static batching (engine/baselines/static_batching.py): a batch's results are returned when its last
        request finishes, now; that is every request's finish time."""
        self.finish[request_ids] = self.now

    def _blocks(self, sums: dict[str, int]) -> int:
        # Paged: token states + internal fragmentation = the held blocks' slots, exactly.
        if self.block_size is None:
            return 0
        return (sums["token_states"] + sums["internal_fragmentation"]) // self.block_size

    # --- The fast path's limit ---------------------------------------------------------------------

    def decode_steps_before_next_arrival(self, sched, k: int, index: int) -> int:
        """Of the next ``k`` pure decode steps of a :class:`~engine.sim.lockstep.LockstepScheduler`,
        how many run before request ``index`` must be queued: the fewest m whose end reaches its
        arrival (the next step starts then), or k. Binary search over the closed-form time."""
        if index >= len(self.arrival):
            return k
        gap = self.arrival[index] - self.now
        if self.fixed:
            return min(k, max(1, -(-gap // self.ps.step_ps)))
        running = len(sched.running)

        def elapsed(m: int) -> int:
            blocks = sched.pool.block_steps(sched.clock, m) if self.block_size else 0
            return self.ps.decode_steps(m, running, sched.lockstep_token_state_steps(m), blocks)

        if elapsed(k) < gap:
            return k
        lo, hi = 1, k
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (mid + 1, hi) if elapsed(mid) < gap else (lo, mid)
        return lo

    # --- Metrics -----------------------------------------------------------------------------------

    @property
    def seconds(self) -> float:
        return self.now / PS_PER_S

    def latency_metrics(self) -> dict:
        """The paper's metrics over completed requests (module docstring), in seconds."""
        done = self.finish >= 0
        arrival = np.array(self.arrival, dtype=np.int64)
        latency = np.where(done, (self.finish - arrival) / PS_PER_S, np.nan)
        out_len = self.output_len
        multi = done & (out_len > 1)
        seconds = self.seconds
        return {
            "normalized_latency_s": _mean(latency[done] / out_len[done]),
            "mean_latency_s": _mean(latency[done]),
            "mean_ttft_s": _mean((self.first_token[done] - arrival[done]) / PS_PER_S),
            "mean_tpot_s": _mean((self.finish[multi] - self.first_token[multi]) / PS_PER_S / (out_len[multi] - 1)),
            "throughput_requests_per_s": int(done.sum()) / seconds if seconds else 0.0,
            "throughput_tokens_per_s": int(out_len[done].sum()) / seconds if seconds else 0.0,
            "request_latency_s": latency,
            "request_ttft_s": np.where(done, (self.first_token - arrival) / PS_PER_S, np.nan),
        }


def _mean(values: np.ndarray) -> float:
    return float(values.mean()) if values.size else math.nan


class LoadedKVClock(SimClock):
    """A decode instance's clock under prefill/decode disaggregation (DistServe, Splitwise;
    ``SimulationConfig.kv_role="kv_consumer"``): each prompt's K and V arrive computed from a prefill
    instance, so the step that admits a request computes one token over its whole context (the one
    the prefill instance sampled), what a decode costs, and no prompt tokens (vLLM's connector has
    the scheduler compute only the tokens it did not load). The scheduler still admits the prompt and
    allocates its blocks as usual: only the step's time changes."""

    def shape_of(self, out: SchedulerOutput) -> StepShape:
        return prompts_loaded(super().shape_of(out))

    def lockstep_shape(self, out: SchedulerOutput, sums: dict[str, int], running: int, decoded: bool = True) -> StepShape:
        return prompts_loaded(super().lockstep_shape(out, sums, running, decoded))


def prompts_loaded(shape: StepShape) -> StepShape:
    """``shape`` with each (whole-prompt) prefill turned into one decode token over its prompt: its
    context is the prompt's tokens, which its attention reads from the KV cache. Tokens, blocks and
    swaps otherwise unchanged."""
    return replace(shape, num_prefills=0, prefill_tokens=0, prefill_pairs=0, num_decodes=shape.num_decodes + shape.num_prefills,
                   decode_context=shape.decode_context + shape.prefill_tokens)
