"""A model-free serving simulator: the engine's own scheduler and KV allocators on lengths alone.

A request is (arrival time, prompt length, output length). One simulated step is one scheduler
iteration: ``Scheduler.schedule()`` picks the batch and allocates KV room exactly as in the engine,
then every scheduled request computes its new tokens (``Scheduler.update_from_output``) and, once
all its tokens are computed (a chunked prompt's last chunk), samples one token; a request finishes
when it reaches prompt + output tokens. Swap preemption moves block ids between the GPU pool and
the CPU pool exactly as in the engine; only the copies are not made. Nothing else is
modelled, so the simulator answers the paper's memory questions — how much of the KV pool holds
token states, how many requests run at once — for 100,000 requests in seconds.

Time (``engine/sim/clock.py``): with ``cost_model`` a step lasts what the step-time model
(``engine/sim/cost_model.py``) predicts from what it computes, so Poisson arrivals interleave with steps
and each request gets its latency, normalized latency, TTFT and TPOT; without one, every step lasts
``step_ms`` and a stretch with nothing to run counts as idle steps. Arrivals are admitted at the
first step that starts at or after their arrival time. With all requests at time 0 (saturation,
the default) time plays no part in the memory figures.

Fast-forward (one-sequence requests, recompute, no chunking, no prefix caching; the simulator
picks the path itself): the scheduler runs in lock-step mode (``engine/sim/lockstep.py``, a wrapper
around the engine's scheduler and allocator): a running request's length follows a step clock, its
finish step and the steps in which it needs a new block are known ahead, so a step costs only what
happens in it (an admission, a preemption, a request needing a block, a finish) and a stretch of k
steps with none of these — nor an arrival — is applied at once with closed-form sums of each memory
category (``LockstepScheduler.steps_until_event`` / ``lockstep_decode``). The results are identical
to stepping one by one through ``Scheduler.schedule()`` (``fast_forward=False``; tests/test_simulator.py
checks it).

Memory is measured during each step, after its tokens are computed and before finished requests
free their memory; categories as in ``engine/core/accounting.py`` (PagedAttention paper Figure 2).
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace

import numpy as np
from tqdm import tqdm

from engine.core.accounting import CATEGORIES, in_use_shares
from engine.core.kv_cache_manager import KVCacheManager
from engine.core.kv_cache_coordinator import HybridKVCacheCoordinator, make_kv_cache_manager
from engine.core.kv_cache_interface import get_kv_cache_config
from engine.core.events import NullEventLog
from engine.report import StepReport
from engine.baselines.contiguous import ContiguousAllocator
from engine.sim.cost_model import SETUPS, CostModel, get_setup
from engine.sampling_params import BeamSearchParams, SamplingParams
from engine.config import (ALLOCATORS, DEFAULT_LPM_MAX_WAIT_STEPS, KV_CACHE_DTYPES, PLACEMENTS, PREEMPTION_MODES, RESERVATIONS,
                           SCHEDULE_FIRST, add_prefix_cache_args, check_prefix_cache_options, default_max_num_batched_tokens,
                           kv_bytes_per_slot, kv_cache_element_bytes, prefix_cache_kwargs)
from engine.core.scheduler import Scheduler, SchedulerOutput, check_schedule_first
from engine.sim.clock import LoadedKVClock, SimClock, resolve_cost_model
from engine.sim.lockstep import LockstepScheduler
from engine.baselines.static_batching import POLICIES, StaticBatchScheduler
from engine.core.sequence import Sequence, SequenceGroup, fork_samples
from engine.sim.workloads import TOKEN_WORKLOADS, WORKLOADS, Request, load_trace, make_workload


KV_ROLES = ("kv_both", "kv_producer", "kv_consumer")  # vLLM's KVTransferConfig.kv_role


@dataclass
class SimulationConfig:
    """What to simulate.

    Attributes:
        workload: "sharegpt" or "alpaca" (ignored when ``requests`` or ``trace`` is given).
        num_requests: requests drawn from the workload.
        request_rate: Poisson arrivals in requests/s; None = all at time 0 (saturation).
        trace: path of a JSONL trace (arrival, prompt_len, output_len) instead of a workload.
        requests: the requests themselves instead of a workload (Python API).
        kv_slots: token slots of the KV pool (rounded down to whole blocks).
        block_size: slots per block.
        watermark: paged only: share of the blocks admission leaves free (vLLM's default 0.01; see
            ``PagedBlockManager``).
        allocator: "paged" or "contiguous".
        reservation: contiguous only: "max", "pow2", "pow2-total" or "oracle" (engine/baselines/contiguous.py).
        placement: contiguous only: "first-fit", "best-fit" or "buddy".
        policy: "continuous" (iteration-level scheduling, the engine's scheduler) or "static"
            (a batch runs until its longest request finishes, nothing joins it meanwhile:
            ``engine/baselines/static_batching.py``, the paper's FasterTransformer baseline; one-sequence
            requests only).
        max_num_seqs: most running requests (vLLM's default 256).
        max_num_batched_tokens: most tokens per step; None = max(2048, max_model_len).
        max_model_len: longest request in tokens (prompt + output).
        step_ms: simulated duration of one step in milliseconds (when ``cost_model`` is None).
        cost_model: how long a step takes: None = ``step_ms`` each; a preset key of
            ``engine.sim.cost_model.SETUPS`` ("a100-opt-13b", ...) or a ``CostModel``: the step's
            roofline time from what it computes (``engine/sim/clock.py``).
        seed: seeds the workload.
        fast_forward: apply lock-step decode stretches at once (same results, much faster). Used
            only where the policy has that path: one-sequence requests (``n == 1``); otherwise every
            step goes through ``Scheduler.schedule()`` whatever this says.
        progress: show a tqdm progress bar of finished requests.
        n: parallel sampling: sequences per request (paper §6.3, Figure 15). The prompt is prefilled
            once and forked; every sample has the request's output length (a stated model: the
            paper's traces give one output length per request).
        beam_width: beam search with this many beams per request (one of ``BEAM_PARENTS``' widths).
            The model: after the prefill the prompt forks into beam_width beams; in each decode step
            the survivors come from k distinct parents, k drawn from ``BEAM_PARENTS[beam_width]``
            (measured on the real engine's beam search, ``engine/tools/beam_calibration.py``): the k best
            beams go on, the others are pruned (their blocks freed), and the best beam forks the
            beam_width - k extra survivors. All beams have the request's output length.
        preemption_mode: "recompute" or "swap" (paper §4.5): swap moves a preempted request's blocks to
            a CPU pool of ``swap_slots`` token slots and back.
        swap_slots: token slots of the CPU swap space (rounded down to whole blocks); None = as many
            as ``kv_slots``.
        enable_chunked_prefill: prompts are cut to fit ``max_num_batched_tokens`` (default 512 then,
            vLLM v0's), decodes first.
        schedule_first: which part of a step the scheduler fills first (``engine/core/scheduler.py``):
            "prefills" (vLLM v0's default from 0.2 on: waiting prompts first with the whole token
            budget; a step that admits any runs no decodes) or "decodes" (vLLM v1's, and the paper
            prototype's: running decodes first, prompts get the budget left). None (default) = "prefills" with
            whole prompts, "decodes" with chunked prefill; :attr:`scheduler_rule` gives the one used.
        shared_prefix: tokens of a prefix every prompt begins with (a system prompt, few-shot
            examples; paper §4.4 and §6.4), before the workload's own prompt lengths; 0 = none. The
            simulator then carries token ids for the prompts: the prefix has the same ids in every
            request, the rest unique ids (outputs carry none, so they never hit). With the paged
            allocator prefix caching is on (``engine/core/prefix_cache.py``, the engine's own code) and
            every step goes through ``Scheduler.schedule()``; the contiguous allocator stores the
            prefix in every request's range.
        record_steps: keep a :class:`~engine.report.StepReport` per step in
            ``SimulationResult.step_reports`` (what ran, who waited and why, the pool's usage, the
            step's start and duration on the simulated clock, arrivals), for the per-request timeline
            (``engine/timeline.py``). Every step then goes through ``Scheduler.schedule()``. The
            simulator has no token ids: a sampled token is reported as id -1. Meant for small runs:
            a report names every waiting request.
        scheduler_cls: a :class:`~engine.core.scheduler.Scheduler` subclass to schedule with (vLLM's
            ``--scheduler-cls``), e.g. one that overrides ``order_waiting`` (the open lab's policy);
            None = the engine's. Continuous batching only; every step then goes through
            ``schedule()`` (no lock-step fast path).
        enable_prefix_caching, prefix_cache, scheduling_policy, lpm_max_wait_steps, kv_offload_blocks:
            as :class:`~engine.EngineConfig`'s (engine/config.py). ``enable_prefix_caching`` None
            (default) = on with the paged allocator when the prompts carry token ids (``shared_prefix``,
            the "multiturn" and "fewshot" workloads, requests with ``token_ids``), else off.
        kv_cache_spec: each layer's KV cache spec (``engine/core/kv_cache_interface.py``: full attention
            or a sliding window), for a hybrid model's KV cache manager: the layers grouped as vLLM v1
            groups them, one block table per group (``engine/core/kv_cache_coordinator.py``). Then
            ``kv_slots`` are token slots of the pool's pages (a page holds ``group_size`` layers), the
            paged allocator and continuous batching only, every step through ``Scheduler.schedule()``.
            None: one group, the allocator as always.
        kv_role: vLLM's ``kv_role`` of this instance under prefill/decode disaggregation (DistServe,
            Splitwise; ``engine/sim/disagg.py`` runs the instances): "kv_both" (default) prefills and
            decodes; "kv_producer" (a prefill instance) ends every request after its prefill, whose
            step samples the first token, and hands its KV on; "kv_consumer" (a decode instance)
            receives each prompt's K and V computed, so the step that admits a request computes one
            token over its context, a decode's cost (``engine.sim.clock.LoadedKVClock``). Both need
            one-sequence requests, whole prompts, recompute preemption and no prefix caching.
    """

    workload: str = "sharegpt"
    num_requests: int = 1000
    request_rate: float | None = None
    trace: str | None = None
    requests: list[Request] | None = field(default=None, repr=False)
    kv_slots: int = 15_700
    block_size: int = 16
    watermark: float = 0.01
    allocator: str = "paged"
    reservation: str = "max"
    placement: str = "first-fit"
    policy: str = "continuous"
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None
    max_model_len: int = 2048
    step_ms: float = 50.0
    cost_model: str | CostModel | None = None
    seed: int = 0
    fast_forward: bool = True
    progress: bool = False
    n: int = 1
    beam_width: int = 1
    shared_prefix: int = 0
    preemption_mode: str = "recompute"
    swap_slots: int | None = None
    enable_chunked_prefill: bool = False
    schedule_first: str | None = None
    record_steps: bool = False
    scheduler_cls: type | None = field(default=None, repr=False)
    enable_prefix_caching: bool | None = None
    prefix_cache: str = "hash"
    scheduling_policy: str = "fcfs"
    lpm_max_wait_steps: int = DEFAULT_LPM_MAX_WAIT_STEPS
    kv_offload_blocks: int = 0
    kv_cache_spec: dict | None = field(default=None, repr=False)
    kv_role: str = "kv_both"

    @property
    def prefix_caching(self) -> bool:
        """Whether this run caches prefixes (``enable_prefix_caching`` with None resolved)."""
        if self.enable_prefix_caching is not None:
            return self.enable_prefix_caching
        carries_ids = self.shared_prefix > 0 or (self.requests is None and self.trace is None and self.workload in TOKEN_WORKLOADS) \
            or any(r.token_ids is not None for r in self.requests or ())
        return self.allocator == "paged" and carries_ids

    @property
    def scheduler_rule(self) -> str:
        """The ``schedule_first`` rule this run uses ("prefills" or "decodes"), None resolved."""
        if self.schedule_first is not None:
            return self.schedule_first
        return "decodes" if self.enable_chunked_prefill else "prefills"

    def __post_init__(self) -> None:
        if self.schedule_first is not None:
            check_schedule_first(self.schedule_first, self.enable_chunked_prefill)
        if self.preemption_mode not in PREEMPTION_MODES:
            raise ValueError(f"preemption_mode must be one of {', '.join(PREEMPTION_MODES)}; got {self.preemption_mode!r}")
        if self.preemption_mode == "swap" and self.allocator != "paged":
            raise ValueError("preemption_mode='swap' needs allocator='paged' (the paper swaps KV blocks)")
        if self.swap_slots is not None and self.swap_slots < self.block_size:
            raise ValueError(f"swap_slots ({self.swap_slots}) must hold at least one block of {self.block_size} slots")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= max_num_seqs ({self.max_num_seqs})")
        if (self.max_num_batched_tokens is not None and not self.enable_chunked_prefill
                and self.max_num_batched_tokens < self.max_model_len):
            raise ValueError(f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= max_model_len "
                             f"({self.max_model_len}) without chunked prefill")
        if self.beam_width != 1 and self.beam_width not in BEAM_PARENTS:
            raise ValueError(f"beam_width must be 1 or one of the calibrated widths {sorted(BEAM_PARENTS)}, got {self.beam_width!r}")
        if self.beam_width > 1 and self.n > 1:
            raise ValueError("give either n (parallel sampling) or beam_width (beam search), not both")
        if isinstance(self.n, bool) or not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"n (parallel samples) must be an integer >= 1, got {self.n!r}")
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}; got {self.policy!r}")
        if self.policy == "static" and (self.n > 1 or self.beam_width > 1 or self.shared_prefix
                                        or self.preemption_mode != "recompute" or self.enable_chunked_prefill):
            raise ValueError("static batching is simulated for one-sequence requests without a shared prefix, "
                             "with recompute preemption and whole prompts only")
        if self.allocator not in ALLOCATORS:
            raise ValueError(f"allocator must be one of {', '.join(ALLOCATORS)}; got {self.allocator!r}")
        if self.kv_cache_spec is not None and (self.allocator != "paged" or self.policy != "continuous"):
            raise ValueError("kv_cache_spec (a hybrid KV cache) needs the paged allocator and continuous batching")
        if self.kv_cache_spec is not None and {s.block_size for s in self.kv_cache_spec.values()} != {self.block_size}:
            raise ValueError(f"every layer's KV cache spec must have block_size {self.block_size}")
        for name in ("num_requests", "block_size", "max_num_seqs", "max_model_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.kv_slots < self.block_size:
            raise ValueError(f"the KV pool ({self.kv_slots} slots) is smaller than one block ({self.block_size} slots)")
        if self.max_model_len > self.kv_slots // self.block_size * self.block_size:
            raise ValueError(f"max_model_len {self.max_model_len} exceeds the KV pool ({self.kv_slots} slots)")
        if not 0 <= self.watermark < 1:
            raise ValueError(f"watermark must be a share of the blocks in [0, 1), got {self.watermark}")
        if not self.step_ms > 0:
            raise ValueError(f"step_ms must be > 0 ms, got {self.step_ms}")
        if isinstance(self.shared_prefix, bool) or not isinstance(self.shared_prefix, int) or not 0 <= self.shared_prefix < self.max_model_len:
            raise ValueError(f"shared_prefix must be a number of tokens in [0, max_model_len), got {self.shared_prefix!r}")
        if self.request_rate is not None and not self.request_rate > 0:
            raise ValueError(f"request_rate must be > 0 requests/s, got {self.request_rate}")
        resolve_cost_model(self.cost_model, self.step_ms)  # an unknown preset fails here, by name
        if self.enable_prefix_caching is not None and not isinstance(self.enable_prefix_caching, bool):
            raise ValueError(f"enable_prefix_caching must be True, False or None, got {self.enable_prefix_caching!r}")
        check_prefix_cache_options(self.prefix_caching, self.allocator, self.prefix_cache, self.scheduling_policy,
                                   self.kv_offload_blocks, self.lpm_max_wait_steps)
        if self.shared_prefix and self.requests is None and self.trace is None and self.workload in TOKEN_WORKLOADS:
            raise ValueError(f"shared_prefix is for the length workloads; the {self.workload!r} workload has its own prompts' token ids")
        if self.kv_role not in KV_ROLES:
            raise ValueError(f"kv_role must be one of {', '.join(KV_ROLES)}; got {self.kv_role!r}")
        if self.kv_role != "kv_both" and (self.n > 1 or self.beam_width > 1 or self.enable_chunked_prefill or self.prefix_caching
                                          or self.preemption_mode != "recompute" or self.policy != "continuous"):
            raise ValueError(f"kv_role={self.kv_role!r} is simulated for one-sequence requests, whole prompts, recompute "
                             "preemption, continuous batching and no prefix caching")


@dataclass
class SimulationResult:
    """Summary and time series of one simulation.

    Summary (time averages are over all steps, idle ones included):
        token_state_fraction: share of the pool holding token states, 0..1.
        fragmentation: share of the pool in each category of ``engine.core.accounting.CATEGORIES``.
        mean_concurrent_requests, max_concurrent_requests: requests running per step.
        preemptions: preemptions, by recompute or swap. completed: finished requests. rejected: requests that
            could never fit the pool. steps: scheduler iterations. simulated_seconds: the clock at
            the end (``engine/sim/clock.py``). wall_seconds: real time the simulation took.
        normalized_latency_s (s/token, the paper's metric), mean_latency_s, mean_ttft_s, mean_tpot_s:
            over completed requests; throughput_requests_per_s, throughput_tokens_per_s (output
            tokens): over the simulated time. request_latency_s, request_ttft_s: per request (NaN if
            not completed).
        memory_saved_by_sharing: paper §6.3 over the run: 1 - (physical blocks held) / (blocks the
            sequences' tables would hold unshared), both summed over steps; 0 without sharing.
        swap_outs, swap_ins: requests swapped out / in. blocks_swapped_out, blocks_swapped_in: blocks
            copied each way. swap_fallbacks: swap preemptions that recomputed (CPU pool full).
        tokens_recomputed: tokens whose KV a recompute preemption threw away (computed again later).

    Series (run-length encoded: row i covers ``series_num_steps[i]`` steps from ``series_step[i]``,
    during which nothing but lock-step decode happened; one row per step without fast-forward):
        series_step, series_num_steps, series_running, series_waiting: numpy int arrays.
        series_end_s: the simulated clock at the end of each row (s).
        series_memory: category -> numpy float array, mean slots per step over the row.

    step_reports: with ``SimulationConfig.record_steps``, one StepReport per step, oldest first; else empty.
    """

    config: SimulationConfig
    token_state_fraction: float
    fragmentation: dict[str, float]
    mean_concurrent_requests: float
    max_concurrent_requests: int
    preemptions: int
    completed: int
    rejected: int
    steps: int
    simulated_seconds: float
    wall_seconds: float
    memory_saved_by_sharing: float
    swap_outs: int
    swap_ins: int
    blocks_swapped_out: int
    blocks_swapped_in: int
    swap_fallbacks: int
    tokens_recomputed: int
    normalized_latency_s: float
    mean_latency_s: float
    mean_ttft_s: float
    mean_tpot_s: float
    throughput_requests_per_s: float
    throughput_tokens_per_s: float
    request_latency_s: np.ndarray
    request_ttft_s: np.ndarray
    series_step: np.ndarray
    series_num_steps: np.ndarray
    series_running: np.ndarray
    series_waiting: np.ndarray
    series_end_s: np.ndarray
    series_memory: dict[str, np.ndarray]
    step_reports: list[StepReport] = field(default_factory=list)
    prefill_tokens_computed: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    kv_offloaded_blocks: int = 0
    kv_loaded_blocks: int = 0
    kv_dropped_blocks: int = 0

    @property
    def prefix_cache_hit_rate(self) -> float:
        """Prompt tokens found cached / prompt tokens looked up, first prefills (0..1; 0 without caching)."""
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0

    def ttft_percentile_s(self, q: float) -> float:
        """The q-th percentile (0..100) of the completed requests' time to first token, in seconds."""
        ttft = self.request_ttft_s[~np.isnan(self.request_ttft_s)]
        return float(np.percentile(ttft, q)) if ttft.size else float("nan")

    def saturated(self) -> tuple[dict[str, float], float]:
        """(share per category, mean running requests) over the steps in which requests were
        waiting: the pool under sustained load, without the ramp-down at the end of a finite batch
        (when the queue is empty the pool drains, which no serving system under load sees)."""
        mask = self.series_waiting > 0
        if not mask.any():
            return dict(self.fragmentation), self.mean_concurrent_requests
        weights = self.series_num_steps[mask]
        total = weights.sum()
        capacity = sum(float(self.series_memory[c][0]) for c in CATEGORIES)
        shares = {c: float((self.series_memory[c][mask] * weights).sum() / (total * capacity)) for c in CATEGORIES}
        return shares, float((self.series_running[mask] * weights).sum() / total)

    @property
    def token_state_share_of_in_use(self) -> float:
        """Token states as a share of the memory in use (all steps; the pool less its free slots,
        ``engine.core.accounting.in_use_shares``): the measure of the paper's Figure 2."""
        return in_use_shares(self.fragmentation)["token_states"]

    def mean_running_until(self, seconds: float) -> float:
        """Mean running requests per step over the steps that end by ``seconds`` (e.g. the last
        arrival: the load the arrivals sustain, without the final drain of a finite trace)."""
        mask = self.series_end_s <= seconds
        if not mask.any():
            return self.mean_concurrent_requests
        weights = self.series_num_steps[mask]
        return float((self.series_running[mask] * weights).sum() / weights.sum())

    def summary(self) -> dict:
        """The summary fields and the config (without the requests), JSON-ready."""
        config = {f.name: getattr(self.config, f.name) for f in fields(self.config) if f.name != "requests"}
        if isinstance(config["cost_model"], CostModel):
            config["cost_model"] = config["cost_model"].name
        if config["scheduler_cls"] is not None:
            config["scheduler_cls"] = config["scheduler_cls"].__qualname__
        config["scheduler_rule"] = self.config.scheduler_rule  # schedule_first with None resolved
        for name in _SHOWN_WHERE_SET:  # shown where set: a run without them reads as it always did
            if config[name] == SimulationConfig.__dataclass_fields__[name].default:
                del config[name]
        keys = ("token_state_fraction", "token_state_share_of_in_use", "fragmentation", "mean_concurrent_requests", "max_concurrent_requests",
                "preemptions", "completed", "rejected", "steps", "simulated_seconds", "wall_seconds",
                "memory_saved_by_sharing", "swap_outs", "swap_ins", "blocks_swapped_out", "blocks_swapped_in",
                "swap_fallbacks", "tokens_recomputed", "normalized_latency_s", "mean_latency_s", "mean_ttft_s", "mean_tpot_s",
                "throughput_requests_per_s", "throughput_tokens_per_s")
        if self.config.prefix_caching:
            keys += ("prefix_cache_hit_rate", "prefill_tokens_computed")
        if self.config.kv_offload_blocks:
            keys += ("kv_offloaded_blocks", "kv_loaded_blocks", "kv_dropped_blocks")
        return {"config": config, **{k: getattr(self, k) for k in keys}}

    def write_trace(self, path: str) -> None:
        """Write the series as CSV: step, num_steps, running, waiting, then mean slots per category."""
        header = "step,num_steps,running,waiting," + ",".join(CATEGORIES)
        cols = [self.series_step, self.series_num_steps, self.series_running, self.series_waiting]
        table = np.column_stack(cols + [self.series_memory[c] for c in CATEGORIES])
        fmt = ["%d"] * 4 + ["%.2f"] * len(CATEGORIES)
        np.savetxt(path, table, fmt=fmt, delimiter=",", header=header, comments="")


_SHOWN_WHERE_SET = ("enable_prefix_caching", "prefix_cache", "scheduling_policy", "lpm_max_wait_steps", "kv_offload_blocks",
                        "kv_role")


def make_kv_manager(cfg: SimulationConfig) -> KVCacheManager:
    """The allocator the config names, over ``kv_slots // block_size`` blocks. Its events go
    nowhere: on 100,000 requests they would be millions of objects nobody reads."""
    num_blocks = cfg.kv_slots // cfg.block_size
    if cfg.allocator == "paged":
        num_cpu_blocks = (cfg.kv_slots if cfg.swap_slots is None else cfg.swap_slots) // cfg.block_size if cfg.preemption_mode == "swap" else 0
        kv_cache_config = get_kv_cache_config(cfg.kv_cache_spec, num_blocks) if cfg.kv_cache_spec is not None else None
        chunk = (cfg.max_num_batched_tokens or default_max_num_batched_tokens(True, cfg.max_num_seqs, cfg.max_model_len)
                 if cfg.enable_chunked_prefill else None)
        return make_kv_cache_manager(kv_cache_config, num_blocks, cfg.block_size, chunk, watermark=cfg.watermark, enable_caching=cfg.prefix_caching,
                                     num_cpu_blocks=num_cpu_blocks, events=NullEventLog(), prefix_cache=cfg.prefix_cache,
                                     kv_offload_blocks=cfg.kv_offload_blocks)
    return ContiguousAllocator(num_blocks, cfg.block_size, cfg.reservation, cfg.placement, cfg.max_model_len, events=NullEventLog())


# How beams branch, measured on the real engine's beam search (default model, 4 chat prompts, 32 tokens,
# ignore_eos): per beam width, the share of decode steps whose survivors come from k distinct parents.
# Command: python -m engine.tools.beam_calibration --num-prompts 4 --max-tokens 32
BEAM_PARENTS: dict[int, dict[int, float]] = {
    2: {1: 0.267, 2: 0.733},
    4: {1: 0.025, 2: 0.15, 3: 0.475, 4: 0.35},
    6: {1: 0.008, 2: 0.042, 3: 0.1, 4: 0.25, 5: 0.433, 6: 0.167},
}

_NO_SAMPLING = SamplingParams()  # one shared, unused object: no model samples in the simulator


class _Run:
    """The state of one simulation: the scheduler, the arrival queue and the running totals."""

    def __init__(self, cfg: SimulationConfig, requests: list[Request]):
        self.cfg = cfg
        self.kv = make_kv_manager(cfg)
        # A hybrid KV cache holds fewer tokens of one request than it has slots (as the engine caps max_model_len).
        hybrid = isinstance(self.kv, HybridKVCacheCoordinator)
        self.max_model_len = min(cfg.max_model_len, self.kv.longest_request()) if hybrid else cfg.max_model_len
        max_batched = cfg.max_num_batched_tokens or default_max_num_batched_tokens(cfg.enable_chunked_prefill, cfg.max_num_seqs,
                                                                                    cfg.max_model_len)
        # The simulator picks the path itself: the lock-step fast path exists for one policy only:
        # one-sequence requests, recompute, whole prompts, no prefix caching.
        self.lockstep = (cfg.fast_forward and cfg.scheduler_cls is None and cfg.n == 1 and cfg.beam_width == 1
                         and not cfg.prefix_caching and cfg.preemption_mode == "recompute" and not cfg.enable_chunked_prefill
                         and not cfg.record_steps and cfg.kv_cache_spec is None)
        if cfg.kv_role == "kv_producer":  # a prefill instance: the prefill samples the first token, then the KV leaves
            requests = [replace(r, output_len=1) for r in requests]
        self.requests = sorted(requests, key=lambda r: r.arrival)
        clock = LoadedKVClock if cfg.kv_role == "kv_consumer" else SimClock
        self.clock = clock(cfg.cost_model, cfg.step_ms, self.requests, self.kv)
        if self.lockstep:
            self.sched = LockstepScheduler(self.kv, cfg.max_num_seqs, max_batched, schedule_first=cfg.scheduler_rule,
                                           policy=cfg.policy, on_batch_end=self.clock.return_together)
        elif cfg.policy == "static":  # recompute, whole prompts (SimulationConfig checks it)
            self.sched = StaticBatchScheduler(self.kv, cfg.max_num_seqs, max_batched, on_batch_end=self.clock.return_together)
        else:
            self.sched = (cfg.scheduler_cls or Scheduler)(self.kv, cfg.max_num_seqs, max_batched, cfg.preemption_mode,
                                                          cfg.enable_chunked_prefill, cfg.scheduler_rule, cfg.scheduling_policy,
                                                          cfg.lpm_max_wait_steps)
        # The scheduler that holds the queues (in lock-step mode the wrapped one: no property between, per round)
        self.queues = self.sched.scheduler if self.lockstep else self.sched
        if not self.lockstep:  # why each waiting request waits: a pass over the queue per step, only when recorded
            self.sched.report_waiting = cfg.record_steps
        self.prefill_tokens_computed = 0
        self.sampling = SamplingParams(n=cfg.n)
        self.beam = BeamSearchParams(cfg.beam_width) if cfg.beam_width > 1 else None
        self.rng = random.Random(cfg.seed)
        self.next_seq_id = 0
        self.blocks_with_sharing = self.blocks_without_sharing = 0
        self.next_request = 0
        self.step = 0
        self.preemptions = self.completed = self.rejected = 0
        self.swap_outs = self.swap_ins = self.blocks_swapped_out = self.blocks_swapped_in = self.tokens_recomputed = 0
        # The series rows one after the other, each: step, num_steps, running, waiting, the clock (ps) at its end, then
        # CATEGORIES (~360,000 rows on 100,000 requests: one flat list, no tuple per row).
        self.rows: list[int] = []
        self.bar = tqdm(total=len(requests), disable=not cfg.progress, unit="req", mininterval=0.5)
        self.step_reports: list[StepReport] = []
        self.arrived: dict[int, float] = {}  # record_steps: requests queued since the last step, at their arrival (ms)

    def run(self) -> None:
        if not self.lockstep:
            self._run_single_steps()
            return
        # ~360,000 rounds on 100,000 requests: once every request has arrived the loop skips the arrival checks.
        sched, queues, num_requests = self.sched, self.queues, len(self.requests)
        while self.next_request < num_requests or queues.running or queues.waiting:
            if self.next_request < num_requests:
                self._arrive()
                if not (queues.running or queues.waiting):
                    self._idle_until_next_arrival()
                    continue
            k = sched.steps_until_event(sys.maxsize)
            if k == 0:
                self._lockstep_step()
                continue
            if self.next_request < num_requests:
                k = self.clock.decode_steps_before_next_arrival(sched, k, self.next_request)
            self._fast_forward(k)
        self.bar.close()

    def _run_single_steps(self) -> None:
        """The reference: every step through ``schedule()``."""
        while self.next_request < len(self.requests) or self.sched.has_unfinished():
            self._arrive()
            if self.sched.has_unfinished():
                self._single_step()
            else:
                self._idle_until_next_arrival()
        self.bar.close()

    def _arrive(self) -> None:
        """Queue every request that has arrived by the start of this step."""
        if self.next_request == len(self.requests):
            return
        while self.next_request < len(self.requests) and self.clock.has_arrived(self.next_request):
            r = self.requests[self.next_request]
            seq = self._sequence(r)
            if not self.lockstep:  # a request is a sequence group; the lock-step path keeps the bare sequence
                seq = SequenceGroup(self.next_request, [seq], self.sampling, beam_search=self.beam, arrival_time=r.arrival)
            self.next_request += 1
            if seq.seqs[0].max_len > self.max_model_len or not self.kv.fits_ever(seq):
                self.rejected += 1  # it could never run (the engine rejects it too)
                self.bar.update(1)
            else:
                self.sched.add(seq)
                if self.cfg.record_steps:
                    self.arrived[self.next_request - 1] = r.arrival * 1e3

    def _sequence(self, r: Request) -> Sequence:
        """A request's sequence; with a shared prefix, its prompt's token ids (prefix ids 0..P-1,
        then ids no other request has)."""
        prefix = self.cfg.shared_prefix
        num_prompt = prefix + r.prompt_len
        seq = Sequence(self.next_request, num_prompt, num_prompt + r.output_len, arrival_time=r.arrival,
                       sampling_params=_NO_SAMPLING, seq_id=self._seq_id())
        if prefix and self.cfg.allocator == "paged":
            start = prefix + self.next_request * self.cfg.max_model_len
            seq.token_ids = list(range(prefix)) + list(range(start, start + r.prompt_len))
        elif r.token_ids is not None and self.cfg.allocator == "paged":  # prompt and output ids: decoded blocks are cached too
            seq.token_ids = list(r.token_ids)
        return seq

    def _idle_until_next_arrival(self) -> None:
        k = self.clock.idle_until(self.next_request)
        if k:  # the fixed clock counts idle steps; a cost model's clock jumps (idle is not a step)
            sums = dict.fromkeys(CATEGORIES, 0)
            sums["free"] = k * self.kv.num_slots
            self._record(k, sums, running=0)

    def _single_step(self) -> None:
        """One step through the engine's ``schedule()``, every request touched (the reference)."""
        out = self.sched.schedule()
        if out.is_empty:
            raise RuntimeError("the scheduler ran nothing although requests wait (pool too small?)")
        shape = self.clock.shape_of(out)
        self.prefill_tokens_computed += shape.prefill_tokens
        self._count_preemptions(out)
        start, step, scheduled = self.clock.now, self.step, out.scheduled_requests() if self.cfg.record_steps else []
        ready = {id(s) for s in self.sched.update_from_output(out)}  # a partial prefill samples nothing
        self.clock.run_step(shape, [s for s in out.prefill_seqs if id(s) in ready])
        decoded = {id(s) for s in out.decode_seqs}
        sampled = []
        for group in self.sched.running:
            if id(group.seqs[0]) not in ready:
                continue
            sampled.append(group.request_id)
            if len(group.seqs) < group.num_samples:  # after the prompt's one prefill
                fork_samples(group, self.sched.fork, self._seq_id)
            elif group.beam_search is not None and id(group.seqs[0]) in decoded:
                self._branch_beams(group)
            for seq in group.unfinished_seqs():
                seq.append_token()
        usage = self.kv.usage(self.sched.running, self._next_waiting())
        self.blocks_with_sharing += usage.blocks_with_sharing
        self.blocks_without_sharing += usage.blocks_without_sharing
        self._record(1, {c: getattr(usage, c) for c in CATEGORIES}, len(self.sched.running))
        # Every sample has the request's length, so a group's sequences finish together.
        done = [g for g in self.sched.running if g.seqs[0].num_tokens >= g.seqs[0].max_len]
        self._finish(done)
        if self.cfg.record_steps:
            self.step_reports.append(StepReport(
                step=step, phase=out.phase, scheduled=scheduled, new_token_ids={rid: [-1] for rid in sampled}, new_text={},
                finished={g.request_id: "length" for g in done}, preempted=[g.request_id for g in out.preempted], events=[],
                block_tables=[], kv_groups=self.kv.kv_groups(self.sched.running), memory=usage, timings_ms={"total": (self.clock.now - start) / 1e9},
                swapped=[g.request_id for g in self.sched.swapped], swapped_out=[g.request_id for g in out.swapped_out],
                swapped_in=[g.request_id for g in out.swapped_in], waiting=out.waiting, start_ms=start / 1e9, arrived=self.arrived,
                admissions=list(out.admissions) if out.admission_reasons is not None else None, passed_over=dict(out.passed_over)))
            self.arrived = {}

    def _count_preemptions(self, out: SchedulerOutput) -> None:
        self.preemptions += len(out.preempted)
        swapped = {id(g) for g in out.swapped_out}
        self.tokens_recomputed += sum(s.num_tokens for g in out.preempted if id(g) not in swapped for s in g.unfinished_seqs())
        self.swap_outs += len(out.swapped_out)
        self.swap_ins += len(out.swapped_in)
        self.blocks_swapped_out += len(out.blocks_to_swap_out)
        self.blocks_swapped_in += len(out.blocks_to_swap_in)

    def _branch_beams(self, group: SequenceGroup) -> None:
        """One beam-search step of the model in ``SimulationConfig.beam_width``'s docstring."""
        beams = group.unfinished_seqs()
        shares = BEAM_PARENTS[len(beams)] if len(beams) in BEAM_PARENTS else {len(beams): 1.0}
        k = self.rng.choices(list(shares), weights=list(shares.values()))[0]
        for pruned in beams[k:]:
            self.sched.finish_seq(pruned, "pruned")
        group.seqs = beams[:k]
        for index in range(k, len(beams)):
            child = beams[0].fork(self._seq_id(), index)
            self.sched.fork(beams[0], child)
            group.seqs.append(child)

    def _seq_id(self) -> int:
        self.next_seq_id += 1
        return self.next_seq_id - 1

    def _lockstep_step(self) -> None:
        """The same step in lock-step mode: only the requests something happens to are touched."""
        sched = self.sched
        out = sched.lockstep_step()
        running = len(self.queues.running)
        if not running:
            raise RuntimeError("the scheduler ran nothing although requests wait (pool too small?)")
        if out.preempted:  # by recompute: no swap in lock-step mode
            self.preemptions += len(out.preempted)
            self.tokens_recomputed += sum(seq.num_tokens for seq in out.preempted)
        sums = sched.lockstep_usage(self._next_waiting())
        if out.prefill_seqs:
            shape = self.clock.lockstep_shape(out, sums, running, sched.last_step_decoded(out))
            self.prefill_tokens_computed += shape.prefill_tokens
            self.clock.run_step(shape, out.prefill_seqs)
        else:  # a decode step (one that preempted): the closed form of a one-step stretch, the same picoseconds
            self.clock.run_decode_steps(1, running, sums)
        self._record(1, sums, running)
        if sched.finish_due():
            self._finish(sched.lockstep_finished())

    def _fast_forward(self, k: int) -> None:
        sched = self.sched
        sums = sched.lockstep_decode(k, self._next_waiting())
        running = len(self.queues.running)
        self.clock.run_decode_steps(k, running, sums)
        self._record(k, sums, running)
        if sched.finish_due():
            self._finish(sched.lockstep_finished())

    def _next_waiting(self) -> Sequence | None:
        waiting = self.queues.waiting
        return waiting[0] if waiting else None

    def _finish(self, done: list[Sequence]) -> None:
        if not done:
            return
        for seq in done:
            self.sched.finish(seq, "length")
            self.clock.finished(seq.request_id)
        self.completed += len(done)
        self.bar.update(len(done))

    def _record(self, k: int, sums: dict[str, int], running: int) -> None:
        """One series row: k steps with ``running`` requests, ``sums`` slot-steps per category
        (in CATEGORIES order). Totals are summed from the rows at the end (see result)."""
        self.rows.extend((self.step, k, running, len(self.queues.waiting), self.clock.now))
        self.rows.extend(sums.values())
        self.step += k

    def result(self, wall_seconds: float) -> SimulationResult:
        steps = max(self.step, 1)
        slot_steps = steps * self.kv.num_slots
        width = 5 + len(CATEGORIES)
        rows = np.fromiter(self.rows, dtype=np.int64, count=len(self.rows)).reshape(-1, width)
        num_steps, running = rows[:, 1], rows[:, 2]
        memory = {c: rows[:, 5 + i] for i, c in enumerate(CATEGORIES)}
        totals = {c: int(column.sum()) for c, column in memory.items()}  # exact integer sums
        stats = getattr(self.sched, "prefix_cache_stats", None)
        offload = getattr(self.kv, "offload", None)
        return SimulationResult(
            config=self.cfg,
            token_state_fraction=totals["token_states"] / slot_steps,
            fragmentation={c: totals[c] / slot_steps for c in CATEGORIES},
            mean_concurrent_requests=int((num_steps * running).sum()) / steps,
            max_concurrent_requests=int(running.max(initial=0)),
            preemptions=self.preemptions,
            completed=self.completed,
            rejected=self.rejected,
            steps=self.step,
            simulated_seconds=self.clock.seconds,
            wall_seconds=wall_seconds,
            memory_saved_by_sharing=1 - self.blocks_with_sharing / self.blocks_without_sharing if self.blocks_without_sharing else 0.0,
            swap_outs=self.swap_outs, swap_ins=self.swap_ins, blocks_swapped_out=self.blocks_swapped_out,
            blocks_swapped_in=self.blocks_swapped_in, swap_fallbacks=self.sched.num_swap_fallbacks,
            tokens_recomputed=self.tokens_recomputed,
            **self.clock.latency_metrics(),
            prefill_tokens_computed=self.prefill_tokens_computed,
            prefix_cache_queries=stats.queries if stats else 0,
            prefix_cache_hits=stats.hits if stats else 0,
            **({} if offload is None else dict(kv_offloaded_blocks=offload.num_offloaded, kv_loaded_blocks=offload.num_loaded,
                                               kv_dropped_blocks=offload.num_dropped)),
            series_step=rows[:, 0],
            series_num_steps=num_steps,
            series_running=running,
            series_waiting=rows[:, 3],
            series_end_s=rows[:, 4].astype(np.float64) / 1e12,
            series_memory={c: column / np.maximum(num_steps, 1) for c, column in memory.items()},
            step_reports=self.step_reports,
        )


def simulate(config: SimulationConfig | None = None, **kwargs) -> SimulationResult:
    """Run one simulation.

    Args:
        config: a :class:`SimulationConfig`; keyword arguments override its fields (or build one).

    Returns:
        A :class:`SimulationResult`.

    Raises:
        ValueError: on a bad configuration, workload or trace (the message says which).
    """
    cfg = replace(config, **kwargs) if config is not None else SimulationConfig(**kwargs)
    start = time.perf_counter()
    if cfg.requests is not None:
        requests = list(cfg.requests)
    elif cfg.trace is not None:
        requests = load_trace(cfg.trace)
    else:
        requests = make_workload(cfg.workload, cfg.num_requests, cfg.seed, cfg.max_model_len, cfg.request_rate)
    if not requests:
        raise ValueError("no requests to simulate")
    run = _Run(cfg, requests)
    with _cyclic_gc_paused():
        run.run()
        result = run.result(time.perf_counter() - start)
        # The run's rows and requests go by reference counting now: once the collector is back, its
        # first pass would walk every object made while it was paused.
        del run, requests
    return result


@contextmanager
def _cyclic_gc_paused():
    """Pause Python's cycle collector during a run: the run keeps ~100,000 live Sequences and makes
    millions of short-lived tuples, and every full collection walks all of them (~20% of the run
    time). Nothing here makes reference cycles, so reference counting alone frees it all."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


# --- Command line --------------------------------------------------------------------------------------


def _kv_slots(args: argparse.Namespace) -> int:
    """Slots from --kv-slots, or --kv-bytes over the bytes of one token's K and V in all layers."""
    if args.kv_bytes is None:
        if args.kv_slots is not None:
            return args.kv_slots
        return get_setup(args.cost_model).kv_slots if args.cost_model else 15_700
    bytes_per_slot = kv_bytes_per_slot(args.num_layers, args.num_kv_heads, args.head_dim, kv_cache_element_bytes(args.kv_cache_dtype, args.dtype_bytes))
    if bytes_per_slot < 1:
        raise ValueError("model dimensions must be positive to turn --kv-bytes into slots")
    return args.kv_bytes // bytes_per_slot


def _swap_slots(args: argparse.Namespace) -> int | None:
    """Slots of the CPU swap space from --swap-space GiB (with the model dimensions), or None."""
    if args.swap_space is None:
        return None
    if args.swap_space <= 0:
        raise ValueError(f"--swap-space must be > 0 GiB, got {args.swap_space}")
    bytes_per_slot = kv_bytes_per_slot(args.num_layers, args.num_kv_heads, args.head_dim, kv_cache_element_bytes(args.kv_cache_dtype, args.dtype_bytes))
    return int(args.swap_space * 2**30) // bytes_per_slot


def _cmd_simulate(args: argparse.Namespace) -> None:
    result = simulate(
        workload=args.workload, num_requests=args.num_requests, request_rate=args.request_rate, trace=args.trace,
        kv_slots=_kv_slots(args), block_size=args.block_size, watermark=args.watermark, allocator=args.allocator,
        reservation=args.reservation, placement=args.placement, policy=args.policy, max_num_seqs=args.max_num_seqs,
        max_model_len=args.max_model_len, step_ms=args.step_ms, cost_model=args.cost_model, seed=args.seed,
        fast_forward=not args.no_fast_forward, progress=not args.json, n=args.n, beam_width=args.beam_width,
        shared_prefix=args.shared_prefix, preemption_mode=args.preemption_mode, swap_slots=_swap_slots(args),
        enable_chunked_prefill=args.enable_chunked_prefill, max_num_batched_tokens=args.max_num_batched_tokens,
        schedule_first=args.schedule_first, record_steps=bool(args.chrome_trace), enable_prefix_caching=args.enable_prefix_caching,
        **prefix_cache_kwargs(args),
    )
    if args.trace_out:
        result.write_trace(args.trace_out)
    if args.chrome_trace:
        from engine.timeline import write_chrome_trace

        write_chrome_trace(result.step_reports, args.chrome_trace, "python -m engine simulate")
    summary = result.summary()
    if args.json:
        print(json.dumps(summary, indent=2))
        return
    for key, value in summary.items():
        if key == "fragmentation":
            value = ", ".join(f"{c} {v:.1%}" for c, v in value.items())
        print(f"{key:>28}: {value}")


def register_cli(subparsers) -> None:
    """Add the ``simulate`` subcommand to an argparse subparsers object (``reproduce-paper``: engine/experiments/cli.py)."""
    p = subparsers.add_parser("simulate", help="simulate serving a workload on the scheduler and KV allocator alone")
    p.add_argument("--workload", choices=sorted([*WORKLOADS, *TOKEN_WORKLOADS]), default="sharegpt",
                   help="the requests' length distribution, or (multiturn, fewshot) prompts with token ids that share "
                        "prefixes (engine/sim/workloads.py; default: sharegpt)")
    p.add_argument("--num-requests", type=int, default=1000, help="requests drawn from the workload (default: 1000)")
    p.add_argument("--request-rate", type=float, default=None, help="Poisson arrivals, requests/s (default: all at once)")
    p.add_argument("--trace", default=None, help="JSONL trace with arrival, prompt_len, output_len per line")
    p.add_argument("--kv-slots", type=int, default=None,
                   help="token slots in the KV pool (default: the --cost-model preset's, else 15,700)")
    p.add_argument("--kv-bytes", type=int, default=None,
                   help="KV pool in bytes instead of --kv-slots, turned into slots with the four model dimensions below")
    p.add_argument("--num-layers", type=int, default=40, help="model dimension for --kv-bytes/--swap-space: layers (default: OPT-13B's 40)")
    p.add_argument("--num-kv-heads", type=int, default=40, help="model dimension: K/V heads per layer (default: OPT-13B's 40)")
    p.add_argument("--head-dim", type=int, default=128, help="model dimension: size of one head (default: OPT-13B's 128)")
    p.add_argument("--dtype-bytes", type=int, default=2, help="model dimension: bytes per K/V element (default: 2, fp16)")
    p.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES, default="auto",
                   help="with --kv-bytes/--swap-space: fp8 forms store 1 byte per K/V element instead of --dtype-bytes (default: auto)")
    p.add_argument("--block-size", type=int, default=16, help="token slots per KV block (default: vLLM's 16)")
    p.add_argument("--watermark", type=float, default=0.01,
                   help="paged: share of the blocks admission leaves free (vLLM's default 0.01)")
    p.add_argument("--allocator", choices=ALLOCATORS, default="paged",
                   help="paged = PagedAttention's blocks; contiguous = one reserved range per request (the paper's Orca)")
    p.add_argument("--reservation", choices=RESERVATIONS, default="max",
                   help="contiguous: the range reserved per request (engine/baselines/contiguous.py). max = --max-model-len slots "
                        "(Orca (Max)); pow2 = the prompt, plus its output length rounded up to a power of two (Orca (Pow2)); "
                        "pow2-total = the whole length, prompt and output together, rounded up to a power of two (the lab's "
                        "variant: it over-reserves the prompt too); oracle = exactly prompt + output (Orca (Oracle))")
    p.add_argument("--placement", choices=PLACEMENTS, default="first-fit",
                   help="contiguous: where a range goes; buddy = power-of-two chunks (the paper's Orca)")
    p.add_argument("--policy", choices=POLICIES, default="continuous",
                   help="static = a batch runs until its longest request finishes (FasterTransformer)")
    p.add_argument("--max-num-seqs", type=int, default=256, help="most requests running in one step (default: vLLM's 256)")
    p.add_argument("--max-model-len", type=int, default=2048,
                   help="longest request, prompt + output tokens: workload lengths are capped to it, longer trace requests "
                        "rejected (default: 2048)")
    p.add_argument("--step-ms", type=float, default=50.0, help="simulated duration of one step, ms (without --cost-model)")
    p.add_argument("--cost-model", choices=SETUPS, default=None,
                   help="time each step with this step-time preset (engine/sim/cost_model.py); this-machine needs `calibrate`")
    p.add_argument("--seed", type=int, default=0, help="seeds the workload's lengths and arrivals (default: 0)")
    p.add_argument("--no-fast-forward", action="store_true", help="step one by one (slow; same results)")
    p.add_argument("--n", type=int, default=1,
                   help="parallel sampling: sequences per request, sharing the prompt's blocks (runs step by step)")
    p.add_argument("--beam-width", type=int, default=1,
                   help="beam search with this many beams per request (calibrated widths: 2, 4, 6; runs step by step)")
    p.add_argument("--shared-prefix", type=int, default=0, metavar="TOKENS",
                   help="every prompt begins with the same TOKENS tokens (paged: prefix caching on; runs step by step)")
    p.add_argument("--preemption-mode", choices=PREEMPTION_MODES, default="recompute",
                   help="how a preempted request gives up its blocks (paper §4.5; swap runs step by step)")
    p.add_argument("--swap-space", type=float, default=None, metavar="GIB",
                   help="CPU swap space in GiB, with the model dimensions above (default: as large as the KV pool)")
    p.add_argument("--enable-chunked-prefill", action="store_true",
                   help="cut prompts to fit --max-num-batched-tokens, decodes first (runs step by step)")
    p.add_argument("--schedule-first", choices=SCHEDULE_FIRST, default=None,
help="prefills = vLLM v0's default scheduler (0.2 on): waiting prompts first with the whole token budget, "
                        "a step that admits any runs no decodes; decodes = vLLM v1's (and the paper prototype's): running "
                        "decodes first, prompts get the budget left (default: prefills with whole prompts, decodes with "
                        "--enable-chunked-prefill; reproduce-paper runs decodes with a 2,560-token budget, vLLM 0.1's)")
    p.add_argument("--max-num-batched-tokens", type=int, default=None,
                   help="the step's token budget (default: 512 with chunked prefill, else max(2048, max-model-len))")
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None,
                   help="prefix caching (default: on with the paged allocator when prompts carry token ids)")
    add_prefix_cache_args(p)
    p.add_argument("--json", action="store_true", help="print the summary as JSON (no progress bar)")
    p.add_argument("--trace-out", default=None, help="write the per-step series as CSV to this file")
    p.add_argument("--chrome-trace", default=None, metavar="OUT.json",
                   help="write the per-request timeline as a Chrome / Perfetto trace (one track per request, one slice per "
                        "step, simulated time); steps one by one, for small runs")
    p.set_defaults(func=_cmd_simulate)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m engine.sim.simulator", description=__doc__.split("\n")[0])
    register_cli(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    try:
        args.func(args)
    except ValueError as e:
        parser.error(str(e))


if __name__ == "__main__":
    main()
