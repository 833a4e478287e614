"""What-ifs at production scale: a real model on one or more real GPUs, before any engine runs.

Why KV memory decides throughput, in four numbers, each from one formula or one simulator run:

1. **Bytes.** The weights take ``parameters x bytes per weight`` (the model's dtype, or fp8 / int4
   weights: vLLM's ``--quantization``); one token's K and V take ``2 x layers x KV heads x head_dim x
   dtype bytes`` (:func:`engine.config.kv_bytes_per_slot`). With tensor parallelism over N GPUs
   (vLLM's ``--tensor-parallel-size``, Megatron-LM's split) each GPU holds 1/N of the weights and of
   the KV heads (a KV head is copied when there are fewer KV heads than GPUs).
2. **Token slots.** What is left for the KV cache, as vLLM sizes it on each GPU: ``gpu_memory_utilization
   x GPU memory - the GPU's weights`` (vLLM's default utilization 0.9; activations are not modelled),
   divided by the GPU's KV bytes per token: every GPU holds every token, its own heads of it. How many
   requests fit: the slots over what one request holds at its longest, paged (its final length,
   rounded up to whole blocks) or contiguous (paper §3 and §6.1: Orca Max reserves ``max_model_len``,
   Pow2 the prompt plus its output length rounded up to a power of two, Oracle exactly the final length).
   When the weights alone exceed the budget, the result says so and which choices would fit.
3. **The ridge point.** One decode step reads every weight once however many requests it batches, and
   each request's K and V at its context; it computes ``2 x parameters`` FLOPs and its attention per
   request. Its arithmetic intensity (FLOPs / bytes) reaches the GPU's balance (peak FLOP/s /
   bandwidth) at ``batch = weights_s / (compute_s - kv_s)`` per request (the cost model's own
   coefficients, :class:`engine.sim.cost_model.CostModel`). When a request's KV reads take longer
   than its compute (long contexts), the step stays memory-bound at every batch: there is no ridge.
   The page's curve uses the same roofline for the whole step, so it turns flat exactly there.
4. **Throughput.** The model-free simulator (``engine/sim/simulator.py``: the engine's own scheduler
   and allocators) serves the users' requests, all arriving at once, with this model and GPU's step
   times (:meth:`CostModel.from_figures`, peak figures, one GPU's share of the work): its requests/s is
   the request rate beyond which a queue grows without bound (the paper's §6.1 "highest request rate
   it sustains").

Not modelled: activations and CUDA graphs' memory, the all-reduces of tensor parallelism (two per
layer over NVLink), and the scales of quantized weights; quantized weights are read in 8 or 4 bits
and multiplied in 16 (weight-only kernels, as vLLM's Marlin and AWQ).

``python -m engine whatif --model llama-3-70b --gpu h100 --tensor-parallel-size 8`` prints the same
result as JSON.

Model figures are the Hugging Face ``config.json`` of each model; GPU figures the vendor's datasheet
(SXM parts; 16-bit dense tensor FLOP/s, without sparsity), except memory: what the device reports
as its total (``nvidia-smi``'s MiB, what vLLM's ``gpu_memory_utilization`` is a share of; an
A100-40GB's "40 GB" is 40,960 MiB). With it OPT-13B on one A100-40GB gets the paper's Table 1 (12 GB
of KV, 15.7K token slots). Every size the page shows is in GiB (2**30 bytes).
"""

from __future__ import annotations

import math
import os
import time
import dataclasses
from dataclasses import asdict, dataclass, field

from engine.config import KV_CACHE_DTYPES, kv_bytes_per_slot, kv_cache_element_bytes
from engine.sim.cost_model import CostModel, Hardware, ModelSpec, StepShape
from engine.sim.disagg import DEFAULT_LINK, DEFAULT_TARGET, LINKS, SLO, Deployment, default_rates, format_sweep, sweep, transfer_s, unloaded
from engine.sim.simulator import SimulationConfig, simulate
from engine.sim.workloads import Request

GIB = 2**30
MIB = 2**20
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
WEIGHT_DTYPES = {"auto": None, "fp8": 1.0, "int4": 0.5}  # bytes per weight; auto: the model's dtype
TENSOR_PARALLEL_SIZES = (1, 2, 4, 8)  # GPUs of one node that the page offers
SYSTEMS = ("paged", "max", "pow2", "oracle")  # the paged allocator; contiguous with each Orca reservation
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9  # vLLM's gpu_memory_utilization
MAX_NUM_SEQS = 256  # vLLM's default: the most requests one step runs
STEP_OVERHEAD_S = 1e-3  # per step, as the simulator's GPU presets (engine/sim/cost_model.py)
MAX_SIM_REQUESTS = 400  # the simulator run serves at most this many of the users' requests (it stays under 0.5 s)


@dataclass(frozen=True)
class ModelConfig:
    """One model's shape, from its Hugging Face ``config.json`` (``source``).

    Attributes:
        num_layers: ``num_hidden_layers``. num_attention_heads: query heads. num_kv_heads:
            ``num_key_value_heads`` (= query heads without grouped-query attention).
        head_dim: ``head_dim``, or ``hidden_size / num_attention_heads`` where the config has none.
        num_params: parameters (the model card's count).
        max_position_embeddings: the longest context it was trained for (tokens).
    """

    key: str
    name: str
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    num_params: float
    max_position_embeddings: int
    source: str


@dataclass(frozen=True)
class GPUSpec:
    """One accelerator's figures from its vendor datasheet (``source``).

    Attributes:
        memory_bytes: device memory, bytes, as the device reports it (``nvidia-smi``'s total). mem_bandwidth: bytes/s.
        peak_flops: dense 16-bit (bf16/fp16) tensor FLOP/s. peak_flops_fp32: float32 FLOP/s.
    """

    key: str
    name: str
    memory_bytes: float
    mem_bandwidth: float
    peak_flops: float
    peak_flops_fp32: float
    source: str


HF = "https://huggingface.co/{}/blob/main/config.json"
MODELS: dict[str, ModelConfig] = {m.key: m for m in (
    ModelConfig("smollm2-135m", "SmolLM2-135M", 30, 9, 3, 64, 134.5e6, 8192, HF.format("HuggingFaceTB/SmolLM2-135M")),
    ModelConfig("llama-3-8b", "Llama-3-8B", 32, 32, 8, 128, 8.03e9, 8192, HF.format("meta-llama/Meta-Llama-3-8B")),
    ModelConfig("llama-2-13b", "Llama-2-13B", 40, 40, 40, 128, 13.0e9, 4096, HF.format("meta-llama/Llama-2-13b-hf")),
    ModelConfig("opt-13b", "OPT-13B", 40, 40, 40, 128, 12.85e9, 2048, HF.format("facebook/opt-13b")),
    ModelConfig("qwen3-32b", "Qwen3-32B", 64, 64, 8, 128, 32.8e9, 40960, HF.format("Qwen/Qwen3-32B")),
    ModelConfig("llama-3-70b", "Llama-3-70B", 80, 64, 8, 128, 70.6e9, 8192, HF.format("meta-llama/Meta-Llama-3-70B")),
)}

# "this CPU": the lab's own machine. Memory is this machine's RAM; bandwidth and FLOP/s are what
# engine/tools/roofline.py measured on the project's Zen 4 VM (its docstring): about 45 GB/s read,
# 391 GFLOP/s bf16 and 149 GFLOP/s fp32 (torch.mm). `python -m engine bench` measures yours.
THIS_CPU = "this-cpu"


def _this_cpu_memory() -> float:
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):  # not POSIX: a stated 16 GiB
        return 16.0 * GIB


GPUS: dict[str, GPUSpec] = {g.key: g for g in (
    GPUSpec("a100-40gb", "A100-40GB", 40_960 * MIB, 1.555e12, 312e12, 19.5e12,
            "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"),
    GPUSpec("a100-80gb", "A100-80GB", 81_920 * MIB, 2.039e12, 312e12, 19.5e12,
            "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"),
    GPUSpec("h100", "H100-SXM-80GB", 81_559 * MIB, 3.35e12, 989e12, 67e12, "https://www.nvidia.com/en-us/data-center/h100/"),
    GPUSpec("h200", "H200-SXM-141GB", 143_771 * MIB, 4.8e12, 989e12, 67e12, "https://www.nvidia.com/en-us/data-center/h200/"),
    GPUSpec("l4", "L4-24GB", 23_034 * MIB, 300e9, 121e12, 30.3e12, "https://www.nvidia.com/en-us/data-center/l4/"),
    GPUSpec(THIS_CPU, "this CPU", _this_cpu_memory(), 45e9, 391e9, 149e9,
            "engine/tools/roofline.py (measured on the lab's VM; `python -m engine bench` measures yours); memory: os.sysconf"),
)}


@dataclass(frozen=True)
class WhatIfConfig:
    """One what-if.

    Attributes:
        model: a key of :data:`MODELS`. gpu: a key of :data:`GPUS`. dtype: a key of :data:`DTYPE_BYTES`
            (weights and KV alike).
        max_model_len: the context length (tokens): what Orca (Max) reserves per request.
        num_users: requests sent at once (the simulator serves them all).
        prompt_len, output_len: each request's tokens (prompt + output <= max_model_len).
        block_size: token slots per KV block (paged).
        gpu_memory_utilization: share of the device memory for weights and KV (vLLM's, default 0.9).
        max_num_seqs: the most requests one step runs (vLLM's default 256).
        kv_cache_dtype: vLLM's ``kv_cache_dtype``: "auto" (KV in ``dtype``) or an fp8 form (1 byte per K/V
            element: the same memory holds 2x bfloat16's tokens; decode reads half the KV bytes).
        tensor_parallel_size: GPUs the model is split over (vLLM's ``--tensor-parallel-size``): each holds
            1/N of the weights and of the KV heads, and does 1/N of the work.
        weight_dtype: "auto" (weights in ``dtype``), "fp8" (1 byte per weight) or "int4" (half a byte:
            AWQ / GPTQ); the matmuls stay in ``dtype``.

    Raises:
        ValueError: an unknown model, GPU, dtype or weight dtype; a length, count or block size below 1;
            a request longer than max_model_len, or max_model_len beyond the model's positions; a
            utilization outside (0, 1]; a tensor-parallel size the model's heads do not split over
            (each names its field).
    """

    model: str = "llama-3-8b"
    gpu: str = "h100"
    dtype: str = "bfloat16"
    max_model_len: int = 4096
    num_users: int = 1000
    prompt_len: int = 512
    output_len: int = 256
    block_size: int = 16
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION
    max_num_seqs: int = MAX_NUM_SEQS
    kv_cache_dtype: str = "auto"
    tensor_parallel_size: int = 1
    weight_dtype: str = "auto"

    @property
    def kv_dtype_bytes(self) -> int:
        """Bytes of one cached K or V element: ``dtype``'s under "auto", 1 for fp8."""
        return kv_cache_element_bytes(self.kv_cache_dtype, DTYPE_BYTES[self.dtype])

    @property
    def weight_bytes_per_param(self) -> float:
        """Bytes of one weight: ``dtype``'s under "auto", 1 for fp8, 0.5 for int4."""
        return weight_bytes_per_param(self.dtype, self.weight_dtype)

    @property
    def kv_heads_per_gpu(self) -> int:
        """KV heads each GPU holds (:func:`kv_heads_per_gpu`)."""
        return kv_heads_per_gpu(MODELS[self.model].num_kv_heads, self.tensor_parallel_size)

    def __post_init__(self) -> None:
        for name, choices in (("model", MODELS), ("gpu", GPUS), ("dtype", DTYPE_BYTES), ("kv_cache_dtype", KV_CACHE_DTYPES),
                              ("weight_dtype", WEIGHT_DTYPES)):
            if getattr(self, name) not in choices:
                raise ValueError(f"{name} must be one of {', '.join(choices)}; got {getattr(self, name)!r}")
        for name in ("max_model_len", "num_users", "prompt_len", "output_len", "block_size", "max_num_seqs", "tensor_parallel_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.prompt_len + self.output_len > self.max_model_len:
            raise ValueError(f"a request of prompt_len + output_len = {self.prompt_len + self.output_len} tokens is longer "
                             f"than max_model_len ({self.max_model_len})")
        limit = MODELS[self.model].max_position_embeddings
        if self.max_model_len > limit:
            raise ValueError(f"max_model_len={self.max_model_len} exceeds {MODELS[self.model].name}'s {limit} positions")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        problem = tensor_parallel_problem(MODELS[self.model], self.tensor_parallel_size)
        if problem:
            raise ValueError(f"tensor_parallel_size={self.tensor_parallel_size}: {problem}")


def weight_bytes_per_param(dtype: str, weight_dtype: str) -> float:
    """Bytes of one weight: ``dtype``'s under "auto", 1 for fp8, 0.5 for int4 (the scales not counted)."""
    return WEIGHT_DTYPES[weight_dtype] or DTYPE_BYTES[dtype]


def kv_heads_per_gpu(num_kv_heads: int, tensor_parallel_size: int) -> int:
    """KV heads each of ``tensor_parallel_size`` GPUs holds: its share, or one copy of a head when there
    are more GPUs than KV heads (vLLM replicates them)."""
    return max(1, num_kv_heads // tensor_parallel_size)


def tensor_parallel_problem(model: ModelConfig, size: int) -> str | None:
    """Why ``model`` cannot be split over ``size`` GPUs (vLLM's rule: the query heads split evenly, and
    the KV heads split evenly or are copied whole), or None when it can."""
    if model.num_attention_heads % size:
        return f"{model.name}'s {model.num_attention_heads} attention heads do not split over {size} GPUs"
    if model.num_kv_heads % size and size % model.num_kv_heads:
        return f"{model.name}'s {model.num_kv_heads} KV heads neither split over {size} GPUs nor divide them"
    return None


@dataclass
class SystemResult:
    """One allocator's figures: ``system`` is "paged" or a contiguous reservation ("max", "pow2", "oracle").

    Attributes:
        slots_per_request: token slots one request holds at its longest (reserved, for contiguous).
        requests_fit: requests the KV slots hold at once, all at their longest: ``kv_slots // slots_per_request``.
        batch: the batch they allow: ``min(requests_fit, max_num_seqs, num_users)``.
        decode_tokens_per_s: one decode step at that batch, every request at its mean context
            (prompt + output / 2): batch / step time (the cost model; 0 when nothing fits).
        sim_requests_per_s, sim_tokens_per_s: the simulator run's throughput (requests/s, output
            tokens/s): the request rate where the queue explodes. sim_mean_running: requests running
            per step. sim_preemptions: preemptions (recompute). sim_seconds: the simulated time (s).
    """

    system: str
    slots_per_request: int
    requests_fit: int
    batch: int
    decode_tokens_per_s: float
    sim_requests_per_s: float = 0.0
    sim_tokens_per_s: float = 0.0
    sim_mean_running: float = 0.0
    sim_preemptions: int = 0
    sim_seconds: float = 0.0


@dataclass
class WhatIfResult:
    """Plain data: everything the what-if page shows (see the module docstring for each formula). Sizes
    in bytes, over all GPUs unless named per GPU.

    Attributes:
        weight_bytes: parameters x bytes per weight. weight_bytes_per_gpu: weight_bytes / tensor_parallel_size.
        kv_bytes_per_token: 2 x layers x KV heads x head_dim x dtype bytes, all GPUs' shares (a copied
            head counted on each GPU). kv_bytes_per_token_per_gpu: one GPU's share.
        kv_memory_bytes: GPUs x (gpu_memory_utilization x memory - the GPU's weights); < 0: the weights
            alone do not fit. kv_memory_bytes_per_gpu: one GPU's.
        kv_slots: kv_memory_bytes_per_gpu // kv_bytes_per_token_per_gpu (0 when the weights do not fit).
        fits: the weights fit and the KV slots hold one request of max_model_len.
        would_fit: when it does not fit, the nearest choices that would: {"tensor_parallel_size": n,
            "weight_dtype": "fp8" or "int4", "gpu": key}, each present only where one fits.
        ridge_batch: the batch from which a decode step at the mean context (prompt + output / 2) is
            compute-bound: its FLOPs / bytes reach the GPU's peak FLOP/s / bandwidth; None when each
            request's KV reads outlast its compute, so that the step is memory-bound at any batch.
        ridge: the ridge's terms, seconds of one decode step: "weights_s" (the GPU's weights read once),
            "compute_s" and "kv_s" (one request's compute, and its KV and block-table reads), "context"
            (tokens), "intensity_balance" (the GPU's peak FLOP/s / bandwidth, FLOP/B).
        decode_curve: rows {"batch", "step_ms", "memory_ms", "compute_ms", "tokens_per_s"} of one
            decode step at each batch (log-spaced up to beyond the ridge and the largest fit); from
            ``ridge_batch`` on, compute_ms >= memory_ms, and below it memory_ms > compute_ms.
        systems: a :class:`SystemResult` per entry of :data:`SYSTEMS`.
        cost_model: the coefficients used (:meth:`CostModel.to_json`). sim_wall_s: the simulator's
            wall time, all systems. sim_num_requests: requests each simulator run serves. command: the CLI command that prints this result.
    """

    config: WhatIfConfig
    model: ModelConfig
    gpu: GPUSpec
    weight_bytes: float
    kv_bytes_per_token: int
    kv_memory_bytes: float
    kv_slots: int
    fits: bool
    ridge_batch: int | None
    decode_curve: list[dict]
    systems: list[SystemResult]
    cost_model: dict
    sim_wall_s: float = 0.0
    sim_num_requests: int = 0
    command: str = ""
    formulas: dict = field(default_factory=dict)
    weight_bytes_per_gpu: float = 0.0
    kv_bytes_per_token_per_gpu: int = 0
    kv_memory_bytes_per_gpu: float = 0.0
    ridge: dict = field(default_factory=dict)
    would_fit: dict = field(default_factory=dict)

    def system(self, name: str) -> SystemResult:
        return next(s for s in self.systems if s.system == name)

    def to_json(self) -> dict:
        return asdict(self)


def cost_model_of(model: ModelConfig, gpu: GPUSpec, dtype: str, kv_cache_dtype: str = "auto", tensor_parallel_size: int = 1,
                  weight_dtype: str = "auto") -> CostModel:
    """The simulator's roofline step-time model (:meth:`CostModel.from_figures`) of one GPU of
    ``tensor_parallel_size`` running ``model`` in ``dtype``: it reads its share of the weights (in
    ``weight_dtype``) and of the KV heads (in ``kv_cache_dtype``: an fp8 cache reads 1 byte per
    element), and computes its share of the FLOPs in ``dtype``."""
    nbytes, tp = DTYPE_BYTES[dtype], tensor_parallel_size
    peak = gpu.peak_flops if nbytes == 2 else gpu.peak_flops_fp32
    hardware = Hardware(gpu.name, peak_flops=peak, mem_bandwidth=gpu.mem_bandwidth, step_overhead_s=STEP_OVERHEAD_S)
    kv_bytes = kv_bytes_per_slot(model.num_layers, kv_heads_per_gpu(model.num_kv_heads, tp), model.head_dim,
                                 kv_cache_element_bytes(kv_cache_dtype, nbytes))
    spec = ModelSpec(model.name, param_bytes=model.num_params * weight_bytes_per_param(dtype, weight_dtype) / tp,
                     flops_per_token=2 * model.num_params / tp,
                     attn_flops_per_pair=4 * model.num_layers * model.num_attention_heads * model.head_dim / tp,
                     kv_bytes_per_token=kv_bytes, num_layers=model.num_layers)
    return CostModel.from_figures(hardware, spec)


def slots_per_request(system: str, cfg: WhatIfConfig) -> int:
    """Token slots one request holds at its longest: paged, its final length in whole blocks; contiguous,
    its reservation (``ContiguousAllocator.reservation_size``'s rules, paper §6.1)."""
    final = cfg.prompt_len + cfg.output_len
    if system == "paged":
        return -(-final // cfg.block_size) * cfg.block_size
    if system == "max":
        return cfg.max_model_len
    if system == "pow2":
        return min(cfg.prompt_len + 2 ** math.ceil(math.log2(cfg.output_len)), cfg.max_model_len)
    if system == "oracle":
        return final
    raise ValueError(f"system must be one of {', '.join(SYSTEMS)}; got {system!r}")


def decode_step(cost: CostModel, batch: int, context: int, block_size: int | None) -> dict:
    """One decode step of ``batch`` requests of ``context`` tokens each, on one roofline for the whole
    step: its memory side (the weights read once, and each request's K and V and, paged, its block
    table walk) against its compute side (each request's linear layers and attention); the step takes
    the longer of the two, plus the step's fixed overhead. Returns its time and both sides (ms) and
    tokens/s."""
    memory = cost.weights_s + batch * _kv_read_s(cost, context, block_size)
    compute = batch * _compute_s(cost, context)
    step = cost.step_overhead_s + max(memory, compute)
    return {"batch": batch, "step_ms": 1e3 * step, "memory_ms": 1e3 * memory, "compute_ms": 1e3 * compute,
            "tokens_per_s": batch / step}


def _kv_read_s(cost: CostModel, context: int, block_size: int | None) -> float:
    """One request's KV reads in a decode step: its ``context`` tokens' K and V, and its blocks' walk (paged)."""
    return context * cost.kv_token_s + (-(-context // block_size) * cost.block_s if block_size else 0.0)


def _compute_s(cost: CostModel, context: int) -> float:
    """One request's compute in a decode step: its token through the linear layers, and attention over ``context``."""
    return cost.token_s + context * cost.pair_s


def ridge_point(cost: CostModel, context: int, block_size: int | None) -> int | None:
    """The smallest batch whose decode step (:func:`decode_step`) is compute-bound: ``ceil(weights_s /
    (compute_s - kv_s))``, one request's compute less its KV reads; None when the KV reads are not
    less (the step stays memory-bound at any batch)."""
    gain = _compute_s(cost, context) - _kv_read_s(cost, context, block_size)
    return math.ceil(cost.weights_s / gain) if gain > 0 else None


def what_if(cfg: WhatIfConfig, simulate_throughput: bool = True) -> WhatIfResult:
    """Every figure of one what-if (module docstring); ``simulate_throughput=False`` skips the simulator runs."""
    model, gpu, tp = MODELS[cfg.model], GPUS[cfg.gpu], cfg.tensor_parallel_size
    weight_bytes = model.num_params * cfg.weight_bytes_per_param
    kv_per_gpu = kv_bytes_per_slot(model.num_layers, cfg.kv_heads_per_gpu, model.head_dim, cfg.kv_dtype_bytes)
    kv_memory_per_gpu = cfg.gpu_memory_utilization * gpu.memory_bytes - weight_bytes / tp
    kv_slots = max(int(kv_memory_per_gpu // kv_per_gpu), 0)
    fits = kv_slots // cfg.block_size * cfg.block_size >= cfg.max_model_len
    cost = cost_model_of(model, gpu, cfg.dtype, cfg.kv_cache_dtype, tp, cfg.weight_dtype)
    context = cfg.prompt_len + cfg.output_len // 2
    ridge = ridge_point(cost, context, cfg.block_size)
    systems = []
    for name in SYSTEMS:
        per_request = slots_per_request(name, cfg)
        fit = kv_slots // per_request if fits else 0
        batch = min(fit, cfg.max_num_seqs, cfg.num_users)
        tokens = decode_step(cost, batch, context, cfg.block_size if name == "paged" else None)["tokens_per_s"] if batch else 0.0
        systems.append(SystemResult(name, per_request, fit, batch, tokens))
    top = max([ridge or 0, cfg.max_num_seqs] + [s.requests_fit for s in systems])
    batches = sorted({max(1, round(2 ** (i / 4))) for i in range(0, 4 * math.ceil(math.log2(2 * top)) + 1)} | ({ridge} if ridge else set()))
    curve = [decode_step(cost, b, context, cfg.block_size) for b in batches]
    wall, num = 0.0, sim_requests(cfg, systems)
    if simulate_throughput and fits:
        t0 = time.perf_counter()
        requests = [Request(0.0, cfg.prompt_len, cfg.output_len)] * num
        for s in systems:
            allocator = "paged" if s.system == "paged" else "contiguous"
            res = simulate(requests=requests, kv_slots=kv_slots, block_size=cfg.block_size, allocator=allocator,
                           reservation="max" if allocator == "paged" else s.system, max_num_seqs=cfg.max_num_seqs,
                           max_model_len=cfg.max_model_len, cost_model=cost, schedule_first="decodes",
                           max_num_batched_tokens=max(2048, cfg.max_model_len))
            s.sim_requests_per_s, s.sim_tokens_per_s = res.throughput_requests_per_s, res.throughput_tokens_per_s
            s.sim_mean_running, s.sim_preemptions, s.sim_seconds = res.mean_concurrent_requests, res.preemptions, res.simulated_seconds
        wall = time.perf_counter() - t0
    peak = gpu.peak_flops if DTYPE_BYTES[cfg.dtype] == 2 else gpu.peak_flops_fp32
    terms = {"weights_s": cost.weights_s, "compute_s": _compute_s(cost, context), "kv_s": _kv_read_s(cost, context, cfg.block_size),
             "context": context, "intensity_balance": peak / gpu.mem_bandwidth}
    return WhatIfResult(cfg, model, gpu, weight_bytes, kv_per_gpu * tp, tp * kv_memory_per_gpu, kv_slots, fits, ridge, curve, systems,
                        cost.to_json(), wall, num, command(cfg), formulas(cfg, model, gpu, num), weight_bytes / tp, kv_per_gpu,
                        kv_memory_per_gpu, terms, {} if fits else would_fit(cfg))


def would_fit(cfg: WhatIfConfig) -> dict:
    """The nearest choices under which ``cfg`` fits (the weights, and one request of max_model_len):
    more GPUs of the same kind, smaller weights on the same GPUs, or one GPU with more memory; each
    key only where one does."""
    options = {
        "tensor_parallel_size": [dict(tensor_parallel_size=n) for n in TENSOR_PARALLEL_SIZES if n > cfg.tensor_parallel_size
                                 and not tensor_parallel_problem(MODELS[cfg.model], n)],
        "weight_dtype": [dict(weight_dtype=w) for w in ("fp8", "int4") if WEIGHT_DTYPES[w] < cfg.weight_bytes_per_param],
        "gpu": [dict(gpu=g.key) for g in sorted(GPUS.values(), key=lambda g: g.memory_bytes)
                if g.key != THIS_CPU and g.memory_bytes > GPUS[cfg.gpu].memory_bytes],
    }
    found = {}
    for name, changes in options.items():
        for change in changes:
            if what_if(dataclasses.replace(cfg, **change), simulate_throughput=False).fits:
                found[name] = change[name]
                break
    return found


def sim_requests(cfg: WhatIfConfig, systems: list[SystemResult]) -> int:
    """Requests the simulator serves: the users', at most three times the largest batch (enough rounds
    for a steady rate) and at most ``MAX_SIM_REQUESTS``, at least 64."""
    return min(cfg.num_users, MAX_SIM_REQUESTS, max(64, 3 * max(s.batch for s in systems)))


def command(cfg: WhatIfConfig) -> str:
    """The CLI command that prints ``cfg``'s result as JSON."""
    return (f"python -m engine whatif --model {cfg.model} --gpu {cfg.gpu} --dtype {cfg.dtype} --max-model-len {cfg.max_model_len} "
            f"--num-users {cfg.num_users} --prompt-len {cfg.prompt_len} --output-len {cfg.output_len} --block-size {cfg.block_size}"
            + (f" --kv-cache-dtype {cfg.kv_cache_dtype}" if cfg.kv_cache_dtype != "auto" else "")
            + (f" --tensor-parallel-size {cfg.tensor_parallel_size}" if cfg.tensor_parallel_size != 1 else "")
            + (f" --weight-dtype {cfg.weight_dtype}" if cfg.weight_dtype != "auto" else ""))


def formulas(cfg: WhatIfConfig, model: ModelConfig, gpu: GPUSpec, num_requests: int) -> dict[str, str]:
    """Where each figure comes from, filled in with this what-if's numbers (language-neutral)."""
    tp = cfg.tensor_parallel_size
    per_gpu = f" ÷ {tp} GPUs" if tp > 1 else ""
    return {
        "weights": f"{model.num_params:.4g} parameters × {cfg.weight_bytes_per_param:g} B{per_gpu}",
        "kv_per_token": f"2 × {model.num_layers} layers × {cfg.kv_heads_per_gpu} KV heads × {model.head_dim} head_dim × {cfg.kv_dtype_bytes} B"
                        + (f" per GPU × {tp} GPUs" if tp > 1 else ""),
        "kv_memory": (f"{tp} × " if tp > 1 else "") + f"({cfg.gpu_memory_utilization:g} × {gpu.memory_bytes / GIB:.1f} GiB − weights per GPU)",
        "kv_slots": "KV memory per GPU ÷ KV bytes per token per GPU",
        "ridge": "weights_s ÷ (compute_s − kv_s) per request at the mean context",
        "simulate": (f"simulate(requests=[Request(0, {cfg.prompt_len}, {cfg.output_len})] × {num_requests}, "
                     f"kv_slots=…, block_size={cfg.block_size}, allocator=…, reservation=…, max_num_seqs={cfg.max_num_seqs}, "
                     f"cost_model=CostModel.from_figures(…))"),
    }


def register_cli(subparsers) -> None:
    """Add ``whatif``: one what-if, printed as JSON."""
    import json

    p = subparsers.add_parser("whatif", help="KV memory, batch and throughput of a real model on a real GPU (no engine runs)")
    p.add_argument("--model", choices=sorted(MODELS), default="llama-3-8b")
    p.add_argument("--gpu", choices=sorted(GPUS), default="h100")
    p.add_argument("--dtype", choices=sorted(DTYPE_BYTES), default="bfloat16")
    p.add_argument("--max-model-len", type=int, default=4096, help="context length, tokens (what Orca (Max) reserves)")
    p.add_argument("--num-users", type=int, default=1000, help="requests sent at once")
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--gpu-memory-utilization", type=float, default=DEFAULT_GPU_MEMORY_UTILIZATION)
    p.add_argument("--max-num-seqs", type=int, default=MAX_NUM_SEQS)
    p.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES, default="auto", help="auto: KV in --dtype; fp8 forms: 1 byte per element")
    p.add_argument("--tensor-parallel-size", type=int, default=1, help="GPUs the weights and KV heads are split over (default: 1)")
    p.add_argument("--weight-dtype", choices=tuple(WEIGHT_DTYPES), default="auto",
                   help="auto: weights in --dtype; fp8: 1 byte per weight; int4: half a byte (AWQ / GPTQ)")

    def run(args) -> None:
        cfg = WhatIfConfig(args.model, args.gpu, args.dtype, args.max_model_len, args.num_users, args.prompt_len,
                           args.output_len, args.block_size, args.gpu_memory_utilization, args.max_num_seqs, args.kv_cache_dtype,
                           args.tensor_parallel_size, args.weight_dtype)
        data = what_if(cfg).to_json()
        data.pop("decode_curve")
        print(json.dumps(data, indent=2))

    p.set_defaults(func=run)


# --- Goodput of prefill/decode disaggregation (engine/sim/disagg.py) --------------------------------

GOODPUT_REQUESTS = 200  # requests per rate on the page: a 10-rate sweep of two deployments takes about half a second
DISAGG_CHOICES = ("1P1D", "2P1D", "1P2D", "3P1D", "2P2D")  # what the page offers (x prefill, y decode instances)


def instance_of(cfg: WhatIfConfig, enable_chunked_prefill: bool = False) -> SimulationConfig:
    """One replica of ``cfg`` (its GPUs, its KV slots, its step times) as a simulator instance, the
    engine's scheduler with decodes first (vLLM v1's rule), whole prompts or chunked prefill.

    Raises:
        ValueError: the model does not fit (the weights, or one request of max_model_len).
    """
    result = what_if(cfg, simulate_throughput=False)
    if not result.fits:
        raise ValueError(f"{result.model.name} does not fit {cfg.tensor_parallel_size} × {result.gpu.name} with room for "
                         f"one request of {cfg.max_model_len} tokens")
    budget = None if enable_chunked_prefill else max(2048, cfg.max_model_len)
    return SimulationConfig(num_requests=1, kv_slots=result.kv_slots, block_size=cfg.block_size, max_num_seqs=cfg.max_num_seqs,
                            max_model_len=cfg.max_model_len, cost_model=CostModel.from_json(result.cost_model),
                            schedule_first="decodes", enable_chunked_prefill=enable_chunked_prefill, max_num_batched_tokens=budget)


def goodput_of(cfg: WhatIfConfig, disagg: str, slo: SLO, link: str = DEFAULT_LINK, rates: list[float] | None = None,
               num_requests: int = GOODPUT_REQUESTS, enable_chunked_prefill: bool = False, seed: int = 0, points: int = 10) -> dict:
    """SLO attainment against the request rate, and goodput, for ``disagg`` (xPyD) and the colocated
    deployment with as many GPUs (:func:`engine.sim.disagg.sweep`), every request of ``cfg.prompt_len``
    and ``cfg.output_len`` tokens, Poisson arrivals.

    Args:
        cfg: the model, GPU(s) per replica, KV and limits. disagg: e.g. "1P1D". slo: TTFT and TPOT SLOs (s), target share.
        link: a key of :data:`engine.sim.disagg.LINKS`: each GPU's link for the KV transfer.
        rates: requests/s, ascending; None = ``points`` of :func:`engine.sim.disagg.default_rates`.
        num_requests: requests per rate. enable_chunked_prefill: the colocated replicas chunk prompts.

    Returns:
        The sweep's dict, plus "unloaded" (one request alone: "ttft_s", "tpot_s"), "link", "link_bandwidth"
        (B/s), "kv_bytes_per_token" (per GPU), "transfer_ms" (one request's prompt), "num_requests" and "command";
        "wall_s" counts all of it.

    Raises:
        ValueError: an unknown link or deployment, a model that does not fit, bad rates.
    """
    started = time.perf_counter()
    if link not in LINKS:
        raise ValueError(f"link must be one of {', '.join(LINKS)}; got {link!r}")
    split = Deployment.parse(disagg, cfg.tensor_parallel_size)
    if not split.disaggregated:
        raise ValueError(f"{disagg!r}: give the disaggregated deployment as xPyD; its colocated peer is added")
    instance = instance_of(cfg, enable_chunked_prefill)
    prompts, outputs = [cfg.prompt_len] * num_requests, [cfg.output_len] * num_requests
    kv_bytes = kv_bytes_per_slot(MODELS[cfg.model].num_layers, cfg.kv_heads_per_gpu, MODELS[cfg.model].head_dim, cfg.kv_dtype_bytes)
    if rates is None:
        rates = default_rates(instance, prompts, outputs, split.num_gpus, points)
    result = sweep(instance, [split, split.equal_gpus()], rates, slo, prompts, outputs, kv_bytes, LINKS[link], seed)
    rates_text = ",".join(f"{r:g}" for r in rates)
    result.update(unloaded=unloaded(instance, cfg.prompt_len, cfg.output_len), link=link, link_bandwidth=LINKS[link], num_requests=num_requests,
                  kv_bytes_per_token=kv_bytes, transfer_ms=1e3 * float(transfer_s(cfg.prompt_len, kv_bytes, LINKS[link])),
                  command=(f"python -m engine simulate --goodput --model {cfg.model} --gpu {cfg.gpu} --disagg {split.label} "
                           f"--prompt-len {cfg.prompt_len} --output-len {cfg.output_len} --max-model-len {cfg.max_model_len} "
                           f"--ttft-slo-ms {1e3 * slo.ttft_s:.4g} --tpot-slo-ms {1e3 * slo.tpot_s:.4g} --target {slo.target:g} "
                           f"--link {link} --num-requests {num_requests} --rates {rates_text}"
                           + (" --enable-chunked-prefill" if enable_chunked_prefill else "")
                           + (f" --block-size {cfg.block_size}" if cfg.block_size != 16 else "")
                           + (f" --kv-cache-dtype {cfg.kv_cache_dtype}" if cfg.kv_cache_dtype != "auto" else "")
                           + (" --dtype-bytes 4" if cfg.dtype == "float32" else "")
                           + (f" --tensor-parallel-size {cfg.tensor_parallel_size}" if cfg.tensor_parallel_size > 1 else "")))
    result["wall_s"] = time.perf_counter() - started  # the sweep, its rates and the unloaded run
    return result


# --- Command line: python -m engine simulate --goodput ... (DistServe's goodput; engine/sim/disagg.py) ----------

DEFAULT_TTFT_SCALE = 10.0  # with no --ttft-slo-ms: 10x one request's TTFT alone
DEFAULT_TPOT_SCALE = 1.5  # with no --tpot-slo-ms: 1.5x one request's TPOT alone


def add_goodput_args(p) -> None:
    """``simulate --goodput`` on the ``simulate`` parser ``p`` (its flags, and ``run_goodput`` in place of a
    simulation when the flag is given; ``engine/cli.py`` adds them above the simulator's layer). The flags (``--num-requests``, ``--max-model-len``, ``--block-size``, ``--max-num-seqs``,
    ``--seed``, ``--kv-cache-dtype``, ``--enable-chunked-prefill`` and ``--json`` are simulate's own)."""
    g = p.add_argument_group("goodput of prefill/decode disaggregation (DistServe; engine/sim/disagg.py)")
    g.add_argument("--goodput", action="store_true",
                   help="sweep request rates and print SLO attainment and goodput of xPyD against as many colocated GPUs")
    g.add_argument("--model", choices=sorted(MODELS), default="llama-3-8b", help="with --goodput: the model (default: llama-3-8b)")
    g.add_argument("--gpu", choices=sorted(GPUS), default="h100", help="with --goodput: each replica's GPU (default: h100)")
    g.add_argument("--tensor-parallel-size", type=int, default=1, help="with --goodput: GPUs per replica (default: 1)")
    g.add_argument("--disagg", nargs="+", default=["1P1D"], metavar="xPyD",
                   help="x prefill and y decode instances, each against x + y colocated replicas (default: 1P1D)")
    g.add_argument("--link", choices=tuple(LINKS), default=DEFAULT_LINK,
                   help=f"the link each GPU's KV crosses: {', '.join(f'{k} {v / 1e9:g} GB/s' for k, v in LINKS.items())} "
                        f"(default: {DEFAULT_LINK})")
    g.add_argument("--ttft-slo-ms", type=float, default=None,
                   help=f"TTFT SLO, ms (default: {DEFAULT_TTFT_SCALE:g}x one request's TTFT alone)")
    g.add_argument("--tpot-slo-ms", type=float, default=None,
                   help=f"TPOT SLO, ms (default: {DEFAULT_TPOT_SCALE:g}x one request's TPOT alone)")
    g.add_argument("--target", type=float, default=DEFAULT_TARGET, help="share of requests that must meet both SLOs (default: 0.9)")
    g.add_argument("--rates", default=None,
                   help="request rates, requests/s, comma-separated (default: --rate-points of them up to 1.5x the colocated capacity)")
    g.add_argument("--rate-points", type=int, default=20, help="how many rates the default sweep takes (default: 20)")
    g.add_argument("--prompt-len", type=int, default=512, help="with --goodput: every request's prompt tokens (default: 512)")
    g.add_argument("--output-len", type=int, default=256, help="with --goodput: every request's output tokens (default: 256)")
    simulate_cmd = p.get_default("func")
    p.set_defaults(func=lambda args: run_goodput(args) if args.goodput else simulate_cmd(args))


def run_goodput(args) -> None:
    """``simulate --goodput``: one sweep per ``--disagg`` deployment, printed as a table (or JSON)."""
    import json

    cfg = WhatIfConfig(args.model, args.gpu, "float32" if args.dtype_bytes == 4 else "bfloat16", args.max_model_len, 1,
                       args.prompt_len, args.output_len, args.block_size, max_num_seqs=args.max_num_seqs,
                       kv_cache_dtype=args.kv_cache_dtype, tensor_parallel_size=args.tensor_parallel_size)
    alone = unloaded(instance_of(cfg), args.prompt_len, args.output_len)
    slo = SLO(args.ttft_slo_ms / 1e3 if args.ttft_slo_ms else DEFAULT_TTFT_SCALE * alone["ttft_s"],
              args.tpot_slo_ms / 1e3 if args.tpot_slo_ms else DEFAULT_TPOT_SCALE * alone["tpot_s"], args.target)
    rates = [float(r) for r in args.rates.split(",")] if args.rates else None
    results = [goodput_of(cfg, d, slo, args.link, rates, args.num_requests, args.enable_chunked_prefill, args.seed, args.rate_points)
               for d in args.disagg]
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for result in results:
        print(f"{cfg.model} on {cfg.gpu}" + (f" x{cfg.tensor_parallel_size}" if cfg.tensor_parallel_size > 1 else "")
              + f", prompt {cfg.prompt_len} / output {cfg.output_len} tokens, {args.num_requests} requests per rate; "
              f"alone: TTFT {1e3 * result['unloaded']['ttft_s']:.1f} ms, TPOT {1e3 * result['unloaded']['tpot_s']:.2f} ms; "
              f"KV {result['kv_bytes_per_token']:,} B/token over {result['link']}")
        print(format_sweep(result))
        print()
