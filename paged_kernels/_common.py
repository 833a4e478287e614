"""Helpers shared by the kernels' Python wrappers: interpreter detection and input checks.

The checks run on the host before a launch because a kernel given a wrong shape or dtype does
not fail: it reads the wrong bytes and returns a plausible-looking wrong answer.
"""

from __future__ import annotations

import os

import torch

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)  # an fp8 KV cache (engine/model_executor/kv_quant.py)


def interpreted() -> bool:
    """True when Triton kernels run in Triton's CPU interpreter (``TRITON_INTERPRET`` set).

    Triton reads the variable when a kernel is decorated, i.e. when :mod:`paged_kernels` is imported,
    so this reports the mode the kernels were built in as long as the variable is left alone.
    """
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() not in ("", "0", "false", "off", "no")


def interpreter_ready() -> bool:
    """True when Triton's own library was loaded in interpreter mode too, not only our kernels.

    ``tl.zeros``, ``tl.max`` and friends are themselves ``@triton.jit`` functions, decorated when
    ``triton.language`` is first imported. If something (torch does, on its first model run) imported
    Triton before ``TRITON_INTERPRET`` was set, they stay compiled-mode and the interpreter cannot call them.
    """
    import triton.language as tl

    return type(tl.zeros).__name__ == "InterpretedFunction"


def next_pow2(n: int) -> int:
    """Smallest power of two >= n (>= 1). Triton block shapes must be powers of two."""
    return 1 << max(0, int(n) - 1).bit_length()


def check_device(name: str, tensor: torch.Tensor, device: torch.device) -> None:
    if tensor.device != device:
        raise ValueError(f"{name} is on {tensor.device}, expected {device} (all inputs must share a device)")


def check_runnable(device: torch.device) -> None:
    """A CPU tensor can only be used by the interpreter; a CUDA tensor only by the compiler."""
    if device.type == "cpu" and not interpreted():
        raise ValueError(
            "inputs are CPU tensors but Triton is not in interpreter mode; set TRITON_INTERPRET=1 "
            "before importing kernels (paged_kernels/__init__.py does this when no CUDA device is available)"
        )
    if device.type == "cpu" and not interpreter_ready():
        raise RuntimeError(
            "Triton was imported before TRITON_INTERPRET=1 was set, so its library is compiled for a GPU and "
            "cannot run on the CPU; set TRITON_INTERPRET=1 in the environment, or import paged_kernels "
            "before anything imports Triton"
        )
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"unsupported device {device}; expected cuda (or cpu under TRITON_INTERPRET=1)")


def check_caches(key_cache: torch.Tensor, value_cache: torch.Tensor) -> tuple[int, int, int, int]:
    """Return ``(num_blocks, block_size, num_kv_heads, head_dim)`` after checking both pools agree."""
    if key_cache.dim() != 4:
        raise ValueError(
            f"key_cache must be [num_blocks, block_size, num_kv_heads, head_dim], got shape {tuple(key_cache.shape)}"
        )
    if value_cache.shape != key_cache.shape:
        raise ValueError(f"value_cache shape {tuple(value_cache.shape)} != key_cache shape {tuple(key_cache.shape)}")
    if key_cache.dtype != value_cache.dtype:
        raise ValueError(f"key_cache dtype {key_cache.dtype} != value_cache dtype {value_cache.dtype}")
    if key_cache.dtype not in SUPPORTED_DTYPES + FP8_DTYPES:
        raise ValueError(f"cache dtype {key_cache.dtype} not supported; use one of {SUPPORTED_DTYPES + FP8_DTYPES}")
    check_device("value_cache", value_cache, key_cache.device)
    check_runnable(key_cache.device)
    return tuple(key_cache.shape)  # type: ignore[return-value]


def check_attention_inputs(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
) -> tuple[int, int, int, int, int]:
    """Checks shared by decode and prefill.

    Returns ``(num_heads, head_dim, block_size, num_kv_heads, num_seqs)``.
    """
    _, block_size, num_kv_heads, head_dim = check_caches(key_cache, value_cache)
    if query.dim() != 3:
        raise ValueError(f"query must be 3-D [tokens, num_heads, head_dim], got shape {tuple(query.shape)}")
    _, num_heads, q_head_dim = query.shape
    if q_head_dim != head_dim:
        raise ValueError(f"query head_dim {q_head_dim} != cache head_dim {head_dim}")
    if num_heads % num_kv_heads != 0:
        raise ValueError(f"num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}")
    if query.dtype != key_cache.dtype and key_cache.dtype not in FP8_DTYPES:
        raise ValueError(f"query dtype {query.dtype} != cache dtype {key_cache.dtype}")
    if query.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"query dtype {query.dtype} not supported; use one of {SUPPORTED_DTYPES}")
    if block_tables.dim() != 2 or block_tables.dtype != torch.int32:
        raise ValueError(
            f"block_tables must be 2-D int32 [num_seqs, max_blocks], got {block_tables.dtype} "
            f"shape {tuple(block_tables.shape)}"
        )
    if context_lens.dim() != 1 or context_lens.dtype != torch.int32:
        raise ValueError(
            f"context_lens must be 1-D int32 [num_seqs], got {context_lens.dtype} shape {tuple(context_lens.shape)}"
        )
    num_seqs = block_tables.shape[0]
    if context_lens.shape[0] != num_seqs:
        raise ValueError(f"context_lens has {context_lens.shape[0]} entries but block_tables has {num_seqs} rows")
    for name, t in (("query", query), ("block_tables", block_tables), ("context_lens", context_lens)):
        check_device(name, t, key_cache.device)
    return num_heads, head_dim, block_size, num_kv_heads, num_seqs


def check_scales(key_cache: torch.Tensor, k_scale: float, v_scale: float) -> None:
    """An fp8 cache's scales must be finite and > 0 (a kernel dividing by 0 writes inf, silently)."""
    if key_cache.dtype in FP8_DTYPES and not all(s > 0 and s < float("inf") for s in (k_scale, v_scale)):
        raise ValueError(f"k_scale and v_scale must be finite and > 0, got {k_scale} and {v_scale}")


def dot_precision(dtype: torch.dtype) -> str:
    """``tl.dot`` input precision: exact fp32 for fp32 inputs (the GPU default, tf32, keeps only
    10 mantissa bits and would miss a 1e-5 tolerance); for fp16/bf16 the value is unused."""
    return "ieee" if dtype == torch.float32 else "tf32"
