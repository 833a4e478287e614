"""vLLM beside the lab, as on a CPU without AVX-512: loaded at interpreter start (``PYTHONPATH``) only when
``PAGEDATTENTION_LAB_CPU_ISA`` forces avx2 or generic (:func:`engine.vllm_bridge.env.runtime_env`).

vLLM's CPU platform picks its kernel library (``vllm._C`` with AVX512-BF16, ``_C_AVX512``, ``_C_AVX2``) and its
attention and GEMM paths from ``torch.cpu._is_avx512_supported()`` and ``_is_amx_tile_supported()``, which read
the CPU itself, not ATen's capability. Answering False here makes it load ``_C_AVX2`` and skip its AMX and
AVX-512 paths, as on an AVX2 laptop; ATen, MKL and oneDNN are capped by the environment
(:mod:`engine.cpu.isa`). vLLM ships no x86 build below AVX2, so a forced generic ISA runs vLLM's AVX2 one.
"""

import torch.cpu

for _name in ("_is_avx512_supported", "_is_avx512_bf16_supported", "_is_avx512_vnni_supported",
              "_is_amx_tile_supported", "_is_amx_fp16_supported"):
    if hasattr(torch.cpu, _name):
        setattr(torch.cpu, _name, lambda: False)
