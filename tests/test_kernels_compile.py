"""Every Triton kernel compiles for an NVIDIA GPU (sm_90, H100/H200), on this machine, without one.

The interpreter tests in test_kernels.py check what the kernels compute; they cannot check what only
the GPU compiler checks (legal ``tl.dot`` shapes, bf16 lowering, shared memory). Triton compiles ahead
of time with its bundled ptxas, so this runs in CI; running the compiled kernels still needs a GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from paged_kernels.compile_check import CASES

pytest.importorskip("triton")


def test_every_kernel_compiles_for_sm90():
    env = dict(os.environ, TRITON_INTERPRET="0")
    result = subprocess.run([sys.executable, "-m", "paged_kernels.compile_check", "--arch", "90", "--json"],
                            capture_output=True, text=True, timeout=900, env=env)
    rows = json.loads(result.stdout)
    failed = [f"{r['kernel']} ({r['case']}): {r['error']}" for r in rows if not r["ok"]]
    assert not failed, "\n".join(failed)
    assert result.returncode == 0, result.stderr
    kernels = {r["kernel"] for r in rows}
    assert kernels == {"_reshape_and_cache_kernel", "_paged_attention_decode_kernel",
                       "_paged_attention_reduce_kernel", "_paged_attention_prefill_kernel", "_copy_blocks_kernel"}
    # Each case compiles decode twice (one pass and split-K) plus the other four kernels.
    assert len(rows) == 6 * len(CASES)
    assert any("bfloat16" in r["case"] for r in rows)
    # sm_90 allows 227 KiB of shared memory per block.
    assert max(r["shared_bytes"] for r in rows) <= 227 * 1024


def test_an_unknown_architecture_is_refused_before_compiling():
    # LLVM would answer an unknown sm_XX with a crash, not an error.
    result = subprocess.run([sys.executable, "-m", "paged_kernels.compile_check", "--arch", "999"],
                            capture_output=True, text=True, timeout=300, env=dict(os.environ, TRITON_INTERPRET="0"))
    assert result.returncode == 2 and "invalid choice: 999" in result.stderr
