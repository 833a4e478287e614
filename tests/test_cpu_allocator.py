"""The C allocator keeps a step's freed tensors for the next (engine/cpu/allocator.py): tensors of megabytes,
made and freed round after round as a prefill's layers do, stop costing page faults."""

from __future__ import annotations

import subprocess
import sys

import pytest

from engine.cpu import allocator

ROUNDS = """
import resource, sys, torch
if sys.argv[1] == "keep":
    from engine.cpu import allocator
    allocator.keep_freed_memory()
for _ in range(4):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    live = [torch.empty(3_300_000).fill_(1.0) for _ in range(3)]  # 13.2 MB each: a 128-token prompt x16's gate, up and their product
    del live
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def last_round_faults(mode: str) -> int:
    """Minor page faults of the fourth round in a fresh process (nothing earlier moved glibc's thresholds)."""
    done = subprocess.run([sys.executable, "-c", ROUNDS, mode], capture_output=True, text=True, timeout=120, check=True)
    return int(done.stdout.split()[-1])


@pytest.mark.skipif("kept" not in allocator.keep_freed_memory(), reason=allocator.keep_freed_memory())
def test_freed_tensors_of_megabytes_are_reused_without_page_faults():
    # 39.6 MB are 9,700 pages: glibc's defaults unmap or trim them at every free, and each page faults again
    # (and is zeroed) at the next round's first write; with the thresholds raised the heap keeps them.
    assert last_round_faults("default") > 3000
    assert last_round_faults("keep") < 200


def test_keep_freed_memory_says_what_it_did_once_per_process():
    first = allocator.keep_freed_memory()
    assert first == allocator.keep_freed_memory()
    assert first.startswith(("freed memory kept for the next step", "freed memory returned to the OS ("))
