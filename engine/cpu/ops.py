"""The engine's own CPU kernels (C++; fp32 and bf16), and how they are built.

Five operations of every decode step, written for what a decode step is on a CPU:

- :func:`small_batch_linear`, the matrix multiplies of a decode step (one row per running request). With a
  few rows the step is bound by reading the weights from memory, with 8-64 by arithmetic, and a
  general GEMM pays for more than either: MKL's sgemm copies ("packs") the weight into its own layout
  on every call. Here each weight is packed once, at load (:func:`pack_weights`), into panels of 16
  output columns, and ``csrc/small_batch_linear.cpp`` multiplies up to 16 rows at a time against each
  panel as it streams past: one vector load of weights feeds 16 fused multiply-adds, and no horizontal
  sums are needed (see the comment at its top). Prefills go through it too, at any number of rows
  (tokens): on an AMD Zen 5 (EPYC) it took 9.1 ms for a layer's four matmul shapes at
  596 rows against 14.2 ms for ``F.linear`` (MKL, which takes a slower path on AMD CPUs), and 26.8
  against 46.1 ms at 2,000 rows.
- :func:`add_rms_norm` (vLLM's ``fused_add_rms_norm``) and :func:`rotary_embedding` (vLLM's
  ``rotary_embedding``), in ``csrc/fused_ops.cpp``: the residual add with the RMSNorm after it, and
  RoPE on q and k, each one call instead of seven. In a decode step these work on a few rows, so
  their time is the cost of calling operators, not arithmetic. :func:`add_rms_norm_` is the same
  written over its inputs, as vLLM's is: what a prefill's layers call, whose hidden states are megabytes.
- :func:`silu_and_mul` (vLLM's ``silu_and_mul``), in ``csrc/activation.cpp``: SwiGLU's
  ``silu(gate) * up`` in one pass and one call instead of two, with an exp computed 16 values at a time;
  :func:`silu_and_mul_` writes it over the gate projection (a prefill's MLP).
- :func:`paged_attention_decode`, decode attention reading K and V in place through the block table
  (``csrc/paged_attention.cpp``): one task per (sequence, KV head), online softmax in fp32, the query
  heads of a GQA group together. The torch reference in engine/model_executor/attention.py gathers each context into
  a padded copy first; it stays the oracle and the fallback.

In a step of decode tokens only, :func:`decode_layer` (``csrc/decode_layer.cpp``) runs a whole decoder
layer as one call of these five, in the order engine/model_executor/model.py calls them (the same results, bit for
bit), so that Python and torch's dispatcher are crossed once per layer instead of ~15 times; and
:func:`decode_layers` runs all the layers and the final norm as one call.

A prefill runs :func:`prefill_attention`: causal attention of prompts over their own K and V, packed
without padding (``csrc/prefill_attention.cpp``; FlashAttention's loop, the query heads of a GQA group
sharing each key and value read), in every layer of a step whose prompts have nothing cached before them.

Figures (2-core Xeon, SmolLM2-135M; ``python -m engine bench-cpu`` measures them on any machine): see
the README. ``python -m engine bench`` shows what they do to a whole workload.

The kernels are compiled on first use with ``torch.utils.cpp_extension`` (a C++ compiler with
OpenMP, and ``ninja``) for one instruction set, the best this CPU runs (:func:`build_isa`): ``avx512``
(x86-64-v4, with AVX512-BF16 where the CPU has it), ``avx2`` (x86-64-v3: AVX2 and FMA, most laptops) or
``generic`` (x86-64's SSE2, or the compiler's default target elsewhere: correct, slow). One source serves
every width (the kernels are written against a vector of 16, 8 or 4 floats, see
``csrc/small_batch_linear.cpp``), as ATen's own kernels are compiled per ISA from one source.
``$PAGEDATTENTION_LAB_CPU_ISA`` picks another one this CPU can run (e.g. ``avx2`` on an AVX-512
machine, to measure a laptop's code path there). Each ISA is built into its own
``<cache>/cpu_kernels/<fingerprint>/`` (the fingerprint covers the ISA and its flags, see
:func:`engine.user_cache.cache_dir`), and only the one this CPU needs is built; later processes load it in
well under a second, and a cache copied from another machine (``python -m engine prepare-room``) is used
only where it was built for an ISA this CPU runs: an AVX-512 build never runs on an AVX2 laptop. Where they cannot be built, the engine
warns once and uses torch everywhere (``F.linear``, ``F.rms_norm``, the rotary in engine/model_executor/model.py):
slower, the same results within float rounding.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import hashlib
import json
import logging
import os
import platform
import shutil
import signal
import subprocess
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Callable
from pathlib import Path

import torch

from engine.cpu import huge_pages
from engine.cpu.isa import ISA_ENV_VAR

try:
    import fcntl  # POSIX: a lock that the OS releases when its process dies, however it dies
except ImportError:  # Windows: no build lock of our own (torch's lock file only)
    fcntl = None

# What the compiler is given: two translation units (a "unity build"), each including some of the kernels' files, so
# that the torch headers (~8 s of parsing each time, most of a build) are parsed twice, not once per file, and the
# two compile at once on two cores; see csrc/unity_kernels.cpp.
SOURCES = [Path(__file__).parent / "csrc" / name for name in ("unity_kernels.cpp", "unity_layers.cpp")]
# Included by the sources: part of the fingerprint, not compiled alone.
HEADERS = [Path(__file__).parent / "csrc" / name
           for name in ("small_batch_linear.cpp", "fused_ops.cpp", "paged_attention.cpp", "activation.cpp", "decode_layer.cpp",
                        "sampling.cpp", "prefill_attention.cpp", "vec_exp.h", "simd.h", "ops.h")]
CFLAGS = ["-O3", "-fopenmp"]  # and the ISA's own, :func:`build_flags`
ISAS = ("avx512", "avx2", "generic")  # best first
# What each ISA asks of the CPU (/proc/cpuinfo's flag names): x86-64-v4's and x86-64-v3's levels.
ISA_CPU_FLAGS = {
    "avx512": {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl", "avx2", "fma", "bmi2", "f16c", "movbe"},
    "avx2": {"avx2", "fma", "bmi1", "bmi2", "f16c", "movbe"},
    "generic": set(),
}
BUILD_TIME = "15-30 s on a 2-core laptop"  # the first build, measured: docs/performance.md, "The first start"
LOCK_TIMEOUT_S = 600  # seconds a start waits for another live process's build (a build takes 15-30 s on a 2-core laptop, several minutes on a busy one)

_lock = threading.Lock()
_state: dict[str, object] = {}  # "ok": bool, "error": str, once load_kernel has run
_building = threading.Event()  # set while this process compiles (see _exit_quietly_if_building)
INTERRUPTED = "interrupted during the build of the engine's CPU kernels; it starts again at the next run"


def load_kernel(build_root: str | Path | None = None, progress: Callable[[str, float], None] | None = None) -> bool:
    """Build (first use on a machine: 15-30 s on 2 cores) and load the kernels; True when they can be used.

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
                if "interrupted by user" in str(error):  # Ctrl-C reached ninja too: not a failed build
                    if threading.current_thread() is threading.main_thread():
                        raise KeyboardInterrupt(INTERRUPTED) from error  # the CLI says "interrupted"
                    _exit_quietly()  # the app's script thread, while its server's main thread stops
                _state["ok"], _state["error"] = False, f"{type(error).__name__}: {error}".strip()
                reason = _tail(str(_state["error"]), 600)  # the cause is at the end
                warnings.warn(
                    "engine: the engine's CPU kernels could not be built, so it uses torch's F.linear, F.rms_norm "
                    f"and rotary instead (slower decode steps, same results within rounding). Reason: {reason}",
                    RuntimeWarning,
                    stacklevel=2,
                )
        return bool(_state["ok"])


def load_kernel_in_background(progress: Callable[[str, float], None] | None = None) -> threading.Thread | None:
    """Start :func:`load_kernel` in a thread of its own, so that a first start builds the kernels while the model is
    fetched and converted; a later :func:`load_kernel` waits for it and returns its answer. None when it has
    already run in this process (nothing to wait for)."""
    if attempted():
        return None
    thread = threading.Thread(target=load_kernel, kwargs={"progress": progress}, name="cpu-kernel-build", daemon=True)
    thread.start()
    return thread


def attempted() -> bool:
    """:func:`load_kernel` has already run in this process (so it returns at once)."""
    return "ok" in _state


def kernel_error() -> str | None:
    """Why the kernels could not be built (None: they were, or nobody asked yet)."""
    return _state.get("error")  # type: ignore[return-value]


def matmul_simd() -> str | None:
    """The ISA the loaded kernels were compiled for: "avx512", "avx2" (the register tile at the memory limit
    on laptops without AVX-512), "generic" (SSE2 or NEON: correct, but slower than MKL, so the engine
    multiplies with ``F.linear`` there), or None when the kernels are not loaded."""
    if not _state.get("ok"):
        return None
    return torch.ops.pagedattention_lab.small_batch_linear_simd()


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The CPU's feature flags (the ``flags`` line of /proc/cpuinfo, Linux x86); empty where not known."""
    for line in (_cpuinfo() if cpuinfo is None else cpuinfo).splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def cpu_isa(flags: set[str] | None = None, machine: str | None = None) -> str:
    """The best of :data:`ISAS` that a CPU with these feature flags runs (default: this CPU's)."""
    machine = (machine or platform.machine()).lower()
    if machine not in ("x86_64", "amd64"):
        return "generic"
    if flags is None:
        flags = cpu_flags()
        if not flags:  # no /proc/cpuinfo (macOS, Windows): ATen's own detection
            capability = torch.backends.cpu.get_cpu_capability()
            return {"AVX512": "avx512", "AVX2": "avx2"}.get(capability, "generic")
    return next(isa for isa in ISAS if ISA_CPU_FLAGS[isa] <= flags)


def build_isa(flags: set[str] | None = None, machine: str | None = None) -> str:
    """The ISA the kernels are built for here: ``$PAGEDATTENTION_LAB_CPU_ISA`` when set, else :func:`cpu_isa`.

    Raises:
        ValueError: the variable names no ISA, or one this CPU cannot run (avx512 on an AVX2 laptop
            would stop the process with SIGILL at the first AVX-512 instruction).
    """
    best = cpu_isa(flags, machine)
    wanted = os.environ.get(ISA_ENV_VAR, "").strip().lower()
    if not wanted:
        return best
    if wanted not in ISAS:
        raise ValueError(f"{ISA_ENV_VAR}={wanted!r} is not one of {', '.join(ISAS)}")
    if ISAS.index(wanted) < ISAS.index(best):
        raise ValueError(f"{ISA_ENV_VAR}={wanted} but this CPU runs {best} at most")
    return wanted


def isa_report() -> dict:
    """Which instruction set this process's CPU kernels run on, for the benches' reports: ``isa`` (the loaded
    build's, :func:`matmul_simd`; before a load, the one :func:`build_isa` would build), ``cpu_isa`` (the best
    this CPU runs, :func:`cpu_isa`), ``forced`` (``$PAGEDATTENTION_LAB_CPU_ISA`` chose ``isa``), ``cpu`` (the
    CPU's model name, "" where not known), ``torch`` (ATen's vectorized code path, ``torch.backends.cpu.
    get_cpu_capability()``: ``AVX2`` when a forced ISA capped it, :mod:`engine.cpu.isa`)."""
    try:
        isa = matmul_simd() or build_isa()
    except ValueError:  # a forced ISA this CPU cannot run: the build fails and says why; report the CPU's
        isa = cpu_isa()
    model = next((line.split(":", 1)[1].strip() for line in _cpuinfo().splitlines() if line.startswith("model name")), "")
    return {"isa": isa, "cpu_isa": cpu_isa(), "forced": bool(os.environ.get(ISA_ENV_VAR, "").strip()), "cpu": model or platform.processor(),
            "torch": torch.backends.cpu.get_cpu_capability()}


def describe_isa(report: dict) -> str:
    """One line for a bench: ``"ISA avx2 (AVX2 build on an AVX-512 CPU, forced with PAGEDATTENTION_LAB_CPU_ISA: Intel(R) Xeon(R) ...)"``."""
    where = f": {report['cpu']}" if report["cpu"] else ""
    if report["isa"] == report["cpu_isa"]:
        return f"ISA {report['isa']} ({report['isa']} CPU{where})"
    names = {"avx512": "an AVX-512", "avx2": "an AVX2", "generic": "a generic"}
    forced = f", forced with {ISA_ENV_VAR}" if report["forced"] else ""
    torch_isa = report.get("torch")
    if torch_isa:  # were ATen, MKL and oneDNN capped too (engine.cpu.isa), or do they still run the CPU's best?
        forced += f"; torch {torch_isa}"
    return f"ISA {report['isa']} ({report['isa']} build on {names[report['cpu_isa']]} CPU{forced}{where})"


def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def build_flags(isa: str, flags: set[str] | None = None, machine: str | None = None) -> list[str]:
    """The compiler's flags for one ISA: :data:`CFLAGS` and a fixed target (never ``-march=native``, so a
    build runs on every CPU of its ISA, and the cache key says which)."""
    x86 = (machine or platform.machine()).lower() in ("x86_64", "amd64")
    if isa == "avx512":
        bf16 = "avx512_bf16" in (cpu_flags() if flags is None else flags)
        return [*CFLAGS, "-march=x86-64-v4", *(["-mavx512bf16"] if bf16 else [])]
    if isa == "avx2":
        return [*CFLAGS, "-march=x86-64-v3"]
    return [*CFLAGS, "-march=x86-64"] if x86 else list(CFLAGS)


def matmul_bf16() -> bool:
    """The matmul kernel takes bfloat16 (built for a CPU with AVX512-BF16: ``_mm512_dpbf16_ps``)."""
    return bool(_state.get("ok")) and torch.ops.pagedattention_lab.small_batch_linear_bf16()


def supports(weight: torch.Tensor) -> bool:
    """The engine should multiply by this ``[N, K]`` weight (``nn.Linear``'s layout) with the kernel: float32
    (or bfloat16 where :func:`matmul_bf16`) on CPU, 2-D, contiguous, and the kernel built for AVX-512 or AVX2
    (:data:`MATMUL_ISAS`; the generic build is slower than ``F.linear``)."""
    dtype_ok = weight.dtype == torch.float32 or (weight.dtype == torch.bfloat16 and matmul_bf16())
    return weight.dim() == 2 and dtype_ok and weight.device.type == "cpu" and weight.is_contiguous() and matmul_simd() in MATMUL_ISAS


MATMUL_ISAS = ("avx512", "avx2")  # the builds whose matmul kernel the engine uses (a register tile that fits the ISA's registers)


MKL_MIN_ROWS = 65  # from this many rows of x, float32 on an Intel CPU, F.linear (MKL's sgemm) beats the kernel


def kernel_max_rows(weight: torch.Tensor) -> int | None:
    """The most rows of x that should go through :func:`small_batch_linear` for this weight; more go
    through ``F.linear``. None: every row count (the kernel is never slower here).

    Which is faster depends on the CPU's vendor, not on the model. On Intel CPUs MKL's sgemm takes its
    fast path: with prefill-sized inputs it ran 1.2-1.35x faster than the kernel from 80 rows up and
    tied it at 48-64 rows, on SmolLM2's four projection shapes (576 x 576, 192 x 576, 1536 x 576,
    576 x 1536, one 2-core Xeon), while the kernel won below 48 rows (up to 1.56x at 32 rows). On AMD
    CPUs MKL takes a slower path and the kernel was 1.5-1.7x faster at 128-2,000 rows (Zen 5), so there
    it takes every row count. Only float32: bfloat16 goes through the kernel (torch's bf16 GEMM on CPU
    was not measured against it).
    """
    if weight.dtype != torch.float32 or not torch.backends.mkl.is_available() or _cpu_vendor() != "GenuineIntel":
        return None
    return MKL_MIN_ROWS - 1


@functools.cache
def _cpu_vendor() -> str:
    """``vendor_id`` from /proc/cpuinfo ("GenuineIntel", "AuthenticAMD"), or "" where it is not known."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("vendor_id"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def packed_shape(weight: torch.Tensor) -> tuple[int, int, int]:
    """The shape :func:`pack_weight` gives an ``[N, K]`` weight: ``[ceil(N / 16), K, 16]`` in float32,
    ``[ceil(N / 16), ceil(K / 2), 32]`` in bfloat16 (panels of 16 output columns; see csrc/small_batch_linear.cpp)."""
    n, k = weight.shape
    panels = -(-n // 16)
    return (panels, -(-k // 2), 32) if weight.dtype == torch.bfloat16 else (panels, k, 16)


def pack_weight(weight: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``weight`` ``[N, K]`` (float32, or bfloat16 where :func:`matmul_bf16`) re-laid out for
    :func:`small_batch_linear`: panels of 16 output columns, each one contiguous stretch of K x 16 values
    (``packed[p, k, j] = weight[16 p + j, k]``; bf16 keeps pairs of k together), the last panel padded with
    zeros. Done once per weight, at load: the same idea as a GEMM's packing (BLIS, MKL), which a general
    GEMM repeats on every call.

    Args:
        out: where to write it (contiguous, :func:`packed_shape`, the weight's dtype); None: a new tensor.

    Raises:
        RuntimeError: not loaded, or a weight or ``out`` the kernel cannot take (the message says which).
    """
    _check_inputs()  # a weight that requires grad is fine: it is read, not differentiated
    if out is None:
        out = torch.empty(packed_shape(weight), dtype=weight.dtype)
    with torch.no_grad():
        torch.ops.pagedattention_lab.pack_weight_(weight.detach(), out)
    return out


_packed: dict[tuple, tuple[torch.Tensor, weakref.ref]] = {}  # _pack_key(weight) -> (weight, ref to its packed copy)


def pack_weights(weights: list[torch.Tensor]) -> list[torch.Tensor]:
    """:func:`pack_weight` for each weight, the new ones together in one 2 MiB-page arena
    (:func:`engine.cpu.huge_pages.arena`), and each weight packed once per process: engines built on the same
    loaded weights (the app's, a lesson's) share the packed copies, as they share the weights. The packed
    copy costs as much memory again as the weight (538 MB for SmolLM2-135M in fp32); it is freed with the
    last model that uses it. Weights must not be changed in place afterwards (the engine never does).

    Raises:
        RuntimeError: as :func:`pack_weight`.
        MemoryError: the arena cannot be mapped.
    """
    packed: list[torch.Tensor | None] = []
    for w in weights:
        hit = _packed.get(_pack_key(w))
        packed.append(hit[1]() if hit else None)
    missing = [i for i, p in enumerate(packed) if p is None]
    fresh = huge_pages.arena([(packed_shape(weights[i]), weights[i].dtype) for i in missing]) if missing else []
    for i, out in zip(missing, fresh):
        w, key = weights[i], _pack_key(weights[i])
        packed[i] = pack_weight(w, out=out)

        def forget(ref: weakref.ref, key: tuple = key) -> None:
            if key in _packed and _packed[key][1] is ref:
                del _packed[key]

        _packed[key] = (w.detach(), weakref.ref(packed[i], forget))  # the weight kept: its address cannot be reused
    return packed  # type: ignore[return-value]


def _pack_key(weight: torch.Tensor) -> tuple:
    return (weight.data_ptr(), tuple(weight.shape), tuple(weight.stride()), weight.dtype)


def small_batch_linear(x: torch.Tensor, weight: torch.Tensor, packed: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight.T`` (``F.linear`` without bias): x ``[M, K]`` (M rows, any number), weight ``[N, K]`` -> ``[M, N]``,
    all float32, or all bfloat16 where :func:`matmul_bf16` (products summed in fp32, the result rounded to bf16).

    Args:
        packed: ``pack_weight(weight)``, made once (the engine's layers keep theirs); None: packed now,
            which costs a copy of the whole weight on every call (for tests and one-off use).

    Raises:
        RuntimeError: the kernel is not loaded (call :func:`load_kernel` first), the shapes, dtypes,
            device or layout are not what it takes (the message says which), or an input needs
            gradients (the kernels are for inference only).
    """
    _check_inputs(x, weight)
    if x.dim() != 2 or weight.dim() != 2:
        raise RuntimeError("small_batch_linear: x [M, K] and weight [N, K] must be 2-D")
    if x.dtype != weight.dtype or x.dtype not in (torch.float32, torch.bfloat16):
        raise RuntimeError("small_batch_linear: float32 or bfloat16 only (x and weight alike)")
    if x.shape[1] != weight.shape[1]:
        raise RuntimeError(f"small_batch_linear: x is [M, {x.shape[1]}] but weight is [N, {weight.shape[1]}]")
    if not weight.is_contiguous():
        raise RuntimeError("small_batch_linear: weight must be contiguous")
    if packed is None:
        packed = pack_weight(weight)
    return torch.ops.pagedattention_lab.small_batch_linear(x, packed, weight.shape[0])


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual connection and the RMSNorm after it, in one pass (vLLM's ``fused_add_rms_norm``).

    Args:
        x: ``[num_tokens, hidden]`` float32 or bfloat16, a sub-layer's output.
        residual: ``[num_tokens, hidden]``, the residual stream before it (x's dtype, as below).
        weight: ``[hidden]``, the norm's learned scale.
        eps: added to the mean of squares.

    Returns:
        (``weight * rms_normalize(x + residual)``, ``x + residual``), both new ``[num_tokens, hidden]``
        tensors. The sum is exactly torch's; the norm within float rounding of ``F.rms_norm``'s. In
        bfloat16 the mean of squares is taken in fp32 and each result rounded where engine/model_executor/model.py's
        torch code rounds it.

    Raises:
        RuntimeError: not loaded, shapes/dtypes/device not as above (the message says which), or an
            input needs gradients (inference only).
    """
    _check_inputs(x, residual, weight)
    return torch.ops.pagedattention_lab.add_rms_norm(x, residual, weight, eps)


def add_rms_norm_(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`add_rms_norm` in place, as vLLM's ``fused_add_rms_norm`` is: ``residual`` becomes
    ``x + residual`` and ``x`` becomes ``weight * rms_normalize(x + residual)``, the same values
    :func:`add_rms_norm` returns, bit for bit.

    A prefill's hidden states are megabytes (2,048 tokens x 576 floats: 4.7 MB) that have left the
    caches by the time the norm runs; written into the two tensors it has just read, the results cost
    no fresh memory to be fetched and written back.

    Args:
        x, residual: as for :func:`add_rms_norm`, contiguous, two distinct tensors; both are overwritten.
        weight, eps: as for :func:`add_rms_norm`.

    Returns:
        ``(x, residual)``, the same tensor objects: (normed, new residual).

    Raises:
        RuntimeError: as :func:`add_rms_norm`; also when x or residual is not contiguous, or they are
            one tensor.
    """
    _check_inputs(x, residual, weight)
    torch.ops.pagedattention_lab.add_rms_norm_(x, residual, weight, eps)
    return x, residual


def rotary_embedding(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE on q and k in one call (vLLM's ``rotary_embedding``, GPT-NeoX layout: element i pairs with i + head_dim/2).

    Args:
        q: ``[num_tokens, num_heads, head_dim]``; k: ``[num_tokens, num_kv_heads, head_dim]``; float32 or
            bfloat16, all four alike.
        cos, sin: ``[num_tokens, head_dim]`` or ``[num_tokens, 1, head_dim]`` (as
            :class:`engine.model_executor.model.RotaryEmbedding` gives them).

    Returns:
        (q, k) rotated, new tensors, exactly equal to :func:`engine.model_executor.model.apply_rotary` on each (in
        bfloat16 too: each product and sum rounded as torch's bf16 operators round them).

    Raises:
        RuntimeError: not loaded, shapes/dtypes/device not as above (the message says which), or an
            input needs gradients (inference only).
    """
    _check_inputs(q, k, cos, sin)
    return torch.ops.pagedattention_lab.rotary_embedding(q, k, cos, sin)


def silu_and_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``F.silu(gate) * up`` in one pass (vLLM's ``silu_and_mul``; SwiGLU's activation in the MLP).

    Args:
        gate, up: ``[num_tokens, intermediate_size]`` (any shape, the same for both), float32 or
            bfloat16 alike, on CPU: the gate and up projections' outputs.

    Returns:
        A new tensor of that shape and dtype; computed in fp32, within 1e-6 (relative) of torch's
        float32 result (its exp is a polynomial, see ``csrc/activation.cpp``).

    Raises:
        RuntimeError: not loaded, shapes or dtypes that differ, another dtype or device (the message
            says which), or an input needs gradients (inference only).
    """
    _check_inputs(gate, up)
    return torch.ops.pagedattention_lab.silu_and_mul(gate, up)


def silu_and_mul_(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """:func:`silu_and_mul` written over ``gate`` (the same values, bit for bit): for a prefill's MLP,
    whose gate projection is megabytes not read again, so that the result costs no fresh memory.

    Args:
        gate: as for :func:`silu_and_mul`, contiguous; overwritten with ``silu(gate) * up``.
        up: as for :func:`silu_and_mul`, another tensor.

    Returns:
        ``gate`` itself.

    Raises:
        RuntimeError: as :func:`silu_and_mul`; also when gate is not contiguous or is up itself.
    """
    _check_inputs(gate, up)
    return torch.ops.pagedattention_lab.silu_and_mul_(gate, up)


def prefill_attention_runs(query: torch.Tensor, key: torch.Tensor, sliding_window: int | None = None) -> bool:
    """Whether :func:`prefill_attention` takes these operands: the kernels loaded, float32 on CPU, a head_dim
    that is a multiple of 16 (a whole number of vectors on every ISA), num_heads a multiple of num_kv_heads,
    no sliding window, no gradient recorded. Anything else goes through the torch reference."""
    return (bool(_state.get("ok")) and not sliding_window and not torch.is_grad_enabled() and query.dim() == 3 and key.dim() == 3
            and query.dtype == torch.float32 and key.dtype == torch.float32 and query.device.type == "cpu"
            and query.shape[2] % 16 == 0 and key.shape[1] > 0 and query.shape[1] % key.shape[1] == 0)


def prefill_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, query_start_loc: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal attention of prompts over their own K and V, packed without padding (``csrc/prefill_attention.cpp``;
    FlashAttention's loop, as ``flash_attn_varlen_func`` takes its operands): what
    :func:`engine.model_executor.attention.prefill_varlen_reference` computes, without padding the prompts to
    the longest and with the query heads of a GQA group sharing each key and value read.

    Args:
        query: ``[num_tokens, num_heads, head_dim]`` float32, the prompts one after another.
        key, value: ``[num_tokens, num_kv_heads, head_dim]`` float32, the same tokens' K and V.
        query_start_loc: ``[num_seqs + 1]`` int32 or int64, cumulative prompt lengths (vLLM's name).
        scale: the softmax scale, > 0.

    Returns:
        ``[num_tokens, num_heads, head_dim]`` float32; token t of a prompt attends to its prompt's tokens up to
        t. Within float32 rounding of the reference (the same sums in another order).

    Raises:
        RuntimeError: not loaded, another dtype or device, a head_dim that is not a multiple of the vector
            width, num_heads not a multiple of num_kv_heads, a query_start_loc that does not run from 0 to
            num_tokens, or an input needing gradients (the message says which).
    """
    _check_inputs(query, key, value)
    if not scale > 0:
        raise RuntimeError(f"prefill_attention: scale must be > 0, got {scale}")
    return torch.ops.pagedattention_lab.prefill_attention(query, key, value, query_start_loc, float(scale))


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """Each row's argmax in one call (greedy sampling; ``csrc/sampling.cpp``): ``logits``
    ``[num_seqs, vocab_size]`` float32 on CPU (rows may be strided) -> ``[num_seqs]`` int64, the first
    index of each row's maximum, NaN counting as the largest: ``torch.argmax``'s answer, and
    :func:`engine.model_executor.sampler.greedy_tokens`'s (six torch operators, each slow with the cold caches a decode
    step leaves: 0.34-0.49 ms a step at 1-16 rows here).

    Raises:
        RuntimeError: not loaded, not 2-D, an empty row, or not float32 on CPU (the message says which).
    """
    _check_inputs(logits)
    return torch.ops.pagedattention_lab.greedy_tokens(logits)


def paged_attention_decode(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    plan: object | None = None,
    sliding_window: int | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:
    """Decode attention through the block tables, in place (the same contract as
    :func:`engine.model_executor.attention.paged_attention_reference`, within float rounding).

    Args:
        query: ``[num_seqs, num_heads, head_dim]`` float32 or bfloat16 (may be a strided view).
        key_cache, value_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``, query's dtype or fp8
            (``torch.float8_e4m3fn``, ``torch.float8_e5m2``: widened to fp32 in registers), head_dim contiguous.
        block_tables: ``[num_seqs, max_blocks]`` int32 (may be a view); only the entries a context
            covers are read.
        context_lens: ``[num_seqs]`` int32, tokens; 0 gives a row of zeros.
        scale: softmax scale.
        plan: ignored (the engine's backends all take it; this kernel needs nothing precomputed).
        sliding_window: None or 0 for full attention; W: the query sees its last W positions only, and
            the table entries of blocks wholly before them are not read.
        k_scale, v_scale: fp8 caches only: K and V read as ``fp8 * k_scale``, ``fp8 * v_scale`` (> 0).

    Returns:
        ``[num_seqs, num_heads, head_dim]`` in query's dtype; softmax and sums in fp32.

    Raises:
        RuntimeError: not loaded, shapes/dtypes/device not as above, a context longer than its
            table, a table entry outside the pool (the message says which), or an input that needs
            gradients (inference only).

    Source: PagedAttention paper §4.1; vLLM's ``paged_attention_v1``; online softmax as in FlashAttention.
    """
    _check_inputs(query, key_cache, value_cache)
    return torch.ops.pagedattention_lab.paged_attention_decode(
        query, key_cache, value_cache, block_tables.to(torch.int32), context_lens.to(torch.int32), float(scale), int(sliding_window or 0), float(k_scale), float(v_scale)
    )


def decode_layer(
    hidden: torch.Tensor,
    residual: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    weights: list[torch.Tensor],
    biases: list[torch.Tensor | None],
    sizes: list[int],
    scale: float,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One decoder layer of a decode step as one C++ call (``csrc/decode_layer.cpp``): exactly what
    :class:`engine.model_executor.model.DecoderLayer` does when every token is a decode token, with the kernels above in
    the same order (the same bits), minus ~15 operator calls from Python per layer. The CPU counterpart
    of the CUDA graphs vLLM replays for decode steps on a GPU: the same kernels, launched at once.

    Args:
        hidden: ``[num_tokens, hidden_size]`` float32 or bfloat16, one token per decoding request.
        residual: the residual stream, hidden's shape and dtype; None in the first layer (it starts as ``hidden``).
        cos, sin: ``[num_tokens, 1, head_dim]`` (:class:`engine.model_executor.model.RotaryEmbedding`).
        key_cache, value_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``, contiguous, hidden's
            dtype; this step's K and V are written into them at ``slot_mapping``.
        slot_mapping: ``[num_tokens]`` int64 (-1: not written).
        block_tables: ``[num_tokens, max_blocks]`` int32; context_lens: ``[num_tokens]`` int32, tokens
            after this step's write.
        weights: input_layernorm, q/k/v/o_proj, post_attention_layernorm, gate/up/down_proj (the
            projections packed, :func:`pack_weight`), then q_norm and k_norm for Qwen3 (9 or 11).
        biases: the 7 projections' biases in that order (None: none).
        sizes: ``[num_heads, num_kv_heads, head_dim, intermediate_size]``.
        scale, eps: attention's softmax scale; the RMSNorms' epsilon.

    Returns:
        (the layer's output ``[num_tokens, hidden_size]``, the residual stream after it), as
        ``DecoderLayer.forward`` returns them.

    Raises:
        RuntimeError: not loaded, or inputs the kernels refuse (each kernel's message, as above).
    """
    return torch.ops.pagedattention_lab.decode_layer(
        hidden, residual, cos, sin, key_cache, value_cache, slot_mapping, block_tables, context_lens, weights, biases, sizes, scale, eps
    )


def decode_layers(
    hidden: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
    slot_mapping: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    weights: list[torch.Tensor],
    biases: list[torch.Tensor | None],
    sizes: list[int],
    scale: float,
    eps: float,
    norm_weight: torch.Tensor,
    norm_eps: float,
) -> torch.Tensor:
    """Every decoder layer of a decode step, then the final RMSNorm, as one C++ call: :func:`decode_layer`
    for layer 0, 1, ... (the same kernels, so the same bits), with no Python between the layers. A step
    streams each layer's weights (14 MB for SmolLM2-135M) through the caches, and Python that runs
    between two layers finds its own data evicted (the first small operator after streaming took ~90 µs
    here, against ~5 µs warm).

    Args:
        hidden: the embeddings ``[num_tokens, hidden_size]``, one token per decoding request.
        kv_caches: each layer's (key_cache, value_cache), as :func:`decode_layer` takes them, all alike.
        weights, biases: each layer's :func:`decode_layer` lists, one layer after another (9 or 11
            weights and 7 biases per layer).
        sizes, scale, eps: as :func:`decode_layer`, the same for every layer.
        norm_weight, norm_eps: the final RMSNorm's.
        The rest: as :func:`decode_layer`.

    Returns:
        the final hidden states ``[num_tokens, hidden_size]``, as :meth:`engine.model_executor.model.CausalLM.forward` returns them.

    Raises:
        RuntimeError: not loaded, lists of the wrong lengths, layers whose pools differ from the first's
            (all checked before anything is written), or what :func:`decode_layer` refuses.
    """
    return torch.ops.pagedattention_lab.decode_layers(
        hidden, cos, sin, [k for k, _ in kv_caches], [v for _, v in kv_caches], slot_mapping, block_tables, context_lens,
        weights, biases, sizes, scale, eps, norm_weight, norm_eps,
    )


def _check_inputs(*tensors: torch.Tensor) -> None:
    if not _state.get("ok"):
        why = f" (they could not be built: {_tail(str(_state['error']), 300)})" if _state.get("error") else ""
        raise RuntimeError(f"the engine's CPU kernels are not loaded: call engine.cpu.ops.load_kernel() first{why}")
    if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors):
        raise RuntimeError(
            "the engine's CPU kernels are for inference only (no gradients): call them under torch.inference_mode() "
            "or torch.no_grad(), or on tensors that do not require grad"
        )


def _tail(text: str, limit: int) -> str:
    """The last ``limit`` characters of ``text``, starting at a word, marked with "..." when cut."""
    if len(text) <= limit:
        return text
    words = text[-limit:].split(maxsplit=1)  # the first one is probably cut
    return "..." + words[-1]


def _build_and_load(build_root: str | Path | None, progress: Callable[[str, float], None] | None) -> None:
    """Load a finished build at once; otherwise build it (or wait for the process that does) under the lock.

    A finished build (its library and ``loaded-ok``, written only after a process loaded it) is never
    changed again, so it is loaded without the lock: from a read-only cache (a shared lab image), or
    while another process holds the lock."""
    isa = build_isa()
    flags = build_flags(isa)
    build_dir = build_directory(build_root, flags)
    library = build_dir / f"pagedattention_lab_cpu_{build_dir.name}.so"
    if library.exists() and _finished_for(build_dir, isa):
        _load_library(library, isa)
        return
    build_dir.mkdir(parents=True, exist_ok=True)
    with build_lock(build_dir, progress):
        _build_locked(build_dir.name, build_dir, progress, isa, flags)


def _finished_for(build_dir: Path, isa: str) -> bool:
    """A process has loaded this build (``loaded-ok``, written after the load) and it was built for ``isa``
    (the file holds the ISA): a directory copied or renamed from another ISA's build is built again, never loaded."""
    try:
        return (build_dir / "loaded-ok").read_text().strip() == isa
    except OSError:
        return False


def _load_library(library: Path, isa: str) -> None:
    torch.ops.load_library(str(library))
    _check_built_for(isa, library)


def _check_built_for(isa: str, library: Path) -> None:
    built = torch.ops.pagedattention_lab.small_batch_linear_simd()
    if built != isa:  # the compiler ignored the target: say so, never run it as another ISA's
        raise RuntimeError(f"the kernels in {library} were compiled for {built}, not {isa}")


def build_directory(build_root: str | Path | None = None, flags: list[str] | None = None) -> Path:
    """Where the build of the kernels for this CPU's ISA lives: ``<build_root>/<fingerprint>`` (default root:
    ``<cache>/cpu_kernels``); the fingerprint covers the sources, torch's version, the machine and the
    compiler's flags (default: :func:`build_flags` of :func:`build_isa`), which name the ISA.

    Raises:
        ValueError: as :func:`build_isa`.
    """
    from engine.user_cache import cache_dir

    sources = [path.read_text() for path in SOURCES + HEADERS]
    # Not the sources' directory: a library once built and loaded is loaded directly (no ninja, which would
    # compare the sources' paths and times), so another checkout, or a lab cache copied from a teacher's
    # machine (python -m engine prepare-room), finds it: on a CPU of the same ISA only, since the flags differ.
    flags = build_flags(build_isa()) if flags is None else flags
    key = "\n".join([*sources, torch.__version__, " ".join(flags), platform.machine()])
    fingerprint = hashlib.sha256(key.encode()).hexdigest()[:16]
    return (Path(build_root) if build_root else cache_dir() / "cpu_kernels") / fingerprint


def _build_locked(fingerprint: str, build_dir: Path, progress, isa: str, flags: list[str]) -> None:
    """Build (if needed) and load, while this process holds the build directory's lock."""
    name = f"pagedattention_lab_cpu_{fingerprint}"
    library, loaded_once = build_dir / f"{name}.so", build_dir / "loaded-ok"
    if library.exists() and _finished_for(build_dir, isa):  # finished by the process this one waited for
        _load_library(library, isa)
        return
    # Imported here: it is slow to import and only needed to build. Where a CUDA toolkit is installed but
    # torch is a CPU build (or no GPU is there), its import warns "No CUDA runtime is found, using
    # CUDA_HOME=...": nothing to do with these CPU kernels, so not shown.
    with _cpp_extension_quiet():
        from torch.utils import cpp_extension

    # torch's own lock file (a "baton" it waits on while it exists) can only be left by a build that
    # died, since no live process of ours builds while we hold the lock: remove it, or we would wait.
    baton = build_dir / "lock"
    if fcntl is not None or (baton.exists() and time.time() - baton.stat().st_mtime > LOCK_TIMEOUT_S):
        baton.unlink(missing_ok=True)  # without an OS lock (Windows): only once older than any build
    # A library that no process has loaded yet may be the half-written output of a killed build (or of
    # a full disk); loading it can kill the process (SIGBUS), so it is built again from scratch. So is
    # one built for another ISA (a copied directory): its first AVX-512 instruction would be a SIGILL.
    if library.exists() and not _finished_for(build_dir, isa):
        for path in build_dir.iterdir():
            if path.name != "build.lock":
                shutil.rmtree(path) if path.is_dir() else path.unlink()
    building = not library.exists()
    said = f"Building the engine's CPU kernels for this machine ({isa}; {BUILD_TIME}, once; kept once built) in {build_dir}"
    if building:
        _say(said, progress)
    # torch logs a long banner when the compiler is not the one it was built with; the warning above
    # (on failure) says what matters.
    _building.set()
    atexit.register(_exit_quietly_if_building)
    try:
        if not library.exists() and os.name == "posix":
            _build_in_child(name, build_dir, flags)  # the compilers in a process group of their own (see there)
        with _cpp_extension_quiet():
            _load(cpp_extension, name, build_dir, flags)
        _check_built_for(isa, library)
    finally:
        _building.clear()
        atexit.unregister(_exit_quietly_if_building)
    loaded_once.write_text(f"{isa}\n")
    if building and progress is not None:
        progress(said, 1.0)


@contextlib.contextmanager
def _cpp_extension_quiet():
    """torch.utils.cpp_extension's logger at ERROR only, for the duration (its warnings and banners here
    are about CUDA or the compiler's version, not about these kernels)."""
    logger = logging.getLogger("torch.utils.cpp_extension")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _exit_quietly_if_building() -> None:
    """At interpreter exit (a Ctrl-C of the app's server) while another thread still compiles: say so
    in one line and end the process now. Finalizing Python under a running build ends in C++ aborts
    ("terminate called without an active exception") and, with Triton loaded, nanobind's leak
    reports. Nothing is left half-done: ninja removes its partial outputs, the OS drops the build
    lock, and a library no process has loaded yet is rebuilt at the next start."""
    if _building.is_set():
        _exit_quietly()


def _exit_quietly() -> None:
    _stop_child_build()
    sys.stderr.write(f"{INTERRUPTED}\n")
    sys.stderr.flush()
    os._exit(130)


_child: dict[str, subprocess.Popen] = {}  # "build": the compiling child, while there is one


def _build_in_child(name: str, build_dir: Path, flags: list[str]) -> None:
    """Compile the kernels in a child Python process that leads a process group of its own, and wait.

    However this process ends, the compilers end with it: a SIGTERM (a closed terminal, ``kill``) or
    SIGKILL of this process reaches the child through ``PR_SET_PDEATHSIG``, a Ctrl-C or an exception
    here stops it explicitly, and the child, on any of SIGTERM, SIGHUP or SIGINT, signals its whole group
    (ninja, the compiler drivers, cc1plus). Compiled in this process, ninja and cc1plus would share its
    process group and outlive a SIGTERM as orphans, and the next start would build beside them.

    Raises:
        RuntimeError: the build failed (the compiler's last words), or was stopped by a signal.
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH")]))
    code = "import sys; from engine.cpu.ops import _child_build; _child_build(*sys.argv[1:])"
    proc = subprocess.Popen([sys.executable, "-c", code, name, str(build_dir), str(os.getpid()), json.dumps(flags)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    _child["build"] = proc
    try:
        output, _ = proc.communicate()
    except BaseException:  # KeyboardInterrupt (Ctrl-C reaches only this process group), SystemExit, ...
        _stop_child_build()
        raise
    finally:
        _child.pop("build", None)
    if proc.returncode != 0:
        stopped = f"stopped by signal {-proc.returncode}" if proc.returncode < 0 else f"exit status {proc.returncode}"
        raise RuntimeError(f"the build process ended ({stopped}): {output.strip() or 'no output'}")


def _stop_child_build() -> None:
    """SIGTERM to the build child's process group (it and every compiler it started), if one is running."""
    proc = _child.get("build")
    if proc is not None and proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)


def _child_build(name: str, build_dir: str, parent_pid: str, flags: str) -> None:
    """The build child (:func:`_build_in_child`): leader of its own process group; stops the group when
    signalled or when its parent dies, else builds and loads the library once and exits."""

    def stop(signum=signal.SIGTERM, frame=None) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # this process is in the group it signals
        with contextlib.suppress(ProcessLookupError):
            os.killpg(os.getpgid(0), signal.SIGTERM)
        os._exit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, stop)
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: SIGTERM when the parent dies
    if os.getppid() != int(parent_pid):  # the parent died before the line above
        stop()
    try:
        with _cpp_extension_quiet():
            from torch.utils import cpp_extension

            _load(cpp_extension, name, Path(build_dir), json.loads(flags))  # the parent's flags: both build the same library
    except Exception as error:  # noqa: BLE001 - said to the parent in one message, as an in-process build would
        print(f"{type(error).__name__}: {error}".strip(), flush=True)
        os._exit(1)


@contextlib.contextmanager
def build_lock(build_dir: Path, progress: Callable[[str, float], None] | None = None, timeout_s: float | None = None):
    """Hold ``<build_dir>/build.lock`` (an OS file lock, ``flock``) while building or loading.

    The OS drops the lock when its process ends, even by SIGKILL, so a killed build never blocks the
    next start. The holder's PID is written into the file; a process that finds the lock taken says
    which process it waits for (stderr, or ``progress``), and gives up with ``TimeoutError`` after
    ``timeout_s`` (default :data:`LOCK_TIMEOUT_S`) seconds.
    """
    with open(build_dir / "build.lock", "a+") as file:
        if fcntl is not None:
            _acquire(file, build_dir, progress, LOCK_TIMEOUT_S if timeout_s is None else timeout_s)
        file.seek(0)
        file.truncate()
        file.write(f"{os.getpid()}\n")
        file.flush()
        try:
            yield
        finally:
            file.truncate(0)
            if fcntl is not None:
                fcntl.flock(file, fcntl.LOCK_UN)


def _acquire(file, build_dir: Path, progress, timeout_s: float) -> None:
    try:
        fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return
    except BlockingIOError:
        pass
    file.seek(0)
    owner = file.read().strip() or "unknown"
    _say(f"Waiting for process {owner}, which is building (or loading) the engine's CPU kernels in {build_dir} "
         f"(at most {timeout_s:.0f} s; the wait ends at once if that process stops)", progress)
    deadline = time.monotonic() + timeout_s
    while True:
        time.sleep(0.2)
        try:
            fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"process {owner} has been building the CPU kernels in {build_dir} for over {timeout_s:.0f} s") from None


def _say(text: str, progress) -> None:
    if progress:
        progress(text, 0.0)
    else:
        print(text, file=sys.stderr, flush=True)


def _load(cpp_extension, name: str, build_dir: Path, flags: list[str]) -> None:
    cpp_extension.load(
        name=name,
        sources=[str(path) for path in SOURCES],
        extra_cflags=flags,
        extra_ldflags=["-fopenmp"],
        build_directory=str(build_dir),
        is_python_module=False,  # registers torch.ops.pagedattention_lab.*; needs no Python headers
        verbose=False,
    )
