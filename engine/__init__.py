"""PagedAttention Lab's serving engine: a small vLLM, one scheduler iteration at a time.

    from engine import LLM, SamplingParams
    LLM().generate("Why is the sky blue?", SamplingParams(max_tokens=32))
"""

from engine.accounting import MemoryUsage
from engine.attention import paged_attention_reference, paged_prefill_reference, write_kv_cache
from engine.config import EngineConfig
from engine.llm import LLM
from engine.llm_engine import LLMEngine
from engine.model_runner import kv_bytes_per_slot
from engine.report import RequestOutput, StepReport
from engine.sampling_params import SamplingParams
from engine.simulator import SimulationConfig, SimulationResult, reproduce_paper, simulate
from engine.workloads import Request, make_workload

__all__ = [
    "LLM",
    "LLMEngine",
    "EngineConfig",
    "SamplingParams",
    "StepReport",
    "RequestOutput",
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
