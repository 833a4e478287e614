"""Where and how the engine runs: the device, the dtype, the attention backend, and a description of
the CPU path a step takes (vLLM's platform selection, ``vllm/platforms``)."""

from __future__ import annotations

import torch

from engine.cpu import huge_pages
from engine.model_executor.model_runner import CPU_KERNEL_BACKEND, TORCH_BACKEND, triton_backend


def describe_cpu_backend(model, backend, dtype: torch.dtype, greedy_kernel: bool = False) -> str:
    """What runs each part of a CPU step, for the bench and the app: the engine's C++ kernels
    (engine/cpu/ops.py) or torch, whether a decode step runs each layer as one C++ call
    (engine.model_executor.model.DecoderLayer.decode), greedy sampling's argmax, and in which pages the weights and
    KV cache live."""
    layer = model.model.layers[0]
    parts = [name for name, on in (("matmul", model.cpu_kernels), ("RMSNorm", layer.input_layernorm.cpu_kernel),
                                    ("RoPE", layer.self_attn.cpu_kernel), ("SiLU-and-mul", layer.mlp.cpu_kernel),
                                    ("decode attention", backend is CPU_KERNEL_BACKEND)) if on]
    on_cpu = next(model.parameters()).device.type == "cpu"
    pages = huge_pages.status("packed weights and KV cache" if model.cpu_kernels else "KV cache") if on_cpu else ""
    if not parts:
        return f"torch; {pages}" if pages else "torch"
    rest = [name for name in ("matmul", "RMSNorm", "RoPE", "SiLU-and-mul", "decode attention") if name not in parts]
    why = ""
    if "matmul" in rest:
        why = " (no AVX2)" if dtype == torch.float32 else " (no AVX512-BF16)"
    text = f"engine CPU kernels ({', '.join(parts)})" + (f", torch {', '.join(rest)}{why}" if rest else "")
    if model.decode_layers and backend.cpu_decode_layer:
        text += "; decode steps: " + ("all decoder layers in one C++ call" if model.layers_decode_weights is not None else "one C++ call per decoder layer")
    if greedy_kernel:
        text += "; greedy sampling: one C++ call"
    return f"{text}; {pages}"


def resolve_device(device: str) -> torch.device:
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' but no CUDA device is available")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, dtype)


def resolve_backend(name: str, device: torch.device, dtype: torch.dtype):
    if name == "auto":
        name = "triton" if device.type == "cuda" else "torch"
    if name == "torch":
        return TORCH_BACKEND
    if device.type == "cpu" and dtype not in (torch.float32, torch.float16):
        raise ValueError(f"the triton backend on CPU runs in Triton's interpreter, which supports float32/float16, not {dtype}")
    backend = triton_backend()
    import paged_kernels

    if device.type == "cpu" and not paged_kernels.interpreter_ready():
        raise ValueError(
            "the triton backend cannot run here: Triton was imported before TRITON_INTERPRET=1 was set "
            "(import paged_kernels before anything imports Triton, or set TRITON_INTERPRET=1 in the environment)"
        )
    return backend


def available_host_memory() -> int | None:
    """Bytes of host memory a new allocation can take without swapping: Linux's ``MemAvailable``
    (``/proc/meminfo``), else the free pages (``os.sysconf``); None where neither is known."""
    import os

    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_host_blocks(setting: str, num_blocks: int, block_bytes: int, available: int | None) -> None:
    """Refuse, naming ``setting``, a CPU pool of ``num_blocks`` blocks of ``block_bytes`` bytes that
    needs more than ``available`` bytes of host memory (None: not known, nothing checked): torch
    would reserve it lazily, and the machine would run out of memory only once it is written.

    Raises:
        ValueError: the pool is larger than the available memory.
    """
    needed = num_blocks * block_bytes
    if available is not None and needed > available:
        raise ValueError(f"{setting} needs {needed / 2**30:,.1f} GiB of CPU memory ({num_blocks:,} blocks of "
                         f"{block_bytes / 2**10:,.1f} KiB), and {available / 2**30:,.1f} GiB is available: give fewer blocks")
