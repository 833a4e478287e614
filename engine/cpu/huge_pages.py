"""Weights and KV pools in 2 MiB pages on Linux CPUs (transparent huge pages, ``madvise``).

What: the packed copies of the weights that the CPU decode matmuls read (:func:`engine.cpu.ops.pack_weights`)
and each engine's KV pool (engine/model_executor/model_runner.py). The weights as loaded stay ordinary tensors: only
prefill and the torch fallback read them, and a first touch of huge pages costs ~1.3 s per GB here
(the kernel compacts memory to find them), which every engine load would pay twice.

Why: a decode step streams every weight once (538 MB for SmolLM2-135M in fp32). In 4 KiB pages that
is ~131,000 pages a step, far more than the TLB holds, so the matmul kernel's reads keep waiting for
page-table walks and the hardware prefetchers stop at every page boundary. In 2 MiB pages the same
weights are ~270 pages. On the 2-core machine of the README, the 30 layers' matmuls plus the LM head
of one decode step took 29.0 -> 19.7 ms at 8 rows and 19.5 -> 17.1 ms at 1 row (throwaway harness,
alternating the two layouts; ``python -m engine bench`` measures a whole workload). Inference
engines do the same for their weights and caches (llama.cpp maps model files with huge pages where it
can; vLLM's CPU backend leaves it to the allocator).

How: a private anonymous ``mmap`` one huge page larger than needed, its start rounded up to 2 MiB, is
marked ``MADV_HUGEPAGE`` before anything is written to it, so that the kernel backs it with huge
pages when it is first touched (Linux's ``/sys/kernel/mm/transparent_hugepage/enabled`` must say
``always`` or ``madvise``). Tensors are views into it (``torch.frombuffer``, which keeps the mapping
alive as long as any view of it lives). The memory is zero-filled, as ``torch.zeros`` would give.

Where huge pages are not available (another OS, THP set to ``never``, no ``MADV_HUGEPAGE``), the same
functions return ordinary tensors: nothing else changes. :func:`status` says which it was.
"""

from __future__ import annotations

import math
import mmap
import sys
from pathlib import Path

import torch

HUGE_PAGE = 2 << 20  # bytes
ALIGN = 64  # bytes between tensors in one arena: a cache line, what the kernels' vector loads like
THP_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def why_not_available() -> str | None:
    """None when this process can ask for transparent huge pages; otherwise why not (one line)."""
    if not sys.platform.startswith("linux") or not hasattr(mmap, "MADV_HUGEPAGE"):
        return "transparent huge pages are Linux-only"
    try:
        setting = THP_SETTING.read_text()
    except OSError:
        return f"{THP_SETTING} is not readable"
    chosen = setting[setting.find("[") + 1: setting.find("]")] if "[" in setting else setting.strip()
    if chosen not in ("always", "madvise"):
        return f"transparent huge pages are set to {chosen!r} ({THP_SETTING})"
    return None


def status(subject: str = "KV cache") -> str:
    """What :func:`arena` gives on this machine, for the bench and the engine's backend line:
    ``"<subject> in 2 MiB pages"``, or ``"4 KiB pages (why)"``."""
    reason = why_not_available()
    return f"{subject} in 2 MiB pages" if reason is None else f"4 KiB pages ({reason})"


def arena(specs: list[tuple[tuple[int, ...], torch.dtype]], populate: bool = False) -> list[torch.Tensor]:
    """Zero-filled CPU tensors of the given (shape, dtype)s, laid out one after another (64-byte aligned)
    in one mapping advised for 2 MiB pages; ordinary ``torch.zeros`` where :func:`why_not_available`.

    Args:
        specs: (shape, dtype) of each tensor.
        populate: give the mapping its memory now (write every page), as ``torch.zeros`` does, rather
            than at each page's first write. For a KV pool: the kernel finds a free 2 MiB page at a
            page's first write, compacting memory when there is none at hand, which took from ~0.1 ms
            to 0.4 s per page here; left to the first write, that lands in whichever decode step first
            writes a block in that page of each layer's pool (a 444 ms step among 20-40 ms ones, seen
            in the bench's workload). Populated, the cost is paid once, when the engine is built
            (377 MB of the default model's 512-block pool: 30 ms to 2.4 s here, depending on how
            fragmented memory is). vLLM allocates its KV cache whole at start-up too.

    Raises:
        MemoryError: the mapping cannot be made (not enough memory).
    """
    if why_not_available() is not None:
        return [torch.zeros(shape, dtype=dtype) for shape, dtype in specs]
    sizes = [math.prod(shape) * torch.empty((), dtype=dtype).element_size() for shape, dtype in specs]
    offsets, end = [], 0
    for size in sizes:
        offsets.append(end)
        end += -(-size // ALIGN) * ALIGN
    length = max(-(-end // HUGE_PAGE) * HUGE_PAGE, HUGE_PAGE)
    try:
        # Private: Python's default anonymous mapping is shared memory, which THP's `enabled` does not cover.
        region = mmap.mmap(-1, length + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except OSError as error:
        raise MemoryError(f"cannot map {length / 2**20:.0f} MiB for tensors: {error}") from error
    start = -_address(region) % HUGE_PAGE  # the first 2 MiB boundary inside the mapping
    region.madvise(mmap.MADV_HUGEPAGE, start, length)
    tensors = []
    for (shape, dtype), offset, size in zip(specs, offsets, sizes):
        if size == 0:
            tensors.append(torch.zeros(shape, dtype=dtype))
            continue
        flat = torch.frombuffer(region, dtype=torch.uint8, count=size, offset=start + offset)
        if populate:
            flat.zero_()  # a write to every page: each is given its memory now
        tensors.append(flat.view(dtype).view(shape))
    return tensors


def place(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The same tensors (names, shapes, dtypes, values) copied into one huge-page :func:`arena`, so
    that reading all of them walks few pages; a tensor that appears under two names (tied
    embeddings) stays one tensor. Non-CPU tensors are returned as they are. Where huge pages are not
    available, ``tensors`` itself is returned (nothing is copied)."""
    if why_not_available() is not None or not tensors:
        return tensors
    unique: dict[int, torch.Tensor] = {}
    for t in tensors.values():
        if t.device.type == "cpu":
            unique.setdefault(id(t), t)
    copies = dict(zip(unique, arena([(tuple(t.shape), t.dtype) for t in unique.values()])))
    for key, t in unique.items():
        copies[key].copy_(t)
    return {name: copies.get(id(t), t) for name, t in tensors.items()}


def huge_page_share(t: torch.Tensor) -> float:
    """The share (0-1) of the mapping holding ``t`` that Linux backs with huge pages now
    (``AnonHugePages`` over its size in ``/proc/self/smaps``; :func:`arena`'s advised range is a mapping
    of its own); 0.0 where that cannot be read."""
    address = t.data_ptr()
    try:
        lines = Path("/proc/self/smaps").read_text().splitlines()
    except OSError:
        return 0.0
    inside = False
    for line in lines:
        head = line.split(None, 1)[0]
        if "-" in head and ":" not in head:  # a mapping's first line: "start-end perms ..."
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= address < hi
            size = hi - lo
        elif inside and head == "AnonHugePages:":
            return min(1.0, int(line.split()[1]) * 1024 / size)  # the advised range is a mapping of its own
    return 0.0


def _address(region: mmap.mmap) -> int:
    """The start address of a mapping (through the buffer protocol: ctypes' view of it)."""
    import ctypes

    view = (ctypes.c_char * 1).from_buffer(region)
    try:
        return ctypes.addressof(view)
    finally:
        del view  # a live export would keep the mapping from being resized or closed
