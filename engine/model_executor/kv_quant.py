"""The fp8 KV cache: K and V stored as one-byte floats with a per-layer scale (vLLM's ``kv_cache_dtype``).

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

from engine.core.lab_impl import plug_lab_parts

FP8_DTYPES = {"fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
# vLLM's K_SCALE_CONSTANT and V_SCALE_CONSTANT (vllm/envs.py): calculate_kv_scales takes max|K| / 200
# and max|V| / 100, leaving headroom for later tokens larger than the first pass's.
K_SCALE_CONSTANT = 200.0
V_SCALE_CONSTANT = 100.0


def cache_dtype(kv_cache_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    """The pool's torch dtype for vLLM's ``kv_cache_dtype`` name: the model's dtype for ``"auto"``.

    Raises:
        ValueError: an unknown name.
    """
    if kv_cache_dtype == "auto":
        return model_dtype
    if kv_cache_dtype not in FP8_DTYPES:
        raise ValueError(f"kv_cache_dtype must be auto, {', '.join(FP8_DTYPES)}; got {kv_cache_dtype!r}")
    return FP8_DTYPES[kv_cache_dtype]


def is_fp8(dtype: torch.dtype) -> bool:
    """True for the fp8 pool dtypes (``torch.float8_e4m3fn``, ``torch.float8_e5m2``)."""
    return dtype in (torch.float8_e4m3fn, torch.float8_e5m2)


def quantize_kv(x: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """What an fp8 pool stores for ``x``: ``fp8(x / scale)``, saturated at the format's largest value.

    Args:
        x: K or V, any shape, fp32/fp16/bf16.
        scale: the layer's ``k_scale`` or ``v_scale`` (> 0).
        dtype: ``torch.float8_e4m3fn`` or ``torch.float8_e5m2``.

    Returns:
        ``x``'s shape in ``dtype``; |x / scale| beyond the largest finite value becomes that value, with x's sign.
    """
    # BEGIN SOLUTION kv_quant
    largest = torch.finfo(dtype).max
    return (x.float() / scale).clamp_(-largest, largest).to(dtype)
    # END SOLUTION


def dequantize_kv(x8: torch.Tensor, scale: float, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """What attention reads from an fp8 pool: ``float(x8) * scale``.

    Args:
        x8: fp8 values (``torch.float8_e4m3fn`` or ``torch.float8_e5m2``), any shape.
        scale: the scale they were stored with.
        dtype: the result's dtype (fp32 by default; the kernels keep it in registers).

    Returns:
        ``x8``'s shape in ``dtype``.
    """
    # BEGIN SOLUTION kv_quant
    return (x8.float() * scale).to(dtype)
    # END SOLUTION


def compute_kv_scales(key: torch.Tensor, value: torch.Tensor) -> tuple[float, float]:
    """One layer's ``(k_scale, v_scale)`` from a forward pass's K and V, as vLLM's ``calculate_kv_scales``:
    ``max|K| / K_SCALE_CONSTANT`` and ``max|V| / V_SCALE_CONSTANT`` (200 and 100): the largest key of the
    pass lands at 200 of e4m3's 448, the largest value at 100. A tensor of zeros keeps the scale 1.0.

    Args:
        key, value: ``[num_tokens, num_kv_heads, head_dim]``.

    Returns:
        Two Python floats > 0.
    """
    # BEGIN SOLUTION kv_quant
    k_max, v_max = float(key.abs().max()), float(value.abs().max())
    return (k_max / K_SCALE_CONSTANT if k_max > 0 else 1.0), (v_max / V_SCALE_CONSTANT if v_max > 0 else 1.0)
    # END SOLUTION


def as_bytes(cache: torch.Tensor) -> torch.Tensor:
    """An fp8 pool seen as its bytes (``torch.uint8``, no copy), for torch's copies and gathers that have no
    fp8 kernel on CPU (``index_copy_``, ``index_fill_``); any other pool as it is. A block copied byte by
    byte is the same block: swap, copy-on-write and offload need no scale."""
    return cache.view(torch.uint8) if is_fp8(cache.dtype) else cache


plug_lab_parts(globals())  # labs: a student's part in place of the engine's (engine/core/lab_impl.py)
