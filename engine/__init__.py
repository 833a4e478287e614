"""PagedAttention Lab's serving engine: a small vLLM, one scheduler iteration at a time.

    from engine import LLM, SamplingParams
    LLM().generate("Why is the sky blue?", SamplingParams(max_tokens=32))
"""

import os as _os

import torch as _torch

# Triton runs on a CPU only through its interpreter, which must be chosen before Triton is first
# imported — and torch imports it on its own during a model run. So the engine, the usual entry
# point, chooses it as soon as it is imported (the same rule as kernels/__init__.py).
if not _torch.cuda.is_available() and "TRITON_INTERPRET" not in _os.environ:
    _os.environ["TRITON_INTERPRET"] = "1"

from engine.core.accounting import MemoryUsage  # noqa: E402
from engine.model_executor.attention import paged_attention_reference, paged_prefill_reference, write_kv_cache  # noqa: E402
from engine.config import EngineConfig  # noqa: E402
from engine.llm import LLM  # noqa: E402
from engine.llm_engine import LLMEngine  # noqa: E402
from engine.model_executor.model_runner import kv_bytes_per_slot  # noqa: E402
from engine.report import CompletionOutput, RequestOutput, StepReport  # noqa: E402
from engine.sampling_params import BeamSearchParams, SamplingParams  # noqa: E402
from engine.sim.simulator import SimulationConfig, SimulationResult, reproduce_paper, simulate  # noqa: E402
from engine.sim.workloads import Request, make_workload  # noqa: E402

__all__ = [
    "LLM",
    "LLMEngine",
    "EngineConfig",
    "SamplingParams",
    "BeamSearchParams",
    "StepReport",
    "RequestOutput",
    "CompletionOutput",
    "MemoryUsage",
    "kv_bytes_per_slot",
    "simulate",
    "SimulationConfig",
    "SimulationResult",
    "reproduce_paper",
    "make_workload",
    "Request",
    "paged_attention_reference",
    "paged_prefill_reference",
    "write_kv_cache",
]
