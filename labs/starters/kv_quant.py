"""Lab kv_quant: An fp8 KV cache: quantize and dequantize with scales / fp8 KV 缓存：带缩放因子的量化与反量化.

What an fp8 pool stores and what attention reads back: fp8(x / scale) rounded to the nearest value
and saturated at the format's largest one (448 for e4m3, 57344 for e5m2), fp8 * scale on the way
out, and vLLM's calculate_kv_scales (max|K| / 200, max|V| / 100). Every attention path of the engine
reads the pool your functions write.

fp8 池里存的是什么、注意力读回来的是什么：fp8(x / scale)，舍入到最近的值，超出格式最大值（e4m3 为 448，e5m2 为 57344）时饱和到最大值；读出时乘回缩放因子；以及 vLLM 的 calculate_kv_scales（max|K| / 200，max|V| / 100）。引擎的每条注意力路径都读取你的函数写入的池。

Your part plugs into the engine in place of its own, in engine/model_executor/kv_quant.py (the engine module's names are in
scope here). Grade it in your copy of the starters (labs/README.md), where the labs build on
each other:

    python -m lessons grade kv_quant --impl labs/mine

Cut by `python -m lessons labs build` from engine/model_executor/kv_quant.py; work on a copy.

The module engine/model_executor/kv_quant.py, for context:

The fp8 KV cache: K and V stored as one-byte floats with a per-layer scale (vLLM's ``kv_cache_dtype``).

An fp8 pool keeps, for every cached element ``x``, the byte ``fp8(x / scale)``; attention reads it back as
``fp8_value * scale``. One scale per layer for K (``k_scale``) and one for V (``v_scale``): vLLM's
per-tensor scales (``Attention._k_scale``, ``_v_scale``), 1.0 unless a checkpoint gives them or
``calculate_kv_scales`` computes them once from the first forward pass.

The two fp8 forms (OCP 8-bit floating point; Micikevicius et al., "FP8 Formats for Deep Learning", 2022):

====================  =========================  =============  ==========================
vLLM's name           torch dtype                largest value  precision (mantissa bits)
====================  =========================  =============  ==========================
``fp8``, ``fp8_e4m3``  ``torch.float8_e4m3fn``     448            3 (relative step 1/8)
``fp8_e5m2``          ``torch.float8_e5m2``      57344          2 (relative step 1/4)
====================  =========================  =============  ==========================

Writing rounds to the nearest fp8 value (ties to even, as torch's cast, Triton's and CUDA's
``__nv_cvt_float_to_fp8`` do) and saturates at the largest finite value (CUDA's ``__NV_SATFINITE``):
a key beyond 448 x k_scale is stored as 448, never as NaN.

Every attention path reads this module's layout: the torch reference (engine/model_executor/attention.py),
the Triton kernels (paged_kernels/) and the C++ CPU kernel (engine/cpu/csrc/paged_attention.cpp) each
dequantize in their own registers with the same formula.
"""

from __future__ import annotations
import torch

LAB = "kv_quant"  # the lab whose parts this file holds


def quantize_kv(x: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """What an fp8 pool stores for ``x``: ``fp8(x / scale)``, saturated at the format's largest value.

    Args:
        x: K or V, any shape, fp32/fp16/bf16.
        scale: the layer's ``k_scale`` or ``v_scale`` (> 0).
        dtype: ``torch.float8_e4m3fn`` or ``torch.float8_e5m2``.

    Returns:
        ``x``'s shape in ``dtype``; |x / scale| beyond the largest finite value becomes that value, with x's sign.
    """
    # TODO(kv_quant): write this part (see the docstring and labs/README.md)
    raise NotImplementedError("lab kv_quant: quantize_kv")


def dequantize_kv(x8: torch.Tensor, scale: float, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """What attention reads from an fp8 pool: ``float(x8) * scale``.

    Args:
        x8: fp8 values (``torch.float8_e4m3fn`` or ``torch.float8_e5m2``), any shape.
        scale: the scale they were stored with.
        dtype: the result's dtype (fp32 by default; the kernels keep it in registers).

    Returns:
        ``x8``'s shape in ``dtype``.
    """
    # TODO(kv_quant): write this part (see the docstring and labs/README.md)
    raise NotImplementedError("lab kv_quant: dequantize_kv")


def compute_kv_scales(key: torch.Tensor, value: torch.Tensor) -> tuple[float, float]:
    """One layer's ``(k_scale, v_scale)`` from a forward pass's K and V, as vLLM's ``calculate_kv_scales``:
    ``max|K| / K_SCALE_CONSTANT`` and ``max|V| / V_SCALE_CONSTANT`` (200 and 100): the largest key of the
    pass lands at 200 of e4m3's 448, the largest value at 100. A tensor of zeros keeps the scale 1.0.

    Args:
        key, value: ``[num_tokens, num_kv_heads, head_dim]``.

    Returns:
        Two Python floats > 0.
    """
    # TODO(kv_quant): write this part (see the docstring and labs/README.md)
    raise NotImplementedError("lab kv_quant: compute_kv_scales")
