"""Triton kernels for PagedAttention Lab.

Four public functions, each in its own file so it can be read on its own:

* :func:`reshape_and_cache` (``reshape_and_cache.py``) writes a step's new K and V into the
  paged pools through a ``slot_mapping``.
* :func:`paged_attention_decode` (``paged_attention_decode.py``, with its split-K reduction in
  ``paged_attention_reduce.py``) attends one query token per sequence to its context.
* :func:`paged_attention_prefill` (``paged_attention_prefill.py``) attends a prompt's new tokens
  causally to themselves and to any context already in the cache.
* :func:`copy_blocks` (``copy_blocks.py``) copies whole blocks of K and V in every layer, the copy
  half of copy-on-write.

Each one computes the same thing as the torch oracle in :mod:`engine.model_executor.attention`.

Why this file may set ``TRITON_INTERPRET``: Triton compiles kernels for a GPU. Without one we
still want the kernels to run (tests on a laptop, CI, lessons), and Triton ships an interpreter
that executes a kernel's programs one after another with numpy. The interpreter is chosen when
``@triton.jit`` decorates a function, by reading ``TRITON_INTERPRET`` at that moment, so it
must be set before the kernel modules below are imported. We set it only when no CUDA device
is available and the user has not chosen a value; an explicit ``TRITON_INTERPRET=0`` is kept.
Import the kernels through ``import paged_kernels`` so this always happens first.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available() and "TRITON_INTERPRET" not in os.environ:
    os.environ["TRITON_INTERPRET"] = "1"

try:
    import triton  # noqa: F401
except ImportError as error:  # Triton ships wheels for Linux only
    # Triton ships wheels for Linux only: importing this package must never fail, so that every page
    # and lesson that does not run a kernel still works; the kernels raise when used.
    _reason = f"Triton is not installed ({error}); use attention_backend='torch'"

    def _unavailable(*args, **kwargs):
        raise ImportError(_reason)

    copy_blocks = reshape_and_cache = paged_attention_decode = paged_attention_prefill = _unavailable

    def interpreted() -> bool:
        return False

    def interpreter_ready() -> bool:
        return False

else:
    from paged_kernels._common import interpreted, interpreter_ready  # noqa: E402
    from paged_kernels.copy_blocks import copy_blocks  # noqa: E402
    from paged_kernels.paged_attention_decode import paged_attention_decode  # noqa: E402
    from paged_kernels.paged_attention_prefill import paged_attention_prefill  # noqa: E402
    from paged_kernels.reshape_and_cache import reshape_and_cache  # noqa: E402



def unavailable_reason() -> str | None:
    """Why the kernels cannot run here (Triton is not installed, or fails to import), or None when they can."""
    return globals().get("_reason")


__all__ = ["copy_blocks", "interpreted", "interpreter_ready", "paged_attention_decode", "paged_attention_prefill", "reshape_and_cache",
           "unavailable_reason"]
