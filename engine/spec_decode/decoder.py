"""One speculative step on the paged KV cache: propose, verify in one forward pass, accept, roll back.

For every decoding sequence of a step (vLLM v1's flow, ``gpu_model_runner`` + ``rejection_sampler``):

1. **Propose.** Up to k draft tokens: prompt lookup, or the model's first L layers.
2. **Reserve.** Tentative slots for the drafts, after the slot of the sequence's newest token
   (``allocate_lookahead_slots``, vLLM's ``allocate_slots(num_lookahead_tokens=k)``). Only free
   blocks: speculation never preempts anyone, so a sequence gets fewer drafts (down to none) when
   the pool is short. (Early exit reserves first, then drafts into the reserved slots.)
3. **Verify.** The newest token and its drafts, k + 1 query tokens, go through the forward pass
   as a chunk over the sequence's paged context: the prefill path the engine already has (torch
   reference, Triton, CPU kernels), beside the step's other prefills and decodes. Every position's
   K and V is written; the logits of all k + 1 positions come back.
4. **Accept.** Greedy: the longest prefix of drafts the target's argmax agrees with, then the
   target's own token. Sampling: rejection sampling (``rejection_sampler.py``): exactly the
   target's distribution.
5. **Roll back.** ``num_computed_tokens`` counts the newest token and the accepted drafts; the
   rejected drafts' slots are given back and a block left with no verified token is freed
   (``rollback_lookahead``). Only verified tokens enter ``token_ids``, so only they are ever hashed
   into the prefix cache.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.core.block_manager import PagedBlockManager
from engine.core.sequence import Sequence
from engine.model_executor.model import AttentionMetadata
from engine.model_executor.model_runner import ModelRunner
from engine.core.events import EventLog
from engine.report import SPEC_ACCEPT, SPEC_PROPOSE, SPEC_REJECT, WRITE, SpecDecodeOutput
from engine.spec_decode.config import SpeculativeConfig
from engine.spec_decode.draft_layers import EarlyExitDrafter
from engine.spec_decode.ngram import NgramProposer
from engine.spec_decode.rejection_sampler import rejection_sample, target_probs, verify_greedy


@dataclass
class Proposal:
    """One sequence's drafts this step: the tokens and their tentative slots (positions
    ``start .. start + len(draft_token_ids) - 1``, after the newest token at ``start - 1``)."""

    draft_token_ids: list[int]
    start: int
    slots: list[int]


@dataclass
class SpecStats:
    """Draft tokens proposed and accepted, and speculative steps (verifications) run.

    ``acceptance_rate`` = accepted / proposed; ``mean_accepted_length`` = tokens emitted per
    verification (accepted drafts + the target's own token), vLLM's "mean acceptance length"."""

    proposed: int = 0
    accepted: int = 0
    verifications: int = 0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def mean_accepted_length(self) -> float:
        return (self.accepted + self.verifications) / self.verifications if self.verifications else 0.0

    def add(self, proposed: int, accepted: int) -> None:
        self.proposed += proposed
        self.accepted += accepted
        self.verifications += 1


@dataclass
class SpecOutcome:
    """What verification made of one sequence's proposal this step."""

    proposed: list[int]
    accepted: int
    tokens: list[int]  # the tokens emitted: accepted drafts, then the target's token
    tentative_slots: list[int]
    rolled_back_slots: list[int] = field(default_factory=list)
    freed_blocks: list[int] = field(default_factory=list)

    @property
    def rejected(self) -> int:
        return len(self.proposed) - self.accepted


class SpeculativeDecoder:
    """The engine's speculative decoding (see the module docstring).

    Args:
        config: the :class:`SpeculativeConfig`.
        runner: the engine's model runner (model, KV pools, attention backend).
        kv: the paged allocator.
        max_model_len: the engine's longest request.
    """

    def __init__(self, config: SpeculativeConfig, runner: ModelRunner, kv: PagedBlockManager, max_model_len: int, events: EventLog):
        self.config, self.runner, self.kv, self.max_model_len, self.events = config, runner, kv, max_model_len, events
        self.k = config.num_speculative_tokens
        if config.method == "ngram":
            self.ngram = NgramProposer(config.prompt_lookup_min, config.prompt_lookup_max, self.k, max_model_len)
            self.drafter = None
        else:
            self.ngram = None
            self.drafter = EarlyExitDrafter(runner.model, config.num_draft_layers, runner.backend)
        self.stats = SpecStats()  # engine-wide
        self.request_stats: dict[int, SpecStats] = {}  # request_id -> its own, while the engine keeps the request
        self.step_outcomes: dict[int, SpecOutcome] = {}  # seq_id -> this step's, drained into the StepReport

    def room(self, seq: Sequence) -> int:
        """Drafts ``seq`` may take: k, fewer near its ``max_len`` (each step emits at most drafts + 1)."""
        return max(0, min(self.k, seq.max_len - seq.num_tokens - 1))

    def propose(self, seqs: list[Sequence]) -> dict[int, Proposal]:
        """Drafts and tentative slots for decoding ``seqs`` (after the step's swaps and copies), a
        SPEC_PROPOSE event per draft. Returns seq_id -> :class:`Proposal` for the sequences that got
        at least one draft."""
        proposals = self._propose(seqs)
        for seq in seqs:
            proposal = proposals.get(seq.seq_id)
            for i, (token, slot) in enumerate(zip(proposal.draft_token_ids, proposal.slots) if proposal else ()):
                self.events.emit(SPEC_PROPOSE, seq.request_id, block_id=slot // self.kv.block_size, slot=slot,
                                 position=proposal.start + i, seq_id=seq.seq_id, detail=f"draft token {token}")
        return proposals

    def _propose(self, seqs: list[Sequence]) -> dict[int, Proposal]:
        kv = self.kv
        proposals: dict[int, Proposal] = {}
        if self.ngram is not None:
            for seq in seqs:
                drafts = self.ngram.propose(seq.token_ids, self.room(seq))
                granted = kv.allocate_lookahead_slots(seq, len(drafts)) if drafts else 0
                if granted:
                    proposals[seq.seq_id] = Proposal(drafts[:granted], seq.num_tokens, kv.tentative_slots(seq))
            return proposals
        wanted = [self.room(seq) for seq in seqs]
        granted = [kv.allocate_lookahead_slots(seq, n) if n else 0 for seq, n in zip(seqs, wanted)]
        # The draft feeds the newest token and drafts 1..n-1: it writes positions num_tokens - 1 ..
        # num_tokens + n - 2 of its L layers, all slots the verification overwrites.
        drafts = self.drafter.propose(seqs, granted, kv, self.runner.caches_for(kv.attention_block_size))
        for seq, n, tokens in zip(seqs, granted, drafts):
            if n:
                proposals[seq.seq_id] = Proposal(tokens, seq.num_tokens, kv.tentative_slots(seq))
        return proposals

    @torch.inference_mode()
    def execute(self, prefill_seqs: list[Sequence], num_tokens_of, decode_seqs: list[Sequence],
                proposals: dict[int, Proposal]) -> tuple[torch.Tensor, list[tuple[int, int]]]:
        """The step's forward pass with speculation: prefills (or chunks), then each speculating
        decode as a chunk of 1 + drafts tokens over its paged context, then the plain decodes.

        Args:
            prefill_seqs, decode_seqs: the scheduler's batch.
            num_tokens_of: ``SchedulerOutput.num_tokens_of``.
            proposals: from :meth:`propose`.

        A WRITE event per token (the drafts' included) is emitted once the pass has run.

        Returns:
            (logits ``[rows, vocab_size]`` fp32, per sequence of ``prefill_seqs + decode_seqs`` in
            that order its (first row, number of rows): 1 + drafts rows for a speculating
            sequence, its last token's row otherwise).
        """
        runner, kv = self.runner, self.kv
        speculating = [s for s in decode_seqs if s.seq_id in proposals]
        plain = [s for s in decode_seqs if s.seq_id not in proposals]
        chunks = []  # (seq, token ids, start position)
        for seq in prefill_seqs:
            start = seq.num_computed_tokens
            chunks.append((seq, seq.token_ids[start : start + num_tokens_of(seq)], start))
        for seq in speculating:
            chunks.append((seq, [seq.token_ids[-1]] + proposals[seq.seq_id].draft_token_ids, seq.num_tokens - 1))
        input_ids, positions, slots, lens, writes = [], [], [], [], []
        for seq, ids, start in chunks + [(s, [s.token_ids[-1]], s.num_tokens - 1) for s in plain]:
            end = start + len(ids)
            seq_slots = kv.slot_mapping(seq, start, end)
            input_ids += ids
            positions += range(start, end)
            slots += seq_slots
            lens.append(len(ids))
            writes += [(seq, pos, slot) for pos, slot in zip(range(start, end), seq_slots)]
        chunk_lens = lens[: len(chunks)]
        dev = runner.device
        tables = lambda seqs: runner._block_tables(seqs, kv)  # noqa: E731
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=dev),
            num_prefill_tokens=sum(chunk_lens),
            prefill_query_start_loc=torch.tensor([0] + _cumsum(chunk_lens), dtype=torch.int32, device=dev),
            prefill_context_lens=torch.tensor([start + n for (_, _, start), n in zip(chunks, chunk_lens)], dtype=torch.int32, device=dev),
            prefill_block_tables=tables([c[0] for c in chunks]),
            decode_context_lens=torch.tensor([s.num_tokens for s in plain], dtype=torch.int32, device=dev),
            decode_block_tables=tables(plain),
            backend=runner.backend,
        )
        if runner.backend.plan is not None:
            meta.plan = runner.backend.plan(meta.slot_mapping, meta.decode_block_tables, meta.decode_context_lens, kv.attention_block_size)
        ids = torch.tensor(input_ids, dtype=torch.int64, device=dev)
        pos = torch.tensor(positions, dtype=torch.int64, device=dev)
        hidden = runner.model(ids, pos, runner.caches_for(kv.attention_block_size), meta)
        for seq, position, slot in writes:
            self.events.emit(WRITE, seq.request_id, block_id=slot // kv.block_size, slot=slot, position=position)
        # Rows wanted, in the engine's order (prefills, then decodes): a chunk's last row, or all of a speculation's.
        ends = _cumsum(lens)
        where = {id(seq): (end - n, n) for (seq, _, _), end, n in zip(chunks + [(s, None, None) for s in plain], ends, lens)}
        rows, offsets = [], []
        for seq in prefill_seqs + decode_seqs:
            first, n = where[id(seq)]
            wanted = range(first, first + n) if seq.seq_id in proposals else [first + n - 1]
            offsets.append((len(rows), len(wanted)))
            rows += wanted
        index = torch.tensor(rows, dtype=torch.int64, device=dev)
        return runner.model.compute_logits(hidden[index]), offsets

    def verify(self, seq: Sequence, proposal: Proposal, logits: torch.Tensor, generator: torch.Generator | None) -> SpecOutcome:
        """Accept ``seq``'s drafts from the target's logits ``[1 + drafts, vocab_size]`` (greedy, or
        rejection sampling with the request's generator). Changes nothing on ``seq``."""
        drafts = proposal.draft_token_ids
        params = seq.sampling_params
        if params.greedy:
            accepted, tokens = verify_greedy(drafts, logits.argmax(dim=-1).tolist())
        else:
            accepted, tokens = rejection_sample(drafts, target_probs(logits, params), None, generator)
        return SpecOutcome(list(drafts), accepted, tokens, list(proposal.slots))

    def record(self, seq: Sequence, outcome: SpecOutcome) -> None:
        """Count a verification in the engine's, the request's and the step's statistics."""
        self.stats.add(len(outcome.proposed), outcome.accepted)
        self.request_stats.setdefault(seq.request_id, SpecStats()).add(len(outcome.proposed), outcome.accepted)
        self.step_outcomes[seq.seq_id] = outcome

    def take_step_outcomes(self) -> dict[int, SpecOutcome]:
        """This step's outcomes (seq_id -> :class:`SpecOutcome`), handed over once."""
        outcomes, self.step_outcomes = self.step_outcomes, {}
        return outcomes

    def rollback(self, seq: Sequence, outcome: SpecOutcome, start: int, running: bool = True) -> None:
        """After the emitted tokens are appended and ``num_computed_tokens`` counts the verified
        ones: SPEC_ACCEPT for the accepted drafts' slots, give the rejected drafts' slots back
        (SPEC_REJECT each, FREE for a block left empty); ``outcome`` records them. ``start``: the
        first draft's position. A sequence that finished this step (``running`` False) was freed
        whole already: only the events are emitted."""
        bs = self.kv.block_size
        for i, slot in enumerate(outcome.tentative_slots[: outcome.accepted]):
            self.events.emit(SPEC_ACCEPT, seq.request_id, block_id=slot // bs, slot=slot, position=start + i, seq_id=seq.seq_id,
                             detail=f"draft token {outcome.proposed[i]}")
        for i, slot in enumerate(outcome.tentative_slots[outcome.accepted :], start=outcome.accepted):
            self.events.emit(SPEC_REJECT, seq.request_id, block_id=slot // bs, slot=slot, position=start + i, seq_id=seq.seq_id,
                             detail=f"draft token {outcome.proposed[i]} rejected: slot given back")
        if running:
            outcome.rolled_back_slots, outcome.freed_blocks = self.kv.rollback_lookahead(seq)
        else:
            outcome.rolled_back_slots = list(outcome.tentative_slots[outcome.accepted :])

    def report(self, seq: Sequence, outcome: SpecOutcome) -> SpecDecodeOutput:
        """The StepReport's record of ``seq``'s speculation this step."""
        stats = self.request_stats.get(seq.request_id, SpecStats())
        return SpecDecodeOutput(list(outcome.proposed), outcome.accepted, list(outcome.tokens), list(outcome.tentative_slots),
                                list(outcome.rolled_back_slots), list(outcome.freed_blocks), stats.acceptance_rate,
                                stats.mean_accepted_length)


def _cumsum(values: list[int]) -> list[int]:
    out, total = [], 0
    for v in values:
        total += v
        out.append(total)
    return out
