"""PagedAttention Lab's serving engine: a small vLLM, one scheduler iteration at a time.

    from engine import LLM, SamplingParams
    LLM().generate("Why is the sky blue?", SamplingParams(max_tokens=32))

The names below are imported on first use (PEP 562), so ``from engine import simulate`` loads the
model-free simulator alone, without torch or transformers. The layers, lowest first: ``core``
(scheduler and KV management) and ``baselines``, ``cpu`` and ``model_executor`` (torch), the
engine itself (``llm_engine``, ``llm``), ``sim`` (the simulator), and on top ``experiments``,
``vllm_bridge`` and ``tools``; ``.importlinter`` states the rules and CI checks them.
"""

from __future__ import annotations

import importlib

from engine.cpu.isa import apply_isa_caps

apply_isa_caps()  # a forced ISA (PAGEDATTENTION_LAB_CPU_ISA) caps torch's libraries too, before torch loads

# public name -> the module that defines it
_EXPORTS = {
    "LLM": "engine.llm",
    "LLMEngine": "engine.llm_engine",
    "EngineConfig": "engine.config",
    "SpeculativeConfig": "engine.config",
    "KVTransferConfig": "engine.config",
    "SamplingParams": "engine.sampling_params",
    "BeamSearchParams": "engine.sampling_params",
    "StepReport": "engine.report",
    "RequestOutput": "engine.report",
    "CompletionOutput": "engine.report",
    "MemoryUsage": "engine.core.accounting",
    "kv_bytes_per_slot": "engine.model_executor.model_runner",
    "simulate": "engine.sim.simulator",
    "SimulationConfig": "engine.sim.simulator",
    "SimulationResult": "engine.sim.simulator",
    "reproduce_paper": "engine.experiments.memory",
    "make_workload": "engine.sim.workloads",
    "Request": "engine.sim.workloads",
    "paged_attention_reference": "engine.model_executor.attention",
    "paged_prefill_reference": "engine.model_executor.attention",
    "write_kv_cache": "engine.model_executor.attention",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
