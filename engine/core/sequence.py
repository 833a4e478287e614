"""Sequences and sequence groups, as the scheduler and the KV allocators see them (vLLM's
``Sequence`` and ``SequenceGroup``).

A *request* owns one or more *sequences* that share its prompt: one for ordinary generation, ``n``
for parallel sampling, ``beam_width`` live beams for beam search (PagedAttention paper §4.4). The
*sequence group* is what the scheduler schedules, preempts and frees as a unit (§4.5).

Every request is a :class:`SequenceGroup`, as in vLLM v0: the scheduler, the KV managers and the
engine see one shape, whether it holds one sequence or several. The one exception is the
simulator's lock-step path (``engine/sim/simulator.py``), which schedules a one-sequence request as
its bare :class:`Sequence` to save a group object per request over 100,000 of them: a ``Sequence``
answers the group interface the scheduler and the allocators read (``seqs``, ``unfinished_seqs()``,
``num_samples``, ``num_preemptions``, ``status``).

:func:`fork_samples` forks a group's samples after its prompt's one prefill; the engine, the
simulator and the tests all fork through it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Callable

from engine.sampling_params import BeamSearchParams, SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    SWAPPED = "swapped"  # preempted by swap: its KV blocks wait in the CPU pool (paper §4.5)
    WAITING_FOR_REMOTE_KVS = "waiting_for_remote_kvs"  # its blocks are allocated; a prefill instance's KV is being read into them (vLLM v1)
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    """A request's tokens and its place in the KV cache.

    Lengths are kept as counts so that the model-free simulator can run the same scheduler and
    allocators on 100,000 requests without holding their token ids; the engine also keeps
    ``token_ids``.

    Attributes:
        request_id: the engine's id for it.
        num_prompt_tokens: tokens in the prompt.
        num_tokens: prompt + output tokens so far (tokens).
        num_computed_tokens: tokens whose K and V are in the cache. After a step the newest sampled
            token is not yet cached: decode computes it next step. Preemption by recompute resets it to 0.
        max_len: the longest this request can become (prompt + max_tokens, capped at max_model_len), or
            exactly prompt + output length when it is known (the simulator, the oracle reservation).
        block_table: physical block ids, one per logical block (paged allocator); a hybrid model's
            KV cache group 0 (``engine/core/kv_cache_coordinator.py``).
        group_block_tables: a hybrid model's other groups' tables, by group id (empty for one group).
        token_ids: prompt then output token ids (engine only; empty in the simulator).
        seq_id: the engine's id of this sequence, unique over all requests; None = ``request_id``.
        index: the sequence's place in its request (parallel sampling: the sample index, 0..n-1).
        cumulative_logprob: sum of the log-probabilities of its output tokens (kept for parallel
            samples and beams; 0.0 when not computed).
        output_logprobs: the log-probability of each output token, where computed (parallel samples
            and beams).
        block_hashes: prefix caching: the hash chain of its full blocks computed so far (vLLM's
            ``Request.block_hashes``; ``engine/core/prefix_cache.py``).
        num_prefix_hit_tokens: prefix caching: prompt tokens found cached at its first prefill
            (reported as vLLM's ``RequestOutput.num_cached_tokens``).
        is_prefill: True until every token of its (re)prefill is computed (vLLM v0's
            ``SequenceStage.PREFILL``). With chunked prefill a prompt spans several steps, and the
            scheduler tells a partial prefill from a decode by it; ``Scheduler.update_from_output``
            clears it.
    """

    request_id: int
    num_prompt_tokens: int
    max_len: int
    sampling_params: SamplingParams = field(default_factory=SamplingParams)
    seq_id: int | None = None
    index: int = 0
    token_ids: list[int] = field(default_factory=list)
    arrival_time: float = 0.0
    status: SequenceStatus = SequenceStatus.WAITING
    num_tokens: int = 0
    num_computed_tokens: int = 0
    block_table: list[int] = field(default_factory=list)
    num_preemptions: int = 0
    finish_reason: str | None = None
    cumulative_logprob: float = 0.0
    output_logprobs: list[float] = field(default_factory=list)
    block_hashes: list[bytes] = field(default_factory=list)
    num_prefix_hit_tokens: int = 0
    is_prefill: bool = True
    group_block_tables: dict[int, list[int]] = field(default_factory=dict)

    def block_tables_of(self, group_id: int) -> list[int]:
        """The block table of KV cache group ``group_id`` (vLLM v1: one per group per request)."""
        return self.block_table if group_id == 0 else self.group_block_tables.setdefault(group_id, [])

    def set_block_table(self, group_id: int, table: list[int]) -> None:
        if group_id == 0:
            self.block_table = table
        else:
            self.group_block_tables[group_id] = table

    def __post_init__(self) -> None:
        if self.num_tokens == 0:
            self.num_tokens = self.num_prompt_tokens
        if self.seq_id is None:
            self.seq_id = self.request_id

    # --- The group interface, for the simulator's lock-step path (module docstring) ---------------

    @property
    def seqs(self) -> list[Sequence]:
        return [self]

    def unfinished_seqs(self) -> list[Sequence]:
        return [self]

    @property
    def num_samples(self) -> int:
        return 1

    @property
    def num_output_tokens(self) -> int:
        return self.num_tokens - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_new_tokens(self) -> int:
        """Tokens the next step must compute: the whole (re)prompt at prefill, 1 at decode."""
        return self.num_tokens - self.num_computed_tokens

    def append_token(self, token_id: int | None = None, logprob: float | None = None) -> None:
        if token_id is not None:
            self.token_ids.append(token_id)
        self.num_tokens += 1
        if logprob is not None:
            self.cumulative_logprob += logprob
            self.output_logprobs.append(logprob)

    def fork(self, seq_id: int, index: int) -> Sequence:
        """A child with this sequence's tokens and lengths and a copy of its block table (vLLM's
        ``Sequence.fork``); the KV allocator increfs the shared blocks (``KVCacheManager.fork``)."""
        return Sequence(
            self.request_id, self.num_prompt_tokens, self.max_len, self.sampling_params, seq_id=seq_id, index=index,
            token_ids=list(self.token_ids), arrival_time=self.arrival_time, status=self.status,
            num_tokens=self.num_tokens, num_computed_tokens=self.num_computed_tokens,
            num_preemptions=self.num_preemptions, cumulative_logprob=self.cumulative_logprob,
            output_logprobs=list(self.output_logprobs), block_hashes=list(self.block_hashes),
            num_prefix_hit_tokens=self.num_prefix_hit_tokens, is_prefill=self.is_prefill,
        )


@dataclass(eq=False)
class SequenceGroup:
    """A request with several sequences that share its prompt (vLLM's ``SequenceGroup``).

    The group is scheduled, preempted and finished as a unit: all its unfinished sequences decode
    in the same step, and a preemption frees every one of them (paper §4.5). Its prompt is
    prefilled once, by one sequence; the engine then *forks* the others from it, so their block
    tables point at the same prompt blocks with refcount > 1 (paper §4.4, Figure 8).

    Attributes:
        request_id: the engine's id of the request.
        seqs: parallel sampling: every sample, in index order, finished ones included;
            beam search: the live beams of this step.
        sampling_params: the request's :class:`~engine.SamplingParams` (``n`` samples), or the
            stopping rules derived from its :class:`~engine.BeamSearchParams`.
        beam_search: the beam-search parameters, or None (one sequence, or parallel sampling).
        finished_beams: beam search: the finished hypotheses so far, best first (at most beam_width).
        status, num_preemptions, finish_reason, arrival_time: of the whole request.
        kv_transfer_params: prefill/decode disaggregation (vLLM's ``Request.kv_transfer_params``):
            ``{"do_remote_decode": True}`` on a prefill instance; on a decode instance the
            parameters its prefill instance returned (``do_remote_prefill``, ``remote_block_ids``,
            ``transfer_id``, ...); None otherwise (``engine/kv_transfer/``).
    """

    request_id: int
    seqs: list[Sequence]
    sampling_params: SamplingParams = field(default_factory=SamplingParams)
    beam_search: BeamSearchParams | None = None
    arrival_time: float = 0.0
    status: SequenceStatus = SequenceStatus.WAITING
    num_preemptions: int = 0
    finish_reason: str | None = None
    finished_beams: list[FinishedBeam] = field(default_factory=list)
    kv_transfer_params: dict | None = None

    @property
    def is_single(self) -> bool:
        """One sequence for good: neither parallel sampling (``n > 1``) nor beam search."""
        return self.beam_search is None and self.sampling_params.n == 1

    @property
    def num_samples(self) -> int:
        """Sequences the request will hold once forked: n, or beam_width."""
        return self.beam_search.beam_width if self.beam_search is not None else self.sampling_params.n

    @property
    def num_prompt_tokens(self) -> int:
        return self.seqs[0].num_prompt_tokens

    def unfinished_seqs(self) -> list[Sequence]:
        return [s for s in self.seqs if s.status is not SequenceStatus.FINISHED]

    @property
    def num_new_tokens(self) -> int:
        """Tokens the next step computes for the whole group (an upper bound at re-prefill, where
        the allocator shares the full prompt blocks and the others start after them)."""
        return sum(s.num_new_tokens for s in self.unfinished_seqs())


@dataclass(frozen=True)
class FinishedBeam:
    """A finished beam-search hypothesis: its output tokens, cumulative logprob and
    length-penalised score (``engine/core/beam_search.py`` ranks them)."""

    token_ids: list[int]
    cumulative_logprob: float
    score: float


def fork_samples(group: SequenceGroup, fork: Callable[[Sequence, Sequence], None], new_seq_id: Callable[[], int]) -> list[Sequence]:
    """After the prompt's one prefill: fork the group's other samples from its first sequence
    (parallel sampling, and the simulator's first beams; paper §4.4, Figure 8).

    Each child copies the first sequence's tokens and block table, and ``fork(parent, child)``
    (``Scheduler.fork``) makes the KV allocator share its blocks (refcount + 1). Children get
    indexes ``len(group.seqs) .. num_samples - 1`` and ids from ``new_seq_id()``, in index order.

    Returns:
        The new sequences, in index order (empty when the group is already forked).
    """
    parent = group.seqs[0]
    children = []
    for index in range(len(group.seqs), group.num_samples):
        child = parent.fork(new_seq_id(), index)
        fork(parent, child)
        group.seqs.append(child)
        children.append(child)
    return children
