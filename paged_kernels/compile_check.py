"""``python -m paged_kernels.compile_check``: compile every kernel for an NVIDIA GPU, on a machine without one.

Under the interpreter (the CPU path) a kernel is executed by numpy, so nothing checks what only the
GPU compiler checks: that every ``tl.dot`` has legal shapes, that bf16 lowers, that the kernel fits
in shared memory. Triton compiles ahead of time without a device: the front end, the MLIR passes
and LLVM run on the CPU, and the wheel bundles NVIDIA's ``ptxas`` for the last step to a cubin.

How: the public launchers (:func:`paged_kernels.paged_attention_decode` and the others) run as on a GPU
(``TRITON_INTERPRET=0``, a stand-in *driver* that only answers "the current target is sm_XX") on
small CPU tensors of each case's shapes and dtypes; at the moment Triton would compile and launch,
we take the exact signature, constants and options it chose and compile them with
``triton.compile(..., target=GPUTarget("cuda", arch, 32))`` — nothing is launched. Compiling is not
running: results still need a GPU (``TRITON_INTERPRET=0 python -m pytest tests/test_kernels.py``).

Prints one line per compiled kernel (name, case, num_warps, shared memory in bytes), or ``--json``.
Exits 1 if any compile fails.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import torch

CASES = [
    # (name, dtype, num_heads, num_kv_heads, head_dim, block_size): the default model's shape first
    ("smollm2", torch.float32, 9, 3, 64, 16),
    ("smollm2", torch.float16, 9, 3, 64, 16),
    ("smollm2", torch.bfloat16, 9, 3, 64, 16),
    ("llama-8b", torch.bfloat16, 32, 8, 128, 16),
    ("mha-odd-block", torch.float16, 4, 4, 80, 48),
]


# Compute capabilities checked to compile here (Turing through Blackwell); others are refused up front,
# since LLVM answers an unknown one with a crash rather than an error.
SUPPORTED_ARCHS = (75, 80, 86, 89, 90, 100, 120)


class _TargetOnlyDriver:
    """Answers the three questions Triton's launcher asks before compiling; never launches."""

    def __init__(self, target):
        self.target = target

    def get_current_target(self):
        return self.target

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0


def _launch_cases(capture) -> None:
    """Call every launcher, as on a GPU, once per case (decode in one pass and split-K)."""
    import paged_kernels

    for name, dtype, num_heads, num_kv_heads, head_dim, block_size in CASES:
        case = f"{name} {str(dtype).replace('torch.', '')} H={num_heads} Hkv={num_kv_heads} D={head_dim} block={block_size}"
        capture.case = case
        num_blocks, ctx = 8, [5, 33]
        cache = torch.zeros(num_blocks, block_size, num_kv_heads, head_dim, dtype=dtype)
        tables = torch.arange(4, dtype=torch.int32).repeat(2, 1)
        lens = torch.tensor(ctx, dtype=torch.int32)
        k = torch.zeros(2, num_kv_heads, head_dim, dtype=dtype)
        paged_kernels.reshape_and_cache(k, k, cache, cache.clone(), torch.tensor([0, 1]))
        paged_kernels.copy_blocks([cache], [cache.clone()], torch.tensor([[0, 1], [0, 2]]))
        q = torch.zeros(2, num_heads, head_dim, dtype=dtype)
        for splits in (1, 4):
            capture.case = f"{case} num_splits={splits}"
            paged_kernels.paged_attention_decode(q, cache, cache.clone(), tables, lens, head_dim**-0.5, num_splits=splits)
        capture.case = case
        qp = torch.zeros(sum(ctx), num_heads, head_dim, dtype=dtype)
        starts = torch.tensor([0, ctx[0], sum(ctx)], dtype=torch.int32)
        paged_kernels.paged_attention_prefill(qp, cache, cache.clone(), tables, lens, starts, head_dim**-0.5)


class _Capture:
    """Stands in for ``JITFunction._do_compile``: records what would be compiled, returns no kernel."""

    def __init__(self):
        self.case = ""
        self.jobs = []

    def wrap(self, jit_fn):
        def do_compile(key, signature, device, constexprs, options, attrs, warmup):
            self.jobs.append((jit_fn, self.case, signature, constexprs, options, attrs))
            return None  # Triton then returns before launching

        return do_compile


def compile_all(arch: int) -> list[dict]:
    """Compile every kernel of every case for ``sm_{arch}``; one dict per kernel (``ok``, ``error``...)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.driver import driver

    import paged_kernels._common
    from paged_kernels.copy_blocks import _copy_blocks_kernel
    from paged_kernels.paged_attention_decode import _paged_attention_decode_kernel
    from paged_kernels.paged_attention_prefill import _paged_attention_prefill_kernel
    from paged_kernels.paged_attention_reduce import _paged_attention_reduce_kernel
    from paged_kernels.reshape_and_cache import _reshape_and_cache_kernel

    from triton.runtime.jit import JITFunction

    if not hasattr(JITFunction, "_do_compile"):
        raise RuntimeError(f"Triton {triton.__version__} has no JITFunction._do_compile step to stop at before a launch; "
                           "paged_kernels.compile_check needs a newer Triton (it was written against 3.9)")
    target = GPUTarget("cuda", arch, 32)
    driver.set_active(_TargetOnlyDriver(target))
    capture = _Capture()
    jit_fns = [_paged_attention_decode_kernel, _paged_attention_prefill_kernel, _paged_attention_reduce_kernel, _reshape_and_cache_kernel,
               _copy_blocks_kernel]
    for fn in jit_fns:
        fn._do_compile = capture.wrap(fn)
    # The inputs are CPU tensors standing for CUDA ones: let the launchers' device check pass.
    paged_kernels._common.check_runnable = lambda device: None
    try:
        _launch_cases(capture)
    finally:
        for fn in jit_fns:
            del fn._do_compile

    results, seen = [], set()
    for fn, case, signature, constexprs, options, attrs in capture.jobs:
        key = (fn.__name__, repr(signature), repr(sorted(constexprs.items(), key=repr)))
        if key in seen:
            continue
        seen.add(key)
        row = {"kernel": fn.__name__, "case": case, "arch": f"sm_{arch}", "num_warps": options.num_warps}
        t0 = time.perf_counter()
        try:
            compiled = triton.compile(ASTSource(fn, signature, constexprs, attrs), target=target, options=options.__dict__)
            row.update(ok=True, shared_bytes=compiled.metadata.shared, cubin_bytes=len(compiled.asm["cubin"]))
        except Exception as error:  # every failure is reported, the others still compile
            row.update(ok=False, error=f"{type(error).__name__}: {error}"[:2000])
        row["seconds"] = round(time.perf_counter() - t0, 2)
        results.append(row)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m paged_kernels.compile_check", description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, default=90, choices=SUPPORTED_ARCHS, metavar="ARCH",
                        help=f"compute capability as an integer, one of {', '.join(map(str, SUPPORTED_ARCHS))}: "
                             "80 = A100, 90 = H100/H200 (default), 100 = B200")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        # The kernels were (or would be) built for the interpreter in this process: start afresh.
        env = dict(os.environ, TRITON_INTERPRET="0")
        cmd = [sys.executable, "-m", "paged_kernels.compile_check", *(argv if argv is not None else sys.argv[1:])]
        return subprocess.run(cmd, env=env).returncode
    try:
        results = compile_all(args.arch)
    except RuntimeError as error:
        parser.exit(2, f"error: {error}\n")
    if args.json:
        print(json.dumps(results, indent=1))
    else:
        for r in results:
            status = f"ok  warps={r['num_warps']} shared={r['shared_bytes']} B" if r["ok"] else f"FAILED  {r['error']}"
            print(f"{r['kernel']:<34} {r['case']:<62} {r['arch']}  {status}  ({r['seconds']} s)")
        ok = sum(r["ok"] for r in results)
        print(f"{ok}/{len(results)} kernel variants compiled for sm_{args.arch}, none launched "
              "(times near 0 s mean Triton's cache, ~/.triton/cache, already held the compiled kernel)")
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
