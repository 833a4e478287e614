"""Runs the model on one scheduled batch: builds the flat input tensors, owns the KV pools.

KV pools, one (key_cache, value_cache) pair per layer (a hybrid model's: per layer position in a KV cache
group, shared by layer j of every group, ``engine/core/kv_cache_interface.py``), each
``[num_blocks, block_size, num_kv_heads, head_dim]`` in the model dtype, or in fp8 with an fp8
``kv_cache_dtype`` (engine/model_executor/kv_quant.py): block-major, so one block of one layer is a
contiguous ``block_size * num_kv_heads * head_dim`` run of memory.
"""

from __future__ import annotations

import dataclasses

import torch

from engine import config
from engine.cpu import huge_pages, ops as cpu_ops
from engine.model_executor import kv_quant
from engine.model_executor.attention_capture import AttentionRecorder
from engine.model_executor.attention import (copy_blocks_reference, swap_blocks, paged_attention_reference, paged_prefill_reference, plan_step, plan_writes,
                              prefill_varlen_reference, write_kv_cache)
from engine.core.kv_cache_interface import KVCacheConfig
from engine.core.kv_cache_manager import KVCacheManager
from engine.core.lab_impl import plug_module
from engine.model_executor.model import AttentionBackend, AttentionMetadata, CausalLM
from engine.core.scheduler import SchedulerOutput

TORCH_BACKEND = AttentionBackend(
    "torch", write_kv_cache, paged_prefill_reference, paged_attention_reference, plan_step, copy_blocks_reference,
    prefill_varlen=prefill_varlen_reference,
)


def prefill_varlen_cpu(query, key, value, query_start_loc, scale, sliding_window=None):
    """:func:`prefill_varlen_reference`'s attention through the engine's C++ kernel
    (:func:`engine.cpu.ops.prefill_attention`: the prompts unpadded) where it takes the operands, else the
    reference itself (bfloat16, a sliding window, a head_dim that is not a multiple of 16)."""
    if cpu_ops.prefill_attention_runs(query, key, sliding_window):
        return cpu_ops.prefill_attention(query, key, value, query_start_loc, scale)
    return prefill_varlen_reference(query, key, value, query_start_loc, scale, sliding_window)


# The torch backend with decode attention read in place, and prompts' own attention, by the engine's C++
# kernels (engine/cpu/ops.py).
CPU_KERNEL_BACKEND = AttentionBackend(
    "torch", write_kv_cache, paged_prefill_reference, cpu_ops.paged_attention_decode, plan_writes, copy_blocks_reference,
    cpu_decode_layer=True, prefill_varlen=prefill_varlen_cpu,
)


def triton_backend() -> AttentionBackend:
    import sys

    import paged_kernels  # imported only when chosen: it may switch Triton to its CPU interpreter

    # labs: a student's decode kernel in place of the engine's (the kernels import nothing of the engine)
    plug_module(sys.modules["paged_kernels.paged_attention_decode"])
    return AttentionBackend(
        "triton", paged_kernels.reshape_and_cache, paged_kernels.paged_attention_prefill, paged_kernels.paged_attention_decode,
        copy_blocks=paged_kernels.copy_blocks,
    )


def kv_bytes_per_slot(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
    """Bytes of one token's K and V over all layers: 2 * layers * kv_heads * head_dim * element size
    (``engine.config.kv_bytes_per_slot``)."""
    return config.kv_bytes_per_slot(num_layers, num_kv_heads, head_dim, torch.empty((), dtype=dtype).element_size())


class ModelRunner:
    """Owns the model and its KV pools; turns a :class:`SchedulerOutput` into logits.

    Args:
        model: the loaded :class:`~engine.model_executor.model.CausalLM`.
        num_blocks, block_size: pool shape in blocks and slots per block.
        backend: the attention implementation.
        num_cpu_blocks: blocks of the CPU swap space (same layout; pinned when the pool is on a GPU); 0 = none.
        kv_cache_config: a hybrid model's groups (``engine/core/kv_cache_interface.py``): one (K, V) pair
            per layer position in a group, layer j of every group on pair j (vLLM's ``KVCacheTensor``);
            None: a pair per layer.
        kv_cache_dtype: vLLM's name of the pools' element type: "auto" (the model's dtype), "fp8",
            "fp8_e4m3" or "fp8_e5m2" (one byte per element, :mod:`engine.model_executor.kv_quant`).
        calculate_kv_scales: fp8 only: every layer's k_scale and v_scale from the first forward pass.

    Raises:
        ValueError: a pool (or swap space) too large to allocate; an unknown kv_cache_dtype.
    """

    def __init__(self, model: CausalLM, num_blocks: int, block_size: int, backend: AttentionBackend, num_cpu_blocks: int = 0,
                 kv_cache_config: KVCacheConfig | None = None, kv_cache_dtype: str = "auto", calculate_kv_scales: bool = False):
        self.model = model
        self.kv_cache_config = kv_cache_config
        num_tensors = kv_cache_config.group_size if kv_cache_config is not None else model.num_layers
        self.backend = backend
        self.block_size = block_size
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.cache_dtype = kv_quant.cache_dtype(kv_cache_dtype, param.dtype)  # the pools' element type
        for layer in model.model.layers:
            layer.self_attn.k_scale, layer.self_attn.v_scale = 1.0, 1.0
            layer.self_attn.calculate_kv_scales = calculate_kv_scales and kv_quant.is_fp8(self.cache_dtype)
        shape = (num_blocks, block_size, model.num_kv_heads, model.head_dim)
        try:
            if self.device.type == "cpu":  # one mapping in 2 MiB pages where Linux gives them (engine/cpu/huge_pages.py),
                # its memory given now: not in the decode step that first writes a block of each page
                flat = huge_pages.arena([(shape, self.cache_dtype)] * (2 * num_tensors), populate=True)
            else:
                flat = [torch.zeros(shape, dtype=self.cache_dtype, device=self.device) for _ in range(2 * num_tensors)]
            self.kv_tensors = list(zip(flat[0::2], flat[1::2]))  # each (K, V) pair once
            self.kv_caches = self.kv_tensors if kv_cache_config is None else [
                self.kv_tensors[kv_cache_config.tensor_index(layer)] for layer in range(model.num_layers)]
        except (RuntimeError, MemoryError) as error:  # torch reports a failed allocation as RuntimeError
            gib = 2 * num_tensors * torch.Size(shape).numel() * self.cache_dtype.itemsize / 2**30
            raise ValueError(f"cannot allocate a KV pool of {num_blocks} blocks x {block_size} slots ({gib:.1f} GiB): use fewer or smaller blocks") from error
        cpu_shape = (num_cpu_blocks, *shape[1:])
        pin = self.device.type == "cuda"
        try:
            self.cpu_kv_caches = [
                (torch.zeros(cpu_shape, dtype=self.cache_dtype, pin_memory=pin), torch.zeros(cpu_shape, dtype=self.cache_dtype, pin_memory=pin))
                for _ in range(num_tensors)
            ] if num_cpu_blocks else []
        except (RuntimeError, MemoryError) as error:
            gib = 2 * num_tensors * torch.Size(cpu_shape).numel() * self.cache_dtype.itemsize / 2**30
            raise ValueError(f"cannot allocate {num_cpu_blocks} CPU blocks ({gib:.1f} GiB: the swap space's and the CPU tier's): "
                             "give a smaller swap_space or kv_offload_blocks") from error

    def caches_for(self, attention_block_size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The pools viewed with the allocator's block size (contiguous: 1-slot blocks); no copy."""
        if attention_block_size == self.block_size:
            return self.kv_caches
        assert self.kv_cache_config is None, "a hybrid pool is paged"
        return [(k.view(-1, attention_block_size, *k.shape[2:]), v.view(-1, attention_block_size, *v.shape[2:])) for k, v in self.kv_caches]

    def prepare(self, batch: SchedulerOutput, kv: KVCacheManager):
        """Flat inputs for the batch, prefills first.

        Returns:
            (input_ids ``[num_tokens]`` int64, positions ``[num_tokens]`` int64, AttentionMetadata,
            last_token_index ``[num_seqs]`` int64: the row whose logits choose each request's next token)
        """
        input_ids, positions, slots = [], [], []
        for seq in batch.prefill_seqs + batch.decode_seqs:
            start = seq.num_computed_tokens
            end = start + batch.num_tokens_of(seq)  # a chunk of a prompt ends before num_tokens
            input_ids += seq.token_ids[start:end]
            positions += range(start, end)
            slots += kv.slot_mapping(seq, start, end)
        lens = [batch.num_tokens_of(seq) for seq in batch.prefill_seqs]
        dev = self.device
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=dev),
            num_prefill_tokens=sum(lens),
            prefill_query_start_loc=torch.tensor([0] + _cumsum(lens), dtype=torch.int32, device=dev),
            prefill_context_lens=torch.tensor([s.num_computed_tokens + n for s, n in zip(batch.prefill_seqs, lens)],
                                              dtype=torch.int32, device=dev),
            prefill_block_tables=self._block_tables(batch.prefill_seqs, kv),
            decode_context_lens=self._context_lens(batch.decode_seqs),
            decode_block_tables=self._block_tables(batch.decode_seqs, kv),
            backend=self.backend,
            prefills_from_scratch=all(s.num_computed_tokens == 0 for s in batch.prefill_seqs),
        )
        if kv.num_kv_cache_groups > 1:
            meta.layer_metadata = self._layer_metadata(batch, kv, meta)
        elif self.backend.plan is not None:
            block_size = kv.attention_block_size
            meta.plan = self.backend.plan(meta.slot_mapping, meta.decode_block_tables, meta.decode_context_lens, block_size)
        ends = _cumsum(lens + [1] * len(batch.decode_seqs))
        last = torch.tensor([e - 1 for e in ends], dtype=torch.int64, device=dev)
        ids = torch.tensor(input_ids, dtype=torch.int64, device=dev)
        pos = torch.tensor(positions, dtype=torch.int64, device=dev)
        return ids, pos, meta, last

    @torch.inference_mode()
    def execute(self, batch: SchedulerOutput, kv: KVCacheManager) -> torch.Tensor:
        """Run the model on the batch; returns next-token logits ``[num_seqs, vocab_size]`` fp32.
        The step's copy-on-write block copies (``batch.blocks_to_copy``) run first, in every layer."""
        if batch.blocks_to_copy:
            self.copy_blocks(batch.blocks_to_copy, kv.attention_block_size)
        ids, pos, meta, last = self.prepare(batch, kv)
        hidden = self.model(ids, pos, self.caches_for(kv.attention_block_size), meta)
        # Decode tokens only: one row per sequence, in order, so every row is a last one (no copy).
        return self.model.compute_logits(hidden if meta.num_prefill_tokens == 0 else hidden[last])

    def capture_attention(self) -> AttentionRecorder:
        """Keep, from now on, each step's attention inputs and output for every layer, one row per
        sequence (its newest token): ``recorder.last(layer)`` gives a
        :class:`~engine.model_executor.attention_capture.CapturedAttention` with the query
        ``[num_seqs, num_heads, head_dim]``, the layer's key/value pools
        ``[num_blocks, block_size, num_kv_heads, head_dim]``, the block tables ``[num_seqs, max_blocks]``
        int32 and context lengths ``[num_seqs]`` int32 that attention read, and the engine's output.

        For replaying a decode kernel on real inputs (the app's Kernel lab). While it is on, decode steps
        run layer by layer in Python modules instead of one C++ call (same tokens, another time);
        ``recorder.remove()`` (or leaving its ``with`` block) ends it.
        """
        return AttentionRecorder(self.model)

    def swap(self, blocks_to_swap_out: list[tuple[int, int]], blocks_to_swap_in: list[tuple[int, int]]) -> None:
        """Run a step's swap copies: ``(gpu, cpu)`` pairs out to the CPU pool first, then ``(cpu, gpu)``
        pairs in (``engine.model_executor.attention.swap_blocks``, every layer's K and V)."""
        gpu = [c for kv in self.kv_tensors for c in kv]
        cpu = [c for kv in self.cpu_kv_caches for c in kv]
        for pairs, src, dst in ((blocks_to_swap_out, gpu, cpu), (blocks_to_swap_in, cpu, gpu)):
            if pairs:
                swap_blocks(src, dst, torch.tensor(pairs, dtype=torch.int64).reshape(-1, 2))

    def copy_blocks(self, pairs: list[tuple[int, int]], attention_block_size: int) -> None:
        """Copy K and V of each ``(src, dst)`` block (units of ``attention_block_size``) in every layer."""
        caches = self.caches_for(attention_block_size) if self.kv_cache_config is None else self.kv_tensors
        mapping = torch.tensor(pairs, dtype=torch.int64, device=self.device).reshape(-1, 2)
        self.backend.copy_blocks([k for k, _ in caches], [v for _, v in caches], mapping)

    def _layer_metadata(self, batch: SchedulerOutput, kv: KVCacheManager, meta: AttentionMetadata) -> list[AttentionMetadata]:
        """A hybrid model: each KV cache group's slot mapping and block tables, and each layer its
        group's (vLLM's per-group ``CommonAttentionMetadata``)."""
        per_group = []
        for gi in range(kv.num_kv_cache_groups):
            slots = [slot for seq in batch.prefill_seqs + batch.decode_seqs
                     for slot in kv.group_slot_mapping(seq, seq.num_computed_tokens, seq.num_computed_tokens + batch.num_tokens_of(seq), gi)]
            group = dataclasses.replace(
                meta, slot_mapping=torch.tensor(slots, dtype=torch.int64, device=self.device),
                prefill_block_tables=self._block_tables(batch.prefill_seqs, kv, gi),
                decode_block_tables=self._block_tables(batch.decode_seqs, kv, gi))
            if self.backend.plan is not None:
                group.plan = self.backend.plan(group.slot_mapping, group.decode_block_tables, group.decode_context_lens, kv.block_size)
            per_group.append(group)
        return [per_group[self.kv_cache_config.layer_to_group[layer]] for layer in range(self.model.num_layers)]

    def _context_lens(self, seqs) -> torch.Tensor:
        return torch.tensor([seq.num_tokens for seq in seqs], dtype=torch.int32, device=self.device)

    def _block_tables(self, seqs, kv: KVCacheManager, group_id: int | None = None) -> torch.Tensor:
        tables = [kv.attention_block_table(seq) if group_id is None else kv.group_block_table(seq, group_id) for seq in seqs]
        width = max((len(t) for t in tables), default=0)
        padded = [t + [0] * (width - len(t)) for t in tables]
        return torch.tensor(padded, dtype=torch.int32, device=self.device).reshape(len(seqs), width)


def _cumsum(values: list[int]) -> list[int]:
    out, total = [], 0
    for v in values:
        total += v
        out.append(total)
    return out
