"""Lab triton_decode: A Triton paged-attention decode kernel / Triton 分页注意力解码内核.

Inside the engine's Triton kernel: gather one block id per token of a tile through the block table,
and the online-softmax update (running max, rescaled sum and accumulator). Runs in Triton's
interpreter on a CPU.

在引擎的 Triton 内核里：按块表为一个分片的每个词元取出块号，以及在线 softmax 的更新（运行最大值、重新缩放的和与累加器）。在 CPU 上由 Triton 解释器运行。

Your part plugs into the engine in place of its own, in paged_kernels/paged_attention_decode.py (the engine module's names are in
scope here). Run its tests on your file:

    python -m lessons grade triton_decode --impl path/to/triton_decode.py

Cut by `python -m lessons labs build` from paged_kernels/paged_attention_decode.py; work on a copy.

The module paged_kernels/paged_attention_decode.py, for context:

Decode attention over a paged KV cache: one new query token per sequence.

Algorithm (PagedAttention paper §4.1; vLLM ``paged_attention_v1`` / ``_v2``; FlashDecoding).

A sequence's keys and values are scattered over fixed-size blocks of a shared pool; its block
table lists them in order. Token ``t`` lives in block ``block_table[t // block_size]`` at offset
``t % block_size``. On a GPU one Triton *program* handles one (sequence, KV head) pair and one
split of its context. (Under the CPU interpreter, where each program costs a fixed Python
overhead per operation, one program handles many pairs at once, stacked as the leading dim of
3-D tensors and ``tl.dot`` batches; the math per pair is the same.) Per pair:

1. It loads the query rows of *all* query heads that share this KV head (grouped-query
   attention: ``group = num_heads // num_kv_heads``). Loading K and V once for the whole group,
   instead of once per query head, divides the memory traffic by ``group``. The group is padded
   to at least 16 rows (the smallest ``tl.dot`` tile the GPU compiler accepts) and the padding
   rows are masked when storing.
2. It walks its range of context tokens ``TILE`` tokens at a time. For every token of the tile
   it gathers the block id from the block table, so one tile can span several blocks and block
   sizes that are not powers of two (48) or tiny (1) work the same way. K and V are read with
   ``block_id * stride`` computed in int64 (a large pool overflows int32).
3. Online softmax (Milakov & Gimelshein 2018; FlashAttention): it keeps, per query row, the
   running max ``m`` of the logits, the running sum ``l`` of ``exp(logit - m)`` and the running
   weighted sum ``acc`` of V, all in fp32. When a tile raises the max, the old ``l`` and ``acc``
   are rescaled by ``exp(m_old - m_new)``. So the full row of logits never has to exist at once,
   and large logits (1e4) never overflow because every exponent is <= 0.
   We use ``exp2`` with the scale pre-multiplied by ``log2(e)``: the same math, one
   multiplication less per element on the GPU.

Split-K (vLLM v2, FlashDecoding). With few sequences and long contexts, one program per
(sequence, KV head) leaves most GPU cores idle. Then the context is cut into ``num_splits``
partitions, each program handles one partition and writes its partial output ``acc / l``
together with its ``m`` and ``l``; :mod:`paged_kernels.paged_attention_reduce` then combines them.
A partition that starts past the context (more partitions than blocks) writes
``m = -inf, l = 0`` and contributes nothing.

Padding rows (``context_lens == 0``) run no loop iteration and write zeros; cache slots outside
a context are never loaded (masked loads), so NaN garbage there cannot leak into the result.
"""

from __future__ import annotations
import functools
import math
import torch
import triton
import triton.language as tl
from paged_kernels._common import check_attention_inputs, dot_precision, interpreted, next_pow2
from paged_kernels.paged_attention_reduce import paged_attention_reduce

LAB = "triton_decode"  # the lab whose parts this file holds
