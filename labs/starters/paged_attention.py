"""Lab paged_attention: Paged attention in torch / 用 torch 写分页注意力.

Decode attention through block tables: translate tables into per-position slots, gather K and V with
zeros past each context, then a masked softmax with grouped-query heads. It must equal dense
attention.

通过块表计算解码注意力：把块表转成每个位置的槽位，读出 K 和 V（上下文之外置零），再做带掩码的 softmax，支持分组查询注意力。结果必须等于稠密注意力。

Your part plugs into the engine in place of its own, in engine/model_executor/attention.py (the engine module's names are in
scope here). Grade it in your copy of the starters (labs/README.md), where the labs build on
each other:

    python -m lessons grade paged_attention --impl labs/mine

Cut by `python -m lessons labs build` from engine/model_executor/attention.py; work on a copy.

The module engine/model_executor/attention.py, for context:

PagedAttention in plain torch: the CPU default and the oracle for the Triton kernels.

Cache layout (one pair of pools per transformer layer)::

    key_cache   [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache [num_blocks, block_size, num_kv_heads, head_dim]

Token position ``i`` of a sequence lives in physical block ``block_table[i // block_size]``
at offset ``i % block_size``; its *slot* is ``block_id * block_size + offset``
(PagedAttention paper §4.1-4.2, vLLM's ``slot_mapping``). Every function here but one reads K and V
only through block tables, never from a per-sequence contiguous tensor, so a wrong block
table shows up as a wrong answer. The one, :func:`prefill_varlen_reference`, is the fast path of
a prefill with nothing cached before it: its prompt's K and V are this step's own, so it reads them
as computed (their copy still goes through the slot mapping, and every later step reads it back
through the block table).

Sliding-window attention (Mistral, Gemma 2 and 3; vLLM's ``sliding_window``): with a window of W tokens
a query at position p sees positions p - W + 1 .. p only (Hugging Face's mask ``kv_idx > q_idx - W``).
The block tables are then read from the block holding the first visible position on
(:func:`window_gather_index`): blocks wholly before the window are never read, so a hybrid KV cache may
already have given them back; the few positions of the edge block before the window are masked.
"""

from __future__ import annotations
import functools
from dataclasses import dataclass
import torch
from torch.nn import functional as F
from engine.model_executor import kv_quant

LAB = "paged_attention"  # the lab whose parts this file holds


def gather_index(block_tables: torch.Tensor, context_lens: torch.Tensor, block_size: int) -> GatherIndex:
    """Translate block tables into per-position slots (``block_table[i // block_size] * block_size + i % block_size``).

    Args:
        block_tables: ``[num_seqs, max_blocks]`` int32.
        context_lens: ``[num_seqs]`` int32, tokens.
        block_size: slots per block.
    """
    # TODO(paged_attention): write this part (see the docstring and labs/README.md)
    raise NotImplementedError("lab paged_attention: gather_index")


def gather_kv(
    cache: torch.Tensor, block_tables: torch.Tensor, context_lens: torch.Tensor, index: GatherIndex | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Read each sequence's K (or V) through its block table into a padded tensor.

    Args:
        cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``.
        block_tables: ``[num_seqs, max_blocks]`` int32.
        context_lens: ``[num_seqs]`` int32.
        index: the same tables already translated by :func:`gather_index` (computed here when None).

    Returns:
        (``[num_seqs, max_blocks * block_size, num_kv_heads, head_dim]`` with zeros past each context,
        ``live`` ``[num_seqs, max_blocks * block_size]`` bool: the position is inside the context).
        Positions past a context never carry what the pool holds there (stale K/V, or NaN).
    """
    # TODO(paged_attention): write this part (see the docstring and labs/README.md)
    raise NotImplementedError("lab paged_attention: gather_kv")


def paged_attention_reference(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    plan: TorchStepPlan | None = None,
    sliding_window: int | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:
    """Decode attention: one query token per sequence against its whole context (or its last
    ``sliding_window`` tokens), through its block table.

    Grouped-query attention: query head ``h`` reads KV head ``h // (num_heads // num_kv_heads)``.
    With one query token, the ``num_heads // num_kv_heads`` query heads of a group are like that many
    queries against the same keys, so each (sequence, KV head) is one small attention problem.
    A sequence with ``context_lens == 0`` (a padded row) gets zeros, and cache slots outside a
    sequence's context are never read into the result, even if they hold NaN.

    Args:
        query: ``[num_seqs, num_heads, head_dim]`` (fp32/fp16/bf16/fp64; may be a strided view).
        key_cache, value_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``.
        block_tables: ``[num_seqs, max_blocks]`` int32; entries past a sequence's blocks are ignored.
        context_lens: ``[num_seqs]`` int32, tokens of context per sequence (including the current one).
        scale: softmax scale, usually ``head_dim ** -0.5``.
        plan: the step's :class:`TorchStepPlan` (its gather index is reused by every layer); None: computed here.
        sliding_window: None (or 0) for full attention; W: the query sees its last W positions only, and
            the blocks before them are not read (:func:`window_gather_index`).
        k_scale, v_scale: fp8 pools only: K and V are read as ``fp8 * k_scale`` and ``fp8 * v_scale``.

    Returns:
        ``[num_seqs, num_heads, head_dim]`` in ``query.dtype``.

    Source: PagedAttention paper §4.1 (attention over non-contiguous KV blocks); vLLM's
    ``paged_attention_v1`` computes the same thing.
    """
    if sliding_window:  # the window's gather index in place of the whole context's
        first = context_lens.to(block_tables.device).long() - sliding_window
        plan = TorchStepPlan(True, window_gather_index(block_tables, context_lens, key_cache.shape[1], first))
    # TODO(paged_attention): write this part (see the docstring and labs/README.md)
    raise NotImplementedError("lab paged_attention: paged_attention_reference")
