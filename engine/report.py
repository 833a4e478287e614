"""Plain data the engine hands to the app, the lessons and the benchmarks after every step.

Nothing here holds a tensor or a reference to the KV pools: a report is cheap to build every step
and safe to keep for a whole run.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.core.accounting import MemoryUsage
from engine.core.prefix_cache import PrefixCacheStats
from engine.core.kv_offload import KVOffloadStats

# Event kinds, in the order they can happen to a request.
ALLOCATE = "allocate"  # a physical block given to a request's logical block
WRITE = "write"  # a token's K and V written to a slot
FREE = "free"  # a physical block returned to the free list
PREEMPT = "preempt"  # a request evicted by recompute (its blocks freed, requeued at the front)
FINISH = "finish"  # a request done (reason in ``detail``)
FORK = "fork"  # a child sequence made from a parent: block table copied, every block's refcount + 1
COPY_ON_WRITE = "copy_on_write"  # a write into a shared block: it is copied to a new block first
CACHE_HIT = "cache_hit"  # prefix caching: a prompt's logical block found computed in a cached block
EVICT = "evict"  # prefix caching: a free cached block handed out again, its hash dropped
SWAP_OUT = "swap_out"  # swap preemption: a block's KV copied from the GPU pool to the CPU pool
SWAP_IN = "swap_in"  # a swapped-out request's block copied back from the CPU pool to the GPU pool
SPEC_PROPOSE = "spec_propose"  # speculative decoding: a draft token given a tentative (lookahead) slot
SPEC_ACCEPT = "spec_accept"  # a draft token verified by the model: its slot now holds a verified token
SPEC_REJECT = "spec_reject"  # rollback: a rejected draft's slot given back (its block freed if left empty)

# A request's sequences share its prompt's blocks (paper §4.4): StepReport.sharing's values.
SHARING_NONE = "none"  # one sequence (n = 1)
SHARING_PARALLEL = "parallel"  # parallel sampling: n samples forked after the prompt's one prefill
SHARING_BEAM = "beam"  # beam search: beam_width live beams, forked and pruned every step

# A sequence's finish reasons (StepReport.seq_finished); a request's are "stop", "length", "abort", "error".
PRUNED = "pruned"  # beam search: a live beam none of whose candidates survived this step

# PREEMPT's detail: how the request gave its memory up, and why a swap fell back to recompute.
PREEMPTED_BY_RECOMPUTE = "recompute"
PREEMPTED_BY_SWAP = "swap"
RECOMPUTE_CPU_POOL_FULL = "recompute (the CPU swap space is full)"
RECOMPUTE_PARTIAL_PREFILL = "recompute (a partial prefill: recomputed, not swapped)"

# FREE's detail: why a block left a table (empty: it went back to the free queue, nobody else held it).
FREED_STILL_SHARED = "still shared"  # "still shared, refcount N": only this sequence's reference went (paper §4.4)
FREED_CACHED = "cached, evictable"  # back in the free queue, its KV still cached under its hash (prefix caching)
FREED_OUT_OF_WINDOW = "out of the sliding window"  # a sliding-window group: every token in it is before the window

# Why a waiting request was not admitted this step (StepReport.waiting's values). Admission is first
# come, first served: the head of the queue names its own reason, the requests behind it WAIT_QUEUE.
WAIT_BUDGET = "budget"  # its prompt (or chunk) does not fit the token budget the step has left
WAIT_NO_FREE_BLOCK = "no_free_block"  # the pool cannot give its prompt the blocks it needs
WAIT_MAX_NUM_SEQS = "max_num_seqs"  # max_num_seqs requests are running already
WAIT_SWAPPED = "swapped"  # requests are swapped out: they come back before anyone new is admitted (paper §4.5)
WAIT_PREEMPTION = "preemption"  # the step preempted a running request (this one, or another): nothing new is admitted
WAIT_QUEUE = "queue"  # behind the head of the queue, which could not be admitted
WAIT_STATIC_BATCH = "static_batch"  # static batching: the running batch runs until its longest request finishes
# Longest prefix match (SGLang's LPM): a later arrival with a longer cached prefix was admitted before it this step
WAIT_LPM_PASSED_OVER = "lpm_passed_over"
WAIT_REASONS = (WAIT_BUDGET, WAIT_NO_FREE_BLOCK, WAIT_MAX_NUM_SEQS, WAIT_SWAPPED, WAIT_PREEMPTION, WAIT_QUEUE, WAIT_STATIC_BATCH,
                WAIT_LPM_PASSED_OVER)


@dataclass(frozen=True)
class Event:
    """One thing the engine did this step, for the event log.

    Attributes:
        kind: one of ALLOCATE, WRITE, FREE, PREEMPT, FINISH, FORK, COPY_ON_WRITE, CACHE_HIT, EVICT,
            SWAP_OUT, SWAP_IN, SPEC_PROPOSE, SPEC_ACCEPT, SPEC_REJECT (speculative decoding: a draft's
            tentative slot and position, the draft token in ``detail``). PREEMPT's detail is one of PREEMPTED_BY_RECOMPUTE, PREEMPTED_BY_SWAP,
            RECOMPUTE_CPU_POOL_FULL, RECOMPUTE_PARTIAL_PREFILL (swap mode, and why it recomputed).
        request_id: the request it concerns.
        block_id: physical block (ALLOCATE, FREE, CACHE_HIT, EVICT; the block of the slot for WRITE;
            the source block of a COPY_ON_WRITE, SWAP_OUT (a GPU block) or SWAP_IN (a CPU block)).
        logical_index: the request's logical block index (ALLOCATE, FREE, CACHE_HIT).
        slot: physical slot, block_id * block_size + offset (WRITE).
        position: token position in the request (WRITE).
        detail: free text, e.g. the finish reason; FREE of a still-shared block says so.
        seq_id: the sequence it concerns (requests with several sequences; else the request's one).
        dst_block_id: COPY_ON_WRITE: the new block the source was copied to; SWAP_OUT: the CPU
            block; SWAP_IN: the GPU block.
        parent_seq_id: FORK: the sequence the child ``seq_id`` was forked from.
        block_hash: CACHE_HIT, EVICT: the block's hash, hex (64 characters).
        kv_cache_group: a hybrid model's KV cache group the block belongs to (None: a model of one
            attention type, whose one group every block serves).
    """

    kind: str
    request_id: int
    block_id: int | None = None
    logical_index: int | None = None
    slot: int | None = None
    position: int | None = None
    detail: str = ""
    seq_id: int | None = None
    dst_block_id: int | None = None
    parent_seq_id: int | None = None
    block_hash: str | None = None
    kv_cache_group: int | None = None


@dataclass(frozen=True)
class BlockTableSnapshot:
    """A live request's block table after the step.

    Attributes:
        request_id: the request.
        block_table: physical block per logical block (contiguous allocator: the blocks its range covers).
        filled: token states held by each of those blocks, in slots.
        slot_range: contiguous allocator only: the request's [start, end) slots in the arena.
        seq_id: the sequence whose table this is (one snapshot per sequence, grouped by request).
        index: the sequence's sample or beam index within its request.
        ref_counts: each block's reference count after the step (> 1: shared, paper §4.4).
    """

    request_id: int
    block_table: list[int]
    filled: list[int]
    slot_range: tuple[int, int] | None = None
    seq_id: int | None = None
    index: int = 0
    ref_counts: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class KVCacheGroupReport:
    """One KV cache group of a hybrid model after the step (vLLM v1's ``KVCacheGroupSpec`` and its
    block tables; ``engine/core/kv_cache_coordinator.py``).

    Attributes:
        group_id: its index; events name it as ``Event.kv_cache_group``.
        attention_type: "full_attention" or "sliding_window".
        sliding_window: tokens each query sees (None: full attention).
        layers: the model's layer indices in the group.
        block_tables: every live sequence's table of this group; a sliding window's freed blocks
            are the null block (0) with 0 filled slots.
        num_blocks_in_use: distinct blocks the group's tables hold (null entries not counted).
    """

    group_id: int
    attention_type: str
    sliding_window: int | None
    layers: list[int]
    block_tables: list[BlockTableSnapshot]
    num_blocks_in_use: int


@dataclass(frozen=True)
class ScheduledRequest:
    """A request's share of the step: ``num_tokens`` computed in ``phase`` ("prefill" or "decode").

    Attributes:
        context_len: tokens the step's last query attends to (its position + 1).
        num_computed_tokens: the sequence's tokens with K and V in the cache after the step.
        num_prefill_tokens: prefill: the tokens the whole (re)prefill computes, so that
            ``num_computed_tokens / num_prefill_tokens`` is a chunked prompt's progress; decode: 0.
    """

    request_id: int
    phase: str
    num_tokens: int
    context_len: int
    num_computed_tokens: int = 0
    num_prefill_tokens: int = 0


@dataclass(frozen=True)
class BeamScore:
    """A live beam's place in its search after the step (beam search, paper §4.4).

    Attributes:
        rank: 0 = best by ``cumulative_logprob``, the order the search keeps its beams in.
        cumulative_logprob: sum of the natural-log probabilities of the beam's output tokens.
        score: the length-penalised score a finished beam is ranked by,
            ``cumulative_logprob / num_output_tokens ** length_penalty`` (transformers' and vLLM's rule).
    """

    rank: int
    cumulative_logprob: float
    score: float


@dataclass(frozen=True)
class SpecDecodeOutput:
    """One request's speculative decoding in a step (``engine/spec_decode/``).

    Attributes:
        proposed: the draft token ids proposed.
        accepted: how many of them the model kept (a prefix of ``proposed``).
        emitted: the tokens the step gave the request: the accepted drafts, then the model's own.
        tentative_slots: the lookahead slots the drafts were written to (one per draft, in order).
        rolled_back_slots: the slots given back at rollback (the rejected drafts').
        freed_blocks: blocks freed at rollback (left with no verified token).
        acceptance_rate, mean_accepted_length: the request's own so far (accepted / proposed drafts;
            tokens per verification, the model's own token included).
    """

    proposed: list[int]
    accepted: int
    emitted: list[int]
    tentative_slots: list[int]
    rolled_back_slots: list[int]
    freed_blocks: list[int]
    acceptance_rate: float
    mean_accepted_length: float

    @property
    def rejected(self) -> list[int]:
        """The draft token ids rejected."""
        return self.proposed[self.accepted :]


@dataclass(frozen=True)
class RadixNodeView:
    """One node of the radix-tree prefix cache (``engine/core/radix_cache.py``, SGLang's
    RadixAttention), as plain data for the app (``StepReport.radix_tree``).

    Attributes:
        node_id: the node's id (stable until it is split or evicted); parent_id: its parent's (0: the root).
        token_ids: the tokens of its edge, ``len(blocks) * block_size`` of them; text: them decoded.
        blocks: the physical blocks that hold their KV, in order.
        lock_ref: the sequences whose cached path passes through it (SGLang's ``lock_ref``); 0:
            evictable once it is a leaf. Its blocks' reference counts in the pool equal it.
        last_access_step: the engine step of its last lookup or insert (its LRU age).
    """

    node_id: int
    parent_id: int
    token_ids: list[int]
    text: str
    blocks: list[int]
    lock_ref: int
    last_access_step: int


@dataclass(frozen=True)
class RadixTreeView:
    """The radix tree after a step (``StepReport.radix_tree``).

    Attributes:
        nodes: every node but the root, parents before children.
        evicted: the blocks evicted this step, grouped by the node that held them after the previous
            step (its id, parent, tokens, text and last access as they were then; lock_ref 0): the
            path eviction cut back, leaf first.
    """

    nodes: list[RadixNodeView] = field(default_factory=list)
    evicted: list[RadixNodeView] = field(default_factory=list)


@dataclass(frozen=True)
class PrefixMatch:
    """What a request found in the prefix cache when it was admitted (``StepReport.prefix_matches``).

    Attributes:
        num_cached_tokens: prompt tokens found cached (full blocks; vLLM's ``num_cached_tokens``),
            of which num_loaded_tokens were loaded back from the CPU tier.
        num_prompt_tokens: the tokens the prefill covers: the prompt's, and after a recompute
            preemption the output it had too (all recomputed but the cached prefix).
        cached_text, loaded_text, rest_text: the prompt decoded in three parts: found on the GPU,
            loaded back from the CPU tier, computed.
        recompute: the request was admitted again after a recompute preemption.
    """

    num_cached_tokens: int
    num_loaded_tokens: int
    num_prompt_tokens: int
    cached_text: str
    loaded_text: str
    rest_text: str
    recompute: bool = False


@dataclass
class StepReport:
    """Everything one scheduler iteration did.

    Attributes:
        step: 0-based step index.
        phase: "prefill", "decode", "mixed" (both in one batch) or "idle" (nothing could run).
        scheduled: requests run this step and their tokens.
        new_token_ids, new_text: per request id, the tokens this step added to the request's output
            and the text they added, a true delta (vLLM's ``RequestOutputKind.DELTA``): joining a
            request's ``new_text`` over every step gives its final ``RequestOutput.text``, exactly.
            A character whose UTF-8 bytes are split over tokens is held back until complete (never
            a U+FFFD placeholder), and with stop strings the last ``len(longest stop) - 1``
            characters are held back until they cannot start a stop string (vLLM's stop buffer);
            held-back text comes in a later step, or is dropped at the end (a character left
            incomplete, text from a stop string on). One sequence: its tokens and text. Parallel
            sampling: sample 0's (as ``RequestOutput.text``). Beam search: nothing while the
            search runs (the best beam can change lineage any step, so no prefix of the result is
            certain), then, in the step it finishes, the best beam's whole token ids and text.
        seq_new_text: per request id, per seq_id, the text delta of every sequence that got a
            token this step: samples and live beams included (same rules as ``new_text``).
            :func:`sequence_texts` rebuilds each sequence's text from these and the FORK events.
        seq_finished: per request id, per seq_id, the sequences that finished this step and why:
            "stop", "length", "abort", "error", or PRUNED (a beam with no surviving candidate).
        sharing: per request id scheduled or finished this step, how its sequences share the
            prompt: SHARING_NONE (one sequence), SHARING_PARALLEL (parallel sampling, ``n``) or
            SHARING_BEAM (beam search).
        beam_scores: beam search: per request id, per seq_id, every live beam's
            :class:`BeamScore` after the step, best first.
        finished: per request id, the finish reason ("stop", "length", "abort", or "error": the
            request failed on its own, ``errors`` says how; the others ran on).
        errors: per request id that failed this step, the error, as ``"TypeError: message"``.
        preempted: request ids preempted this step, by recompute or by swap (``swapped_out`` has the
            swapped ones).
        events: ordered event log (see :class:`Event`).
        block_tables: snapshot of every live request's block table after the step.
        memory: the pool after the step (:class:`~engine.core.accounting.MemoryUsage`).
        timings_ms: wall time per phase in ms ("schedule", "swap": the swap copies, "forward",
            "sample", "report", "total").
        prefix_cache: the engine-wide prefix-cache counters after the step (None when it is off).
        free_queue: the paged allocator's free blocks after the step, head first (the head is
            allocated, and evicted if cached, next: least recently used; vLLM's free block queue).
        cached_free: prefix caching: free blocks that still hold cached KV (evictable), block -> its
            block hash (hex).
        swapped: request ids in the swapped queue after the step (their KV in the CPU pool).
        swapped_out, swapped_in: request ids swapped out / back in this step.
        blocks_to_swap_out: the step's ``(gpu_block, cpu_block)`` copies; blocks_to_swap_in:
            ``(cpu_block, gpu_block)``.
        cpu_memory: the CPU swap space in the same categories (None without one).
        cpu_block_tables: the swapped requests' block tables, in CPU block ids.
        spec: speculative decoding: per request id that verified drafts this step, its
            :class:`SpecDecodeOutput`.
        spec_acceptance_rate, spec_mean_accepted_length: the step's, over its verifications (0 without any).
        waiting: the waiting queue after the step was scheduled, head first: request id -> why it was
            not admitted (one of WAIT_REASONS: the head's own reason, WAIT_QUEUE behind it;
            WAIT_PREEMPTION for a request preempted in this step).
        start_ms: when the step started on the engine's clock, ms: the engine's busy time (the sum of
            its earlier steps' ``timings_ms["total"]``; a pause between steps is not counted); the
            simulator's simulated clock. None in run files written before the field existed.
        arrived: requests queued since the previous step: request id -> its arrival on the same
            clock as ``start_ms``, ms (the engine: when ``add_request`` was called).
        admissions: scheduling_policy "lpm": ``(request id, reason, cached prompt tokens)`` of each
            request admitted this step, in admission order; reason "longest-prefix", "starved" (the
            starvation guard), "preempted" or "long-queue" (over 128 waiting: first come, first served,
            as SGLang; ``engine/core/scheduling_policy.py``). None under FCFS.
        passed_over: scheduling_policy "lpm": each waiting request that a later arrival overtook this
            step (admitted first for its longer cached prefix; ``waiting`` says WAIT_LPM_PASSED_OVER) ->
            that request's id (its cached tokens are in ``admissions``).
        kv_offload: with ``kv_offload_blocks``, the step's :class:`~engine.core.kv_offload.KVOffloadStats`:
            blocks offloaded to the CPU tier, loaded back and dropped, and each tier's cached blocks.
        kv_transfers: with a KV connector (``engine/kv_transfer/``): request id -> "loading" (a decode
            instance's request waiting for its prompt's KV during the step, ``WAITING_FOR_REMOTE_KVS``)
            or "lent" (a prefill instance's finished request whose blocks are held after the step), or
            "bootstrapping" (push order: a prefill instance's request waiting for its decode instance's
            reservation, holding no block).
        wall_start_ms: with a KV connector, when the step started on the wall clock (Unix time, ms):
            two instances' steps side by side (``engine.timeline.disagg_chrome_trace``); else None.
        radix_tree: with ``prefix_cache="radix"``, the tree after the step and the blocks it evicted
            (:class:`RadixTreeView`); None otherwise (the simulator records none).
        prefix_matches: prefix caching: per request id admitted this step with a cache hit, what it
            found (:class:`PrefixMatch`).
        kv_groups: a hybrid model (several KV cache groups): each group's attention type, sliding
            window, layers, block tables and blocks in use (:class:`KVCacheGroupReport`); then
            ``block_tables`` is the first full-attention group's. Empty for one group.
    """

    step: int
    phase: str
    scheduled: list[ScheduledRequest]
    new_token_ids: dict[int, list[int]]
    new_text: dict[int, str]
    finished: dict[int, str]
    preempted: list[int]
    events: list[Event]
    block_tables: list[BlockTableSnapshot]
    memory: MemoryUsage
    timings_ms: dict[str, float] = field(default_factory=dict)
    prefix_cache: PrefixCacheStats | None = None
    free_queue: list[int] = field(default_factory=list)
    cached_free: dict[int, str] = field(default_factory=dict)
    swapped: list[int] = field(default_factory=list)
    swapped_out: list[int] = field(default_factory=list)
    swapped_in: list[int] = field(default_factory=list)
    blocks_to_swap_out: list[tuple[int, int]] = field(default_factory=list)
    blocks_to_swap_in: list[tuple[int, int]] = field(default_factory=list)
    cpu_memory: MemoryUsage | None = None
    cpu_block_tables: list[BlockTableSnapshot] = field(default_factory=list)
    seq_new_text: dict[int, dict[int, str]] = field(default_factory=dict)
    seq_finished: dict[int, dict[int, str]] = field(default_factory=dict)
    sharing: dict[int, str] = field(default_factory=dict)
    beam_scores: dict[int, dict[int, BeamScore]] = field(default_factory=dict)
    spec: dict[int, SpecDecodeOutput] = field(default_factory=dict)
    spec_acceptance_rate: float = 0.0
    spec_mean_accepted_length: float = 0.0
    errors: dict[int, str] = field(default_factory=dict)
    waiting: dict[int, str] = field(default_factory=dict)
    start_ms: float | None = None
    arrived: dict[int, float] = field(default_factory=dict)
    admissions: list[tuple[int, str, int]] | None = None
    passed_over: dict[int, int] = field(default_factory=dict)
    kv_offload: KVOffloadStats | None = None
    radix_tree: RadixTreeView | None = None
    prefix_matches: dict[int, PrefixMatch] = field(default_factory=dict)
    kv_groups: list[KVCacheGroupReport] = field(default_factory=list)
    kv_transfers: dict[int, str] = field(default_factory=dict)
    wall_start_ms: float | None = None

    @property
    def num_tokens(self) -> int:
        """Tokens computed this step (prefill + decode)."""
        return sum(s.num_tokens for s in self.scheduled)


def sequence_texts(reports: list[StepReport], request_id: int) -> dict[int, str]:
    """Each sequence's text after the last of ``reports``, rebuilt from the reports alone.

    Args:
        reports: consecutive step reports from the engine's first step (or from any step before
            ``request_id`` was first scheduled), oldest first: a live run's or a saved run's.
        request_id: the request.

    Returns:
        seq_id -> the text that sequence has streamed so far, in ascending seq_id order: for
        parallel sampling, sample ``i`` is the ``i``-th (its children are forked in index order);
        for beam search every beam the search ever held, pruned ones included (their texts stop
        where they were pruned; ``seq_finished`` says when, ``beam_scores`` ranks the live ones).
        Empty when the request was not yet scheduled.

    A forked child starts from its parent's text as it stood before the step of the FORK event
    (the engine forks before it appends the step's tokens), then adds its own deltas
    (``seq_new_text``), as the engine's detokenizer does.
    """
    texts: dict[int, str] = {}
    for report in reports:
        before = dict(texts)
        for event in report.events:
            if event.kind == FORK and event.request_id == request_id and event.seq_id is not None:
                texts[event.seq_id] = before.get(event.parent_seq_id, "")
        for seq_id, delta in report.seq_new_text.get(request_id, {}).items():
            texts[seq_id] = texts.get(seq_id, "") + delta
    return dict(sorted(texts.items()))


@dataclass
class CompletionOutput:
    """One sequence's completion (vLLM's ``CompletionOutput``).

    Attributes:
        index: sample index (parallel sampling) or rank (beam search, best first).
        text, token_ids: the generated text and token ids (prompt excluded).
        finish_reason: "stop", "length", "abort", "error" (the request failed alone; its
            ``RequestOutput.error`` says how), or None while running.
        cumulative_logprob: sum of the log-probabilities of ``token_ids`` (None when not computed:
            a one-sequence request skips the log-softmax).
        logprobs: the log-probability of each of ``token_ids`` where computed (parallel samples).
    """

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None
    cumulative_logprob: float | None = None
    logprobs: list[float] = field(default_factory=list)


@dataclass
class RequestOutput:
    """A request's result (vLLM's ``RequestOutput``).

    ``outputs`` holds one :class:`CompletionOutput` per sequence (``n`` samples in index order, or
    beams best first); ``text``, ``token_ids`` and ``finish_reason`` are those of the first, so a
    caller of a one-sequence request reads them as before. ``num_cached_tokens``: prompt tokens
    found in the prefix cache at its first prefill (vLLM's name; 0 with prefix caching off).
    ``error``: finish reason "error": what failed, as ``"TypeError: message"``; else None.
    ``prompt_text``: the prompt as text: a text prompt as given, the last chat message's content,
    or the decoding of a prompt given as token ids. ``kv_transfer_params``: prefill/decode
    disaggregation (vLLM's field): a prefill instance's where-to-read parameters for the decode
    instance, or a decode instance's ``{"kv_load": "loaded" | "recomputed", ...}``; else None.
    """

    request_id: int
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str | None
    num_preemptions: int = 0
    outputs: list[CompletionOutput] = field(default_factory=list)
    num_cached_tokens: int = 0
    error: str | None = None
    prompt_text: str = ""
    kv_transfer_params: dict | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def sequences(self) -> list[CompletionOutput]:
        """Beam search: the beams, best first (vLLM's ``BeamSearchOutput.sequences``)."""
        return self.outputs
