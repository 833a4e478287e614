"""Self-speculation by early exit: the model's first L layers draft (LayerSkip, Elhoushi et al., 2024).

The draft model is a strict prefix of the target: embedding, decoder layers 0 .. L-1, then the
target's own final norm and LM head (transformers' ``assistant_early_exit``, which runs
``layers[:L]`` of the same model). So the draft needs no weights of its own, and no KV cache of
its own either: the K and V that layer i < L computes for a token at a position are exactly what
the target's layer i computes for that token there. The draft reads the target's paged KV of
layers 0 .. L-1 for the verified context, and writes its drafts' KV for those layers into the
same lookahead slots the verification then writes all layers into. The draft's memory cost is
nothing beyond the k lookahead slots the verification needs anyway.

Drafts are greedy (the draft's argmax): the draft distribution q is one-hot, which rejection
sampling (``engine/spec_decode/rejection_sampler.py``) handles exactly.
"""

from __future__ import annotations

import torch

from engine.core.kv_cache_manager import KVCacheManager
from engine.core.sequence import Sequence
from engine.model_executor.model import AttentionBackend, AttentionMetadata, CausalLM


class EarlyExitDrafter:
    """Drafts k tokens per sequence with the first ``num_draft_layers`` layers of ``model``.

    Args:
        model: the target :class:`~engine.model_executor.model.CausalLM`.
        num_draft_layers: L, 1 .. num_layers - 1.
        backend: the engine's attention backend (its decode attention reads the paged KV).

    Raises:
        ValueError: L outside 1 .. num_layers - 1.
    """

    def __init__(self, model: CausalLM, num_draft_layers: int, backend: AttentionBackend):
        if not 1 <= num_draft_layers <= model.num_layers - 1:
            raise ValueError(f"num_draft_layers (L) must be in 1 .. {model.num_layers - 1}, got {num_draft_layers}")
        self.model, self.num_draft_layers, self.backend = model, num_draft_layers, backend

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
                meta: AttentionMetadata) -> torch.Tensor:
        """input_ids, positions ``[num_tokens]`` int64 -> logits ``[num_tokens, vocab_size]`` fp32
        of the first L layers; writes those layers' K and V at ``meta.slot_mapping``."""
        model = self.model
        hidden = model.model.embed_tokens(input_ids)
        cos, sin = model.rotary_emb(positions, hidden.dtype)
        residual = None
        for layer, kv_cache in zip(model.model.layers[: self.num_draft_layers], kv_caches):
            hidden, residual = layer(hidden, residual, cos, sin, kv_cache, meta)
        return model.compute_logits(model.model.norm(hidden, residual)[0])

    @torch.inference_mode()
    def propose(self, seqs: list[Sequence], num_drafts: list[int], kv: KVCacheManager,
                kv_caches: list[tuple[torch.Tensor, torch.Tensor]]) -> list[list[int]]:
        """Draft tokens for decoding sequences.

        Each sequence's newest token (position ``num_tokens - 1``, not cached yet) is fed first;
        each draft is fed back, one decode pass of L layers per draft position. The sequences must
        hold slots up to position ``num_tokens - 1 + num_drafts[i]`` (the lookahead slots,
        :meth:`PagedBlockManager.allocate_lookahead_slots`).

        Args:
            seqs: decoding sequences (``num_computed_tokens == num_tokens - 1``).
            num_drafts: drafts wanted per sequence (0 .. k).
            kv: the allocator (slots and block tables).
            kv_caches: the pool, per layer, viewed in ``kv.attention_block_size`` blocks.

        Returns:
            per sequence, its ``num_drafts[i]`` draft token ids.
        """
        drafts: list[list[int]] = [[] for _ in seqs]
        current = [seq.token_ids[-1] for seq in seqs]
        device = next(self.model.parameters()).device
        for j in range(max(num_drafts, default=0)):
            active = [i for i, n in enumerate(num_drafts) if n > j]
            positions = [seqs[i].num_tokens - 1 + j for i in active]
            slots = [kv.slot_mapping(seqs[i], p, p + 1)[0] for i, p in zip(active, positions)]
            tables = [kv.attention_block_table(seqs[i]) for i in active]
            width = max(len(t) for t in tables)
            block_tables = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32, device=device)
            context_lens = torch.tensor([p + 1 for p in positions], dtype=torch.int32, device=device)
            slot_mapping = torch.tensor(slots, dtype=torch.int64, device=device)
            meta = AttentionMetadata(
                slot_mapping=slot_mapping, num_prefill_tokens=0,
                prefill_query_start_loc=torch.zeros(1, dtype=torch.int32, device=device),
                prefill_context_lens=torch.zeros(0, dtype=torch.int32, device=device),
                prefill_block_tables=torch.zeros((0, 0), dtype=torch.int32, device=device),
                decode_context_lens=context_lens, decode_block_tables=block_tables, backend=self.backend,
            )
            if self.backend.plan is not None:
                meta.plan = self.backend.plan(slot_mapping, block_tables, context_lens, kv.attention_block_size)
            ids = torch.tensor([current[i] for i in active], dtype=torch.int64, device=device)
            logits = self.forward(ids, torch.tensor(positions, dtype=torch.int64, device=device), kv_caches, meta)
            for i, token in zip(active, logits.argmax(dim=-1).tolist()):
                drafts[i].append(token)
                current[i] = token
        return drafts
