"""Running the whole process as on a smaller CPU: the ISA a laptop has, on a server that has more.

``PAGEDATTENTION_LAB_CPU_ISA=avx2`` builds the engine's own kernels for AVX2 (:mod:`engine.cpu.ops`). The rest
of a step runs in torch, whose libraries pick their code paths by the CPU at run time: ATen's vectorized ops,
MKL and oneDNN would still run AVX-512 (and AMX) on an AVX-512 server. :func:`apply_isa_caps` caps them too,
with each library's own setting, so that a forced ISA measures what an AVX2 laptop would run:

========  ======================  ==========================  ======================
ISA       ``ATEN_CPU_CAPABILITY``  ``MKL_ENABLE_INSTRUCTIONS``  ``ONEDNN_MAX_CPU_ISA``
========  ======================  ==========================  ======================
avx2      ``avx2``                ``AVX2``                    ``AVX2``
generic   ``default``             ``SSE4_2``                  ``SSE41``
========  ======================  ==========================  ======================

Each is read once, when its library loads, so the caps must be in the environment before torch is imported:
``import engine`` applies them (``python -m engine ...`` always does it first). A variable already set is
left as it is. Real vLLM beside the lab inherits them, and picks its own AVX2 kernel library too
(:func:`engine.vllm_bridge.env.runtime_env`). Standard library only: this runs before torch loads.
"""

from __future__ import annotations

import os

ISA_ENV_VAR = "PAGEDATTENTION_LAB_CPU_ISA"

# ISA -> the settings that cap ATen, MKL and oneDNN at it (each library's documented variable).
TORCH_ISA_CAPS: dict[str, dict[str, str]] = {
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "generic": {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2", "ONEDNN_MAX_CPU_ISA": "SSE41"},
}


def forced_isa() -> str | None:
    """The ISA ``$PAGEDATTENTION_LAB_CPU_ISA`` asks for (lower case), or None when it is not set."""
    return os.environ.get(ISA_ENV_VAR, "").strip().lower() or None


def apply_isa_caps() -> dict[str, str]:
    """Put the caps of the forced ISA (:data:`TORCH_ISA_CAPS`) into ``os.environ``, leaving any already set.

    Returns the settings it added (empty when no ISA is forced, or ``avx512``, which needs no cap). An ISA
    name that is not known is left for :func:`engine.cpu.ops.build_isa` to refuse with its reason.
    """
    added = {}
    for key, value in TORCH_ISA_CAPS.get(forced_isa() or "", {}).items():
        if key not in os.environ:
            os.environ[key] = added[key] = value
    return added
