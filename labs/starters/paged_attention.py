"""Lab paged_attention: Paged attention in torch / 用 torch 写分页注意力.

Decode attention through block tables: translate tables into per-position slots, gather K and V with
zeros past each context, then a masked softmax with grouped-query heads. It must equal dense
attention.

通过块表计算解码注意力：把块表转成每个位置的槽位，读出 K 和 V（上下文之外置零），再做带掩码的 softmax，支持分组查询注意力。结果必须等于稠密注意力。

Your part plugs into the engine in place of its own, in engine/model_executor/attention.py (the engine module's names are in
scope here). Run its tests on your file:

    python -m lessons grade paged_attention --impl path/to/paged_attention.py

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
"""

from __future__ import annotations
from dataclasses import dataclass
import torch
from torch.nn import functional as F

LAB = "paged_attention"  # the lab whose parts this file holds
