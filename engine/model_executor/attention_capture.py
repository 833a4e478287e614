"""Keep one step's attention inputs and outputs, layer by layer, to replay a kernel on them.

:meth:`ModelRunner.capture_attention <engine.model_executor.model_runner.ModelRunner.capture_attention>`
returns an :class:`AttentionRecorder`. While it is on, every step that runs the model keeps, for each
layer, the query and the attention output of each sequence's newest token (one row per sequence,
prefills first, then decodes: the model's flat batch, ``SchedulerOutput.prefill_seqs + decode_seqs``),
and the block tables and context lengths that attention read. :meth:`AttentionRecorder.last` hands
them out as a :class:`CapturedAttention`, whose fields are exactly a decode kernel's arguments
(vLLM's ``paged_attention_v1``: query, key_cache, value_cache, block_tables, seq_lens, scale).

A prefill sequence's newest token is the last token of its prompt (or chunk): it attends to the whole
context, as a decode token does, so its row replays as a decode query too.

Observing changes the path, not the result: the recorder registers forward hooks inside the layers, so
while it is on, a decode step runs the layers module by module (the same kernels, in the same order),
not as the one C++ call per step of :meth:`CausalLM.use_cpu_kernels
<engine.model_executor.model.CausalLM.use_cpu_kernels>`. Its tokens are identical; its time is not the
time ``python -m engine bench`` measures.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.model_executor.model import AttentionMetadata, CausalLM, apply_rotary


@dataclass(frozen=True)
class CapturedAttention:
    """One layer's decode attention in the last step that ran the model, one row per sequence.

    Attributes:
        layer: the decoder layer (0-based).
        query: ``[num_seqs, num_heads, head_dim]`` in the model dtype, each sequence's newest token's
            query after the model's own q_norm (Qwen3) and rotary embedding: what attention read.
        key_cache, value_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``, the layer's pools
            viewed with the allocator's block size (no copy: valid until the next step writes them).
        block_tables: ``[num_seqs, max_blocks]`` int32, padded with 0 past each sequence's blocks.
        context_lens: ``[num_seqs]`` int32, tokens in the cache per sequence after the step's write.
        output: ``[num_seqs, num_heads, head_dim]``, the attention output the engine computed for these
            rows (the input of ``o_proj``): what a replayed kernel should reproduce.
        scale: the softmax scale, ``head_dim ** -0.5``.
        num_prefills: rows ``[0, num_prefills)`` are prefills' (or chunks') last tokens, the rest decodes.
    """

    layer: int
    query: torch.Tensor
    key_cache: torch.Tensor
    value_cache: torch.Tensor
    block_tables: torch.Tensor
    context_lens: torch.Tensor
    output: torch.Tensor
    scale: float
    num_prefills: int

    @property
    def block_size(self) -> int:
        """Slots per block of ``key_cache`` (the contiguous allocator's pools have 1-slot blocks)."""
        return self.key_cache.shape[1]

    @property
    def num_seqs(self) -> int:
        return self.query.shape[0]


class AttentionRecorder:
    """Forward hooks on one model that keep the last step's attention (see the module's docstring).

    Use as a handle (``recorder.remove()`` when done) or a context manager
    (``with runner.capture_attention() as recorder: ...``). Each layer keeps only its rows' query
    and output (``num_seqs`` rows), so a step costs a few small copies, not the step's activations.
    """

    def __init__(self, model: CausalLM):
        self.model = model
        self.num_layers = model.num_layers
        self.num_steps = 0  # forward passes seen: the model's steps while this recorder was on
        self._meta: AttentionMetadata | None = None
        self._kv_caches: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._rows: torch.Tensor | None = None
        self._positions: torch.Tensor | None = None
        self._query: dict[int, torch.Tensor] = {}
        self._output: dict[int, torch.Tensor] = {}
        self._handles = [model.register_forward_pre_hook(self._keep_step)]
        for index, layer in enumerate(model.model.layers):
            attn = layer.self_attn
            self._handles.append(attn.q_proj.register_forward_hook(
                lambda module, inputs, output, index=index: self._query.__setitem__(index, output[self._rows])))
            self._handles.append(attn.o_proj.register_forward_pre_hook(
                lambda module, inputs, index=index: self._output.__setitem__(index, inputs[0][self._rows])))

    def _keep_step(self, module, args) -> None:
        _, positions, kv_caches, meta = args
        p = meta.num_prefill_tokens
        prefill_ends = meta.prefill_query_start_loc[1:].to(torch.int64) - 1
        decode_rows = torch.arange(p, positions.shape[0], device=positions.device)
        self._rows = torch.cat([prefill_ends.to(positions.device), decode_rows])
        self._positions = positions[self._rows]
        self._meta, self._kv_caches = meta, kv_caches
        self._query, self._output = {}, {}
        self.num_steps += 1

    def last(self, layer: int) -> CapturedAttention | None:
        """Layer ``layer``'s attention in the last step that ran the model; None before any.

        Raises:
            IndexError: ``layer`` outside ``0 .. num_layers - 1``.
        """
        if not 0 <= layer < self.num_layers:
            raise IndexError(f"layer {layer} is outside 0..{self.num_layers - 1}")
        if self._meta is None or layer not in self._query:
            return None
        meta, attn = self._meta, self.model.model.layers[layer].self_attn
        n = self._rows.shape[0]
        with torch.inference_mode():
            q = self._query[layer].view(n, attn.num_heads, attn.head_dim)
            if hasattr(attn, "q_norm"):
                q = attn.q_norm(q)
            cos, sin = self.model.rotary_emb(self._positions, q.dtype)
            query = apply_rotary(q, cos, sin).contiguous()
        num_prefills = meta.prefill_context_lens.shape[0]
        tables = [meta.prefill_block_tables, meta.decode_block_tables]
        width = max(t.shape[1] for t in tables)
        block_tables = torch.cat([torch.nn.functional.pad(t, (0, width - t.shape[1])) for t in tables])
        key_cache, value_cache = self._kv_caches[layer]
        return CapturedAttention(
            layer=layer, query=query, key_cache=key_cache, value_cache=value_cache, block_tables=block_tables,
            context_lens=torch.cat([meta.prefill_context_lens, meta.decode_context_lens]),
            output=self._output[layer].view(n, attn.num_heads, attn.head_dim), scale=attn.scale, num_prefills=num_prefills,
        )

    def remove(self) -> None:
        """Stop capturing: the hooks go, and decode steps may again run as one C++ call."""
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def __enter__(self) -> AttentionRecorder:
        return self

    def __exit__(self, *exc) -> None:
        self.remove()
