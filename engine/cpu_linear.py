"""The engine's CPU matrix multiply for decode-sized batches (1-32 rows), and how it is built.

A decode step multiplies every weight matrix by one row per running request. With 1-32 rows the
step is bound by reading the weights from memory, not by arithmetic, and a general GEMM pays
for more than that read: MKL's sgemm copies ("packs") the weight into its own layout on every
call. (Packing once ahead, through torch's private MKL ops, is as fast as this kernel, but a packed
copy serves only the exact batch size it was packed for: 32 copies of the weights for 1-32 rows.) ``engine/csrc/small_batch_linear.cpp`` reads each weight once, straight from a ``[K, N]``
layout, with register tiles of 6 rows x 64 columns (see the comment at its top). Measured on the
2-core Xeon this project is developed on, all 210 projections of SmolLM2-135M: 8 rows 44 -> 32 ms,
16 rows 58 -> 38 ms, 1 row 25 ms both (``python -m engine bench`` shows what it does to a whole
workload). Batches of more than 32 rows (the prefill of longer prompts) keep using torch's ``F.linear``.

The kernel is C++ compiled on first use with ``torch.utils.cpp_extension`` (a C++ compiler with
OpenMP, and ``ninja``), for this machine's CPU (``-march=native``), into
``<cache>/cpu_kernels/<fingerprint>/`` (see :func:`engine.model_loader.cache_dir`); later
processes load the built library in well under a second. Where it cannot be built, the engine
warns once and uses ``F.linear`` everywhere: slower, same results within float rounding.
"""

from __future__ import annotations

import hashlib
import logging
import platform
import sys
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

SOURCE = Path(__file__).parent / "csrc" / "small_batch_linear.cpp"
MAX_ROWS = 32  # up to this many rows (tokens) go through the kernel; more go to F.linear
TILE = 64  # the kernel's column tile: N must be a multiple of it
CFLAGS = ["-O3", "-march=native", "-fopenmp"]
STALE_LOCK_S = 600  # seconds; a build takes 10-60 s

_lock = threading.Lock()
_state: dict[str, object] = {}  # "ok": bool, "error": str, once load_kernel has run


def load_kernel(build_root: str | Path | None = None, progress: Callable[[str, float], None] | None = None) -> bool:
    """Build (first use on a machine, ~10-60 s) and load the kernel; True when it can be used.

    Runs once per process; later calls return the first answer. Never raises: a failed build
    (no compiler, no OpenMP, no ninja, a CPU the compiler cannot target) issues one
    ``RuntimeWarning`` ending with the compiler's last words, and :func:`kernel_error` keeps all of it.

    Args:
        build_root: where built libraries live; default ``<cache>/cpu_kernels``.
        progress: told ``(text, 0.0)`` when a build starts (the app's progress bar); None: the text
            goes to stderr. Nothing is said when the library is already built.
    """
    with _lock:
        if "ok" not in _state:
            try:
                _build_and_load(build_root, progress)
                _state["ok"] = True
            except Exception as error:  # noqa: BLE001 - any build failure means: fall back, loudly
                _state["ok"], _state["error"] = False, f"{type(error).__name__}: {error}".strip()
                error_text = str(_state["error"])
                reason = error_text if len(error_text) <= 600 else "..." + error_text[-600:]  # the cause is at the end
                warnings.warn(
                    "engine: the CPU small-batch matmul kernel could not be built, so decode steps use torch's "
                    f"F.linear (slower for 1-{MAX_ROWS} rows, same results within rounding). Reason: {reason}",
                    RuntimeWarning,
                    stacklevel=2,
                )
        return bool(_state["ok"])


def attempted() -> bool:
    """:func:`load_kernel` has already run in this process (so it returns at once)."""
    return "ok" in _state


def kernel_error() -> str | None:
    """Why the kernel could not be built (None: it was, or nobody asked yet)."""
    return _state.get("error")  # type: ignore[return-value]


def supports(weight_kn: torch.Tensor) -> bool:
    """The kernel can multiply by this ``[K, N]`` weight: float32 on CPU, contiguous, N a multiple of 64."""
    return (
        weight_kn.dim() == 2
        and weight_kn.dtype == torch.float32
        and weight_kn.device.type == "cpu"
        and weight_kn.is_contiguous()
        and weight_kn.shape[1] % TILE == 0
    )


def small_batch_linear(x: torch.Tensor, weight_kn: torch.Tensor) -> torch.Tensor:
    """``x @ weight_kn``: x ``[M, K]`` float32 (M rows, best 1-32), weight_kn ``[K, N]`` float32 -> ``[M, N]``.

    Raises:
        RuntimeError: the kernel is not loaded (call :func:`load_kernel` first), or the shapes, dtypes
            or device are not what it takes (the message says which).
    """
    if not _state.get("ok"):
        raise RuntimeError("the CPU small-batch kernel is not loaded: call engine.cpu_linear.load_kernel() first")
    return torch.ops.pagedattention_lab.small_batch_linear(x, weight_kn)


def _build_and_load(build_root: str | Path | None, progress: Callable[[str, float], None] | None) -> None:
    from torch.utils import cpp_extension  # imported here: it is slow to import and only needed once

    from engine.model_loader import cache_dir

    source = SOURCE.read_text()
    key = "\n".join([source, torch.__version__, " ".join(CFLAGS), platform.machine(), _cpu_flags()])
    fingerprint = hashlib.sha256(key.encode()).hexdigest()[:16]
    build_dir = (Path(build_root) if build_root else cache_dir() / "cpu_kernels") / fingerprint
    build_dir.mkdir(parents=True, exist_ok=True)
    # torch waits for the lock file of a build in progress; one left behind by a killed build would
    # make every later start wait forever, so a lock older than any real build is removed.
    lock = build_dir / "lock"
    if lock.exists() and time.time() - lock.stat().st_mtime > STALE_LOCK_S:
        lock.unlink(missing_ok=True)
    name = f"pagedattention_lab_cpu_{fingerprint}"
    if not (build_dir / f"{name}.so").exists():
        text = f"Building the engine's CPU matmul kernel for this machine (once, 10-60 s) in {build_dir}"
        if progress:
            progress(text, 0.0)
        else:
            print(text, file=sys.stderr, flush=True)
    # torch logs a long banner when the compiler is not the one it was built with; the warning above
    # (on failure) says what matters.
    cpp_logger = logging.getLogger(cpp_extension.__name__)
    level = cpp_logger.level
    cpp_logger.setLevel(logging.ERROR)
    try:
        _load(cpp_extension, name, build_dir)
    finally:
        cpp_logger.setLevel(level)


def _load(cpp_extension, name: str, build_dir: Path) -> None:
    cpp_extension.load(
        name=name,
        sources=[str(SOURCE)],
        extra_cflags=CFLAGS,
        extra_ldflags=["-fopenmp"],
        build_directory=str(build_dir),
        is_python_module=False,  # registers torch.ops.pagedattention_lab.*; needs no Python headers
        verbose=False,
    )


def _cpu_flags() -> str:
    """The CPU's model and feature flags (Linux), so that a library built with -march=native is rebuilt on another CPU."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor()
    wanted = [line for line in lines if line.startswith(("model name", "flags", "Features"))]
    return "\n".join(sorted(set(wanted)))
