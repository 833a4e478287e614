"""The engine: requests in, one scheduler iteration per :meth:`LLMEngine.step`, a :class:`StepReport` out.

One step = schedule (pick the batch, allocate KV room) -> execute (run the model on the batch: write
the new K and V to the pool, attend through the block tables) -> sample one token per sequence ->
process outputs (text, stopping rules, forks and beams; free finished requests' blocks,
``engine/output_processor.py``) -> report (vLLM's ``LLMEngine.step``; v1's ``EngineCore.step`` then
``OutputProcessor``).
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Callable

import torch

from engine.config import EngineConfig
from engine.core.kv_cache_coordinator import make_kv_cache_manager
from engine.core.kv_cache_interface import get_kv_cache_config, get_kv_cache_groups, layer_specs
from engine.core.events import EventLog
from engine.core.kv_cache_manager import KVCacheManager
from engine.core.prefix_cache import PrefixCacheStats
from engine.core.scheduler import Scheduler, SchedulerOutput
from engine.core.sequence import Sequence, SequenceGroup, SequenceStatus
from engine.cpu import ops as cpu_ops
from engine.kv_transfer.nixl_connector import make_worker
from engine.kv_transfer.shared_memory_connector import SharedMemoryConnectorScheduler
from engine.model_executor.model import build_model
from engine.model_executor.model_loader import LoadedModel, load_model
from engine.model_executor import kv_quant
from engine.model_executor.model_runner import CPU_KERNEL_BACKEND, TORCH_BACKEND, ModelRunner, kv_bytes_per_slot
from engine.model_executor.platform import (available_host_memory, check_host_blocks, describe_cpu_backend, resolve_backend,
                                            resolve_device, resolve_dtype)
from engine.model_executor.sampler import sample, sample_batch
from engine.output_processor import GroupSample, OutputProcessor, Samples, StepOutputs
from engine.prefix_report import PrefixReporter
from engine.report import CACHE_HIT, WRITE, RequestOutput, ScheduledRequest, StepReport
from engine.sampling_params import BeamSearchParams, SamplingParams, sample_seed

Prompt = str | list[dict] | list[int]


class LLMEngine:
    """A step-through inference engine over a paged (or contiguous) KV cache.

    Args:
        config: :class:`~engine.EngineConfig`.
        progress: optional ``(stage, fraction)`` callback while the model is fetched and converted.
        loaded_model: weights already loaded by :func:`engine.model_executor.model_loader.load_model` for ``config.model``
            (an app reuses them across engines instead of reading them again).

    Attributes:
        requests: request_id -> its :class:`~engine.core.sequence.SequenceGroup`, until its output is taken.
        events: the engine's :class:`~engine.core.events.EventLog`: the allocator and the scheduler
            emit into it, each step drains it into ``StepReport.events``.
        output_processor: text, stopping rules, forks, beams and outputs (``engine/output_processor.py``).
        generators: request_id -> one random generator per sample index, while it samples.

    Raises:
        ValueError: a bad setting (names it), a KV budget smaller than one block, or a triton backend
            asked for where it cannot run.
        engine.model_executor.model_loader.ModelLoadError: the model cannot be found, fetched or read.
    """

    def __init__(
        self,
        config: EngineConfig | None = None,
        progress: Callable[[str, float], None] | None = None,
        loaded_model: LoadedModel | None = None,
    ):
        self.config = config = config or EngineConfig()
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, self.device)
        backend = resolve_backend(config.attention_backend, self.device, self.dtype)
        kernels = config.cpu_kernels and self.device.type == "cpu" and self.dtype in (torch.float32, torch.bfloat16)
        if kernels:  # a machine's first run builds them (saying so), meanwhile the model is fetched and converted
            cpu_ops.load_kernel_in_background(progress)
        loaded = loaded_model or load_model(config.model, dtype=torch.float32, progress=progress)
        self.model_name, self.tokenizer, self.hf_config = loaded.name, loaded.tokenizer, loaded.config
        if kernels:
            kernels = cpu_ops.load_kernel(progress=progress)  # waits for the build started above
        model = build_model(loaded.config, loaded.state_dict, self.dtype, self.device, config.cpu_kernels)
        if kernels and backend is TORCH_BACKEND:
            backend = CPU_KERNEL_BACKEND  # decode attention read in place through the block tables
        self.greedy_kernel = bool(kernels)  # greedy rows' argmax in one C++ call (engine/cpu/csrc/sampling.cpp)
        self.cpu_backend = describe_cpu_backend(model, backend, self.dtype, self.greedy_kernel)
        self.kv_cache_dtype = kv_quant.cache_dtype(config.kv_cache_dtype, self.dtype)  # the pools' element type
        self.kv_cache_spec = model_kv_cache_spec(model, config.block_size, self.kv_cache_dtype)
        group_size = max(len(g.layer_names) for g in get_kv_cache_groups(self.kv_cache_spec))
        # A slot is one token of one page: group_size layers' K and V (all the layers for one group).
        self.bytes_per_slot = kv_bytes_per_slot(group_size, model.num_kv_heads, model.head_dim, self.kv_cache_dtype)
        sizes = config.resolve(self.bytes_per_slot, getattr(self.hf_config, "max_position_embeddings", None))
        self.num_blocks, self.num_cpu_blocks, self.max_model_len = sizes.num_blocks, sizes.num_cpu_blocks, sizes.max_model_len
        max_batched = sizes.max_num_batched_tokens
        self.kv_cache_config = get_kv_cache_config(self.kv_cache_spec, self.num_blocks)
        if not self.kv_cache_config.is_hybrid:
            self.kv_cache_config = None  # one group: the paged allocator and a pair of tensors per layer, as always
        elif config.allocator != "paged" or config.speculative_config is not None:
            raise ValueError("a model with sliding-window layers needs the paged allocator and no speculative decoding")
        block_bytes = self.bytes_per_slot * config.block_size  # a page: every layer's K and V (a group's, in a hybrid pool)
        available = available_host_memory()
        check_host_blocks(f"kv_offload_blocks={config.kv_offload_blocks} (--kv-offload-blocks)", config.kv_offload_blocks, block_bytes, available)
        check_host_blocks(f"the swap space (swap_space, --swap-space) of {self.num_cpu_blocks} blocks", self.num_cpu_blocks, block_bytes, available)
        # A hybrid cache's CPU swap space keeps a null block of its own (block 0) beside its num_cpu_blocks.
        cpu_null_block = 1 if self.kv_cache_config is not None and self.num_cpu_blocks else 0
        self.runner = ModelRunner(model, self.num_blocks, config.block_size, backend,
                                  self.num_cpu_blocks + cpu_null_block + config.kv_offload_blocks,
                                  kv_cache_config=self.kv_cache_config, kv_cache_dtype=config.kv_cache_dtype,
                                  calculate_kv_scales=config.calculate_kv_scales)
        self.events = EventLog()
        self.kv = self._make_kv_manager(max_batched)
        self._requested_max_model_len = sizes.requested_max_model_len
        if self.kv_cache_config is not None:  # a token takes a slot in every group: a lone request holds fewer tokens than the pool has slots
            self.max_model_len = min(self.max_model_len, self.kv.longest_request())
            if self.max_model_len < 1:
                groups = self.kv.num_kv_cache_groups
                raise ValueError(f"a KV pool of {self.num_blocks} blocks cannot hold one token of this model: each token takes a slot "
                                 f"in each of its {groups} KV cache groups, and block 0 is the null block; give at least {groups + 1} blocks")
        self.kv_connector, self.kv_connector_worker = self._make_kv_connector()
        self.scheduler = Scheduler(self.kv, config.max_num_seqs, max_batched, config.preemption_mode, config.enable_chunked_prefill,
                                   config.schedule_first, config.scheduling_policy, config.lpm_max_wait_steps,
                                   connector=self.kv_connector)
        self.eos_token_ids = _eos_token_ids(loaded.config, self.tokenizer)
        self.output_processor = OutputProcessor(self.tokenizer, self.scheduler, self.events, self.eos_token_ids, self.max_model_len)
        self.requests: dict[int, SequenceGroup] = self.output_processor.requests
        self.detokenizer = self.output_processor.detokenizer
        self.texts: dict[int, str] = self.output_processor.texts  # per seq_id
        self.errors: dict[int, str] = self.output_processor.errors  # request_id -> "TypeError: ..." (finish reason "error")
        self.generators: dict[int, list[torch.Generator]] = {}
        self.spec = None  # speculative decoding (engine/spec_decode/), when configured
        self._spec_rows: dict = {}  # seq_id -> (its Proposal, its verification rows), between _execute and _sample
        if config.speculative_config is not None:
            from engine.spec_decode.decoder import SpeculativeDecoder

            config.speculative_config.verify_for_engine(model.num_layers, self.kv.num_usable_blocks * config.block_size, self.max_model_len)
            self.spec = SpeculativeDecoder(config.speculative_config, self.runner, self.kv, self.max_model_len, self.events)
        self.prefix_reporter = None
        if getattr(self.kv, "prefix_cache", None) is not None:
            self.prefix_reporter = PrefixReporter(self.kv.prefix_cache, self.tokenizer.decode, config.block_size)
        self.step_index = 0
        self.clock_ms = 0.0  # the engine's busy time: the sum of its steps' durations (StepReport.start_ms)
        self._arrived: dict[int, float] = {}  # requests queued since the last step, at clock_ms
        self._next_request_id = 0

    # ---- requests ---------------------------------------------------------------------------

    def encode(self, prompt: Prompt) -> list[int]:
        """Token ids of a prompt: text, chat messages (through the model's chat template) or token ids.

        A model without a chat template (a base model, such as Gemma 3 270M) reads chat messages as their
        contents, one paragraph each, after its BOS token: what a plain-text prompt of them would give.

        Raises:
            ValueError: empty prompt, token ids outside the vocabulary, or an unknown prompt type.
        """
        if isinstance(prompt, str):
            ids = self.tokenizer(prompt).input_ids if prompt else []
        elif isinstance(prompt, list) and prompt and all(isinstance(m, dict) for m in prompt):
            if any(not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str) for m in prompt):
                raise ValueError("each chat message needs a string 'role' and a string 'content'")
            if not self.tokenizer.chat_template:
                ids = self.tokenizer("\n\n".join(m["content"] for m in prompt)).input_ids
            else:
                text = self.tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
                ids = self.tokenizer(text, add_special_tokens=False).input_ids
        elif isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            ids = list(prompt)
            vocab = self.hf_config.vocab_size
            if any(not 0 <= t < vocab for t in ids):
                raise ValueError(f"token ids must be in [0, {vocab})")
        else:
            raise ValueError("a prompt is a string, a list of chat messages ({'role', 'content'}) or a list of token ids")
        if not ids:
            raise ValueError("the prompt is empty")
        return ids

    def add_request(self, prompt: Prompt, sampling_params: SamplingParams | BeamSearchParams | None = None,
                    kv_transfer_params: dict | None = None) -> int:
        """Queue a request; returns its request_id.

        ``kv_transfer_params`` (prefill/decode disaggregation, an engine with ``kv_transfer_config``):
        ``{"do_remote_decode": true}`` on a prefill instance (its output's ``kv_transfer_params`` then
        tell a decode instance where its blocks are), or those parameters on a decode instance
        (``engine/kv_transfer/``). Untrusted: a decode instance checks them, and a prefill instance
        serves only the blocks it lent under that transfer id.

        ``SamplingParams(n=k)`` asks for k parallel samples and :class:`~engine.BeamSearchParams` for
        beam search: the request's :class:`~engine.core.sequence.SequenceGroup` then holds several
        sequences that share the prompt's blocks (paper §4.4); otherwise it holds one.

        Raises:
            ValueError: a bad field of ``sampling_params`` (named), a stop token id outside the
                vocabulary, a bad prompt, or a request that can never fit: its prompt + 1 token is longer
                than max_model_len or larger than the KV pool, or its n samples / beam_width beams
                could not all reach their length in the pool; ``kv_transfer_params`` on an engine
                without a KV connector or in the wrong role, or not an object. Nothing is queued then.
        """
        self._check_kv_transfer_params(kv_transfer_params, sampling_params)
        params = sampling_params or SamplingParams()
        if not isinstance(params, (SamplingParams, BeamSearchParams)):
            raise ValueError("sampling_params must be a SamplingParams or a BeamSearchParams")
        params.verify()  # again: a field may have been changed since construction
        vocab = self.hf_config.vocab_size
        bad = [t for t in getattr(params, "stop_token_ids", []) if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"stop_token_ids must be token ids in [0, {vocab}), got {bad}")
        ids = self.encode(prompt)
        if len(ids) + 1 > self.max_model_len:
            raise ValueError(f"prompt of {len(ids)} tokens leaves no room to generate: {self.max_model_len_limit(len(ids) + 1)}")
        request_id = self._next_request_id
        beam = params if isinstance(params, BeamSearchParams) else None
        stopping = beam.stopping_params() if beam else params
        seq = Sequence(request_id, len(ids), max_len=min(len(ids) + stopping.max_tokens, self.max_model_len),
                       sampling_params=stopping, token_ids=ids, seq_id=self.output_processor.next_seq_id)
        request = SequenceGroup(request_id, [seq], stopping, beam_search=beam,
                                kv_transfer_params=dict(kv_transfer_params) if kv_transfer_params else None)
        if self.spec is not None and not request.is_single:
            what = "beam search" if beam is not None else f"n={params.n}"
            raise ValueError(f"speculative decoding serves one sequence per request: {what} is refused (use n=1, or an engine "
                             "without speculative_config)")
        if not self.kv.fits_ever(request):
            what = f"prompt of {len(ids)} tokens" if request.is_single else f"{request.num_samples} sequences of up to {seq.max_len} tokens"
            if self.kv_cache_config is None:
                raise ValueError(f"{what} can never fit in the KV pool ({self.kv.num_slots} slots)")
            raise ValueError(f"{what} can never fit in the KV pool: each token takes a slot in each of the model's "
                             f"{self.kv.num_kv_cache_groups} KV cache groups ({self.kv.num_usable_blocks} blocks of {self.config.block_size} slots)")
        self._next_request_id += 1
        if beam is None:  # beam search chooses its tokens without randomness
            seed = stopping.seed if stopping.seed is not None else self.config.seed * 1_000_003 + request_id
            self.generators[request_id] = [torch.Generator().manual_seed(seed if i == 0 else sample_seed(seed, i))
                                           for i in range(request.num_samples)]
        self.output_processor.add_request(request, self._prompt_text(prompt, ids))
        self.scheduler.add(request)
        self._arrived[request_id] = self.clock_ms
        return request_id

    @property
    def max_model_len_capped_by_pool(self) -> bool:
        """Is ``max_model_len`` the KV pool's capacity for one request, below what was asked for (or
        the model's default)? The engine caps it so that a lone request can always finish."""
        return self.max_model_len < self._requested_max_model_len

    def max_model_len_limit(self, num_tokens: int | None = None) -> str:
        """The limit behind ``max_model_len``, in words for a refusal: ``max_model_len=N`` as asked
        for; "the KV pool holds N tokens" when the pool caps it; for a hybrid KV cache, why one
        request holds fewer tokens than the pool has slots and, for a request of ``num_tokens``
        tokens, the pool or the prefill chunk that would hold it."""
        if not self.max_model_len_capped_by_pool:
            return f"max_model_len={self.max_model_len}"
        bs = self.config.block_size
        if self.kv_cache_config is None:
            return f"the KV pool holds {self.max_model_len} tokens"
        kv, usable = self.kv, self.kv.num_usable_blocks
        why = (f"the KV pool holds {self.max_model_len} tokens of one request, as each token takes a slot in each of the model's "
               f"{kv.num_kv_cache_groups} KV cache groups ({usable} blocks of {bs} slots)")
        if num_tokens is None or num_tokens > self._requested_max_model_len:
            return why
        why += f"; {num_tokens} tokens need a pool of {kv.blocks_for_one_request(num_tokens) + 1} blocks"
        chunk = kv.largest_chunk_for(num_tokens)
        if chunk is not None and chunk >= self.config.max_num_seqs:
            why += f", or chunked prefill with max_num_batched_tokens of at most {chunk}"
        return why

    def _check_kv_transfer_params(self, kv_transfer_params, sampling_params) -> None:
        if kv_transfer_params is None:
            return
        if not isinstance(kv_transfer_params, dict):
            raise ValueError("kv_transfer_params must be an object")
        config = self.config.kv_transfer_config
        if config is None:
            raise ValueError("kv_transfer_params: this engine hands no KV over (start it with a kv_transfer_config)")
        if kv_transfer_params.get("do_remote_decode") and not config.is_kv_producer:
            raise ValueError(f"kv_transfer_params.do_remote_decode: this engine is a {config.kv_role}, it lends no blocks")
        if kv_transfer_params.get("do_remote_prefill") and not config.is_kv_consumer:
            raise ValueError(f"kv_transfer_params.do_remote_prefill: this engine is a {config.kv_role}, it reads no blocks")
        if isinstance(sampling_params, BeamSearchParams) or (sampling_params is not None and sampling_params.n != 1):
            raise ValueError("kv_transfer_params: only one-sequence requests (n=1, no beam search) are handed over")
        room = kv_transfer_params.get("bootstrap_room")
        if (room is not None) != (config.kv_handover == "push"):
            raise ValueError(f"kv_transfer_params: this engine hands KV over in the {config.kv_handover} order (kv_handover): "
                             + ("a bootstrap_room belongs to the push order" if room is not None else "the push order needs a bootstrap_room"))
        if room is not None and kv_transfer_params.get("do_remote_decode"):
            if isinstance(room, bool) or not isinstance(room, int) or not 0 <= room < 2**63:
                raise ValueError("kv_transfer_params.bootstrap_room must be an integer in [0, 2**63)")
            if self.kv_connector.bootstrap.has_request(room):
                raise ValueError(f"kv_transfer_params.bootstrap_room {room} already has a prefill request")

    def _prompt_text(self, prompt: Prompt, ids: list[int]) -> str:
        """The prompt as text: a text prompt as given, chat messages' last content, or the decoded ids."""
        if isinstance(prompt, str):
            return prompt
        if prompt and isinstance(prompt[0], dict):
            return prompt[-1]["content"]
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def abort_request(self, request_id: int) -> None:
        """Stop a request now and free its KV blocks (finish reason "abort"; the next step's events
        log it). Its output keeps the text streamed so far. Unknown ids raise KeyError."""
        request = self.requests[request_id]
        if request.status != SequenceStatus.FINISHED:
            self.output_processor.abort(request)
            self.generators.pop(request_id, None)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    def get_output(self, request_id: int) -> RequestOutput:
        """The request's output so far (final once ``finish_reason`` is set); the engine keeps the
        request. Unknown ids (or outputs already taken) raise KeyError."""
        return self.output_processor.get_output(request_id)

    def take_output(self, request_id: int) -> RequestOutput:
        """A finished request's final output, handed over once: the engine then forgets the request
        (its sequences, texts and error), as vLLM's engine drops a request once its final
        ``RequestOutput`` is returned. A long-running engine so holds nothing per finished request.
        :meth:`LLM.generate <engine.LLM.generate>` takes its outputs this way.

        Raises:
            KeyError: an unknown request, or one whose output was already taken.
            ValueError: the request has not finished (abort it first to take it now).
        """
        return self.output_processor.take_output(request_id)

    def prefix_cache_stats(self) -> PrefixCacheStats | None:
        """A copy of the engine-wide prefix-cache counters (None with prefix caching off)."""
        stats = self.scheduler.prefix_cache_stats
        return None if stats is None else dataclasses.replace(stats, evictions=self.kv.prefix_cache.num_evictions)

    def prefix_cache_entries(self) -> dict | None:
        """The cached blocks now, as ``PrefixCache.entries()`` gives them (block id -> its hash and
        its parent's, for the app's pool map); None with prefix caching off."""
        cache = getattr(self.kv, "prefix_cache", None)
        return None if cache is None else cache.entries()

    def memory_usage(self):
        """The pool now, in the paper's categories (:class:`~engine.core.accounting.MemoryUsage`)."""
        waiting = self.scheduler.waiting
        return self.kv.usage(self.scheduler.running, waiting[0] if waiting else None, self.bytes_per_slot)

    # ---- the step ---------------------------------------------------------------------------

    def step(self) -> StepReport:
        """Run one scheduler iteration and report everything it did (see :class:`~engine.report.StepReport`).

        A request that fails in its own part of the step (sampling, its stopping rules, its text)
        fails alone: it finishes with reason "error" (``StepReport.errors`` and its output's
        ``error`` say what failed), its blocks are freed, and the other requests run on. A failure
        of the step itself (the swap copies, the forward pass) raises, after putting every request
        of the batch back at the head of the queue with its blocks freed: no request is lost. When
        the copies failed, the prefix cache's CPU tier and GPU cache forget the blocks they never received.
        """
        timer = _Timer()
        wall_start_ms = time.time() * 1e3 if self.kv_connector is not None else None
        batch = self.scheduler.schedule()
        timer.lap("schedule")
        self._swap(batch)
        timer.lap("swap")
        loading = list(self.scheduler.waiting_for_remote_kvs)  # loads in flight during this step (none without a connector)
        if self.kv_connector_worker is not None:
            self.kv_connector_worker.start_load_kv(batch.kv_connector_metadata)
        logits = self._execute(batch)
        if self.kv_connector_worker is not None:
            self.kv_connector_worker.wait_for_save()  # push: the prompts this pass completed go to their decode instance
        timer.lap("forward")
        # After the pass (speculation picks its drafts in it), before the outputs advance any sequence.
        drafts = {seq_id: len(proposal.draft_token_ids) for seq_id, (proposal, _) in self._spec_rows.items()}
        scheduled = batch.scheduled_requests(drafts)
        out = StepOutputs()
        if logits is not None:
            samples = self._sample(batch, logits)
            self._process_outputs(samples, out)
        timer.lap("sample")
        if self.kv_connector_worker is not None:
            self._finish_kv_loads(batch)
        report = self._make_report(batch, scheduled, out)
        timer.lap("report")
        report.timings_ms = timer.timings_ms()
        if self.kv_connector is not None:
            report.wall_start_ms, report.kv_transfers = wall_start_ms, self._kv_transfers(loading)
        report.start_ms, report.arrived, self._arrived = self.clock_ms, self._arrived, {}
        self.clock_ms += report.timings_ms["total"]
        self.step_index += 1
        return report

    # ---- KV transfer (engine/kv_transfer/) ------------------------------------------------------

    def _make_kv_connector(self):
        """The connector's scheduler and worker sides (vLLM instantiates one class per role), or (None, None)."""
        config = self.config.kv_transfer_config
        if config is None:
            return None, None
        if self.kv_cache_config is not None:
            raise ValueError("kv_transfer_config: a model with sliding-window layers (several KV cache groups, each with its own "
                             "block table) is not handed over: the connector moves one block table per request; use a model with "
                             "full attention only (the default model)")
        scheduler_side = SharedMemoryConnectorScheduler(config, self.config.block_size)  # every transport's
        attention = [layer.self_attn for layer in self.runner.model.model.layers]
        return scheduler_side, make_worker(config, self.runner.kv_caches, scheduler_side.leases, scheduler_side.bootstrap, attention)

    def _finish_kv_loads(self, batch: SchedulerOutput) -> None:
        """The loads that ended go back to the scheduler; an engine with nothing to run but loads in
        flight waits for one (up to 20 ms) instead of spinning empty steps."""
        finished = self.kv_connector_worker.get_finished()
        if finished.is_empty and batch.is_empty and self.scheduler.waiting_for_remote_kvs:
            self.kv_connector_worker.wait_for_any(0.02)
            finished = self.kv_connector_worker.get_finished()
        elif batch.is_empty and self.scheduler.bootstrapping and not self.scheduler.waiting:
            self.kv_connector.bootstrap.changed.wait(0.02)  # push: nothing to run until a decode instance reserves
        self.scheduler.update_from_kv_xfer_finished(finished)

    def _kv_transfers(self, loading: list[int]) -> dict[int, str]:
        """``StepReport.kv_transfers``: the requests in a handover during the step: lent after it,
        waiting for their decode instance's reservation (push), or loading in it (``loading``: those waiting for their KV when it was scheduled, a load that
        landed within the step included)."""
        s = self.scheduler
        return {**{rid: "lent" for rid in s.lent}, **{rid: "bootstrapping" for rid in s.bootstrapping},
                **{rid: "loading" for rid in [*loading, *s.waiting_for_remote_kvs]}}

    def serve_kv_read(self, lease, transport: str = "shm") -> dict:
        """A decode instance reads the blocks of a claimed lease (a prefill instance; call on the
        engine's thread). See ``SharedMemoryConnectorWorker.claim`` and ``serve_read``.

        Raises:
            engine.kv_transfer.lease.TransferRefused: the lease ended before the copy.
        """
        return self.kv_connector_worker.serve_read(lease, transport)

    def release_kv_transfer(self, transfer_id, prompt_hash) -> bool:
        """A decode instance is done with the blocks lent under ``transfer_id`` for its prompt (of
        ``prompt_hash``): they are freed now. Returns whether it named such a live lease."""
        released = self.kv_connector_worker.release(transfer_id, prompt_hash)
        self.scheduler.free_lent_blocks()
        return released

    def free_lent_blocks(self) -> list[int]:
        """Free the blocks of leases read or expired, and the shared memory of expired ones (the
        server calls it every second, idle or not)."""
        if self.kv_connector is None:
            return []
        freed = self.scheduler.free_lent_blocks()
        if self.kv_connector.leases is not None:
            self.kv_connector_worker.drop_segments(keep=self.kv_connector.leases.live_ids())
        return freed

    def kv_transfer_status(self) -> dict:
        """The connector's counters and the pool, for the server's ``/kv_transfer/status``."""
        c, s = self.kv_connector, self.scheduler
        leases = c.leases
        return {"engine_id": c.engine_id, "pid": os.getpid(), "kv_role": self.config.kv_transfer_config.kv_role,
                "kv_connector": self.kv_connector_worker.kv_connector,  # the transport running (NIXL's falls back without NIXL)
                "num_free_blocks": self.kv.num_free_blocks, "num_blocks": self.kv.num_usable_blocks,
                "num_lent_requests": len(s.lent), "num_leases": len(leases) if leases is not None else 0,
                "num_refused_reads": leases.num_refused if leases is not None else 0,
                "num_expired_leases": leases.num_expired if leases is not None else 0,
                "num_waiting_for_remote_kvs": len(s.waiting_for_remote_kvs), "num_loaded": c.num_loaded, "num_recomputed": c.num_recomputed,
                "num_loaded_blocks": self.kv_connector_worker.num_loaded_blocks, "num_loaded_bytes": self.kv_connector_worker.num_loaded_bytes,
                "kv_handover": self.config.kv_transfer_config.kv_handover, "kv_poll": self.kv_poll_states(),
                "num_bootstrapping": len(s.bootstrapping),
                "num_refused_reservations": c.bootstrap.num_refused if c.bootstrap is not None else 0}

    def kv_poll_states(self) -> dict[str, int]:
        """Push order: live transfers by SGLang's ``KVPoll`` state (a prefill instance's rooms, a decode
        instance's reservations), and how many ended in Success and Failed."""
        w, table = self.kv_connector_worker, self.kv_connector.bootstrap
        if table is not None:
            return {**table.counts(), **table.num_ended}
        states = list(w.poll_states.values())
        return {**{state: states.count(state) for state in ("Bootstrapping", "WaitingForInput", "Transferring")}, **w.num_poll_ended}

    def shutdown_kv_connector(self) -> None:
        if self.kv_connector_worker is not None:
            self.kv_connector_worker.shutdown()

    def _swap(self, batch: SchedulerOutput) -> None:
        """The step's swap copies, before anything else: a block swapped out may be handed out
        again in this very step."""
        if batch.blocks_to_swap_out or batch.blocks_to_swap_in or batch.kv_offload_out or batch.kv_offload_in:
            try:
                self.runner.swap(batch.blocks_to_swap_out + batch.kv_offload_out, batch.blocks_to_swap_in + batch.kv_offload_in)
            except Exception:
                self.scheduler.requeue(batch)
                self.kv.discard_offload_copies(batch.kv_offload_out, batch.kv_offload_in)
                raise

    def _execute(self, batch: SchedulerOutput) -> torch.Tensor | None:
        """The forward pass: next-token logits ``[num_seqs, vocab]`` in batch order (None when
        nothing runs). Emits a WRITE event per token, then lets the scheduler advance what the
        batch computed. A failure leaves the engine as if the step had never been scheduled."""
        if batch.is_empty:
            return None
        if self.spec is not None:
            return self._execute_speculative(batch)
        try:
            logits = self.runner.execute(batch, self.kv)
        except Exception:
            self.scheduler.requeue(batch)
            raise
        for seq in batch.prefill_seqs + batch.decode_seqs:
            start = seq.num_computed_tokens
            end = start + batch.num_tokens_of(seq)  # a chunk of a prompt ends before num_tokens
            for pos, slot in zip(range(start, end), self.kv.slot_mapping(seq, start, end)):
                self.events.emit(WRITE, seq.request_id, block_id=slot // self.kv.block_size, slot=slot, position=pos)
        return logits

    def _execute_speculative(self, batch: SchedulerOutput) -> torch.Tensor:
        """The forward pass with speculative decoding (``engine/spec_decode/decoder.py``): every
        decoding sequence gets its drafts and their lookahead slots first, and is verified over
        1 + drafts positions in the pass. Returns one row per sequence as :meth:`_execute` does (a
        speculating sequence's first row); all of a speculating sequence's rows wait in
        ``self._spec_rows`` for :meth:`_sample`."""
        try:
            proposals = self.spec.propose(batch.decode_seqs)
            logits, offsets = self.spec.execute(batch.prefill_seqs, batch.num_tokens_of, batch.decode_seqs, proposals)
        except Exception:
            self.scheduler.requeue(batch)  # frees every block of the batch, lookahead slots included
            raise
        seqs = batch.prefill_seqs + batch.decode_seqs
        self._spec_rows = {seq.seq_id: (proposals[seq.seq_id], logits[first : first + n])
                           for seq, (first, n) in zip(seqs, offsets) if seq.seq_id in proposals}
        return logits[[first for first, _ in offsets]]

    def _sample(self, batch: SchedulerOutput, logits: torch.Tensor) -> Samples:
        """One token per sequence that computed its last token (a partial prefill samples nothing):
        one-sequence requests in one batched call, groups from their rows' log-probabilities."""
        seqs = batch.prefill_seqs + batch.decode_seqs
        row_of = {id(s): i for i, s in enumerate(seqs)}
        ready = self.scheduler.update_from_output(batch)  # num_computed_tokens advanced, full blocks cached
        samples = Samples()
        speculating = self._spec_rows if self.spec is not None else {}
        self._spec_rows = {}
        for seq in ready:
            if seq.seq_id in speculating:
                proposal, rows = speculating[seq.seq_id]
                try:
                    outcome = self.spec.verify(seq, proposal, rows, self.generators[seq.request_id][0])
                except Exception as error:
                    samples.failed.append((self.requests[seq.request_id], error))
                    continue
                samples.spec.append((seq, outcome))
        plain = [row_of[id(s)] for s in ready if self.requests[s.request_id].is_single and s.seq_id not in speculating]
        for i, token in zip(plain, self._sample_plain(logits, seqs, plain, samples)):
            if token is not None:  # vLLM's logprobs=0: the chosen token's log-probability, only where asked
                logprob = None if seqs[i].sampling_params.logprobs is None else float(torch.log_softmax(logits[i].float(), -1)[token])
                samples.plain.append((seqs[i], token, logprob))
        groups: dict[int, list[int]] = {}
        for seq in ready:
            if not self.requests[seq.request_id].is_single:
                groups.setdefault(seq.request_id, []).append(row_of[id(seq)])
        for request_id, rows in groups.items():
            samples.groups.append(self._sample_group(self.requests[request_id], [seqs[i] for i in rows], logits[rows]))
        return samples

    def _sample_plain(self, logits: torch.Tensor, seqs: list[Sequence], plain: list[int], samples: Samples) -> list[int | None]:
        """One token per one-sequence request of the step: rows ``plain`` of ``logits`` (rows of
        ``seqs``). All in one batched call; if that fails, row by row from the same random state,
        so that a request whose sampling fails fails alone (its token is None) and the others get
        the tokens the batched call would have given them."""
        if not plain:
            return []
        rows = logits if len(plain) == len(logits) else logits[plain]  # no copy when every row is plain
        mine = [seqs[i] for i in plain]
        try:
            generators = [self.generators[s.request_id][0] for s in mine]
            states = [None if s.sampling_params.greedy else g.get_state() for s, g in zip(mine, generators)]
            return sample_batch(rows, [s.sampling_params for s in mine], generators, self.greedy_kernel)
        except Exception:
            pass
        tokens: list[int | None] = []
        for k, seq in enumerate(mine):
            try:
                generator = self.generators[seq.request_id][0]
                if states[k] is not None:
                    generator.set_state(states[k])
                tokens.append(sample_batch(rows[k : k + 1], [seq.sampling_params], [generator], self.greedy_kernel)[0])
            except Exception as error:
                samples.failed.append((self.requests[seq.request_id], error))
                tokens.append(None)
        return tokens

    def _sample_group(self, group: SequenceGroup, seqs: list[Sequence], logits: torch.Tensor) -> GroupSample:
        """A group's sample from its sequences' logits ``[len(seqs), vocab]``: the log-probabilities
        (a beam-search step chooses from them), and for parallel sampling one token per sample,
        drawn as a one-sequence request draws (so sample 0 equals n = 1), each from its own
        generator. At the prompt's one prefill every sample draws from the prompt's row."""
        sample_ = GroupSample(group, seqs)
        try:
            sample_.logprobs = logprobs = torch.log_softmax(logits.float(), dim=-1)
            if group.beam_search is not None:
                return sample_
            if len(group.seqs) < group.num_samples:
                pairs = [(index, 0) for index in range(group.num_samples)]
            else:
                row_of = {s.seq_id: k for k, s in enumerate(seqs)}
                pairs = [(s.index, row_of[s.seq_id]) for s in group.seqs if s.seq_id in row_of]
            generators = self.generators[group.request_id]
            for index, row in pairs:
                token = sample(logits[row], group.sampling_params, generators[index])
                sample_.tokens.append((index, token, float(logprobs[row, token])))
        except Exception as error:
            sample_.error = error
        return sample_

    def _process_outputs(self, samples: Samples, out: StepOutputs) -> None:
        """Text, stopping rules, forks and beams (``engine/output_processor.py``); finished
        requests' generators are dropped."""
        self.output_processor.process(samples, out)
        for seq, outcome in samples.spec:
            self.output_processor.guarded(seq.request_id, out, self._finish_speculation, seq, outcome, out)
        for request_id in out.finished:
            self.generators.pop(request_id, None)

    def _finish_speculation(self, seq: Sequence, outcome, out: StepOutputs) -> None:
        """A speculating sequence after verification: its emitted tokens appended (text and
        stopping rules as for one token; a stop among them ends it there), the accepted drafts
        counted as computed and their full blocks cached, the rejected drafts rolled back."""
        start = seq.num_tokens  # the first draft's position
        seq.num_computed_tokens += outcome.accepted  # update_from_output counted the newest token
        self.spec.record(seq, outcome)
        running = self.output_processor.append_tokens(seq, outcome.tokens, out)
        if running:
            self.kv.cache_blocks([seq])  # the accepted drafts' full blocks are verified now
        self.spec.rollback(seq, outcome, start, running)
        out.spec[seq.request_id] = self.spec.report(seq, outcome)

    def _make_report(self, batch: SchedulerOutput, scheduled: list[ScheduledRequest], out: StepOutputs) -> StepReport:
        """The step's :class:`StepReport`: what ran and what it produced, the drained event log, and
        the pools after the step."""
        for rid in dict.fromkeys([s.request_id for s in scheduled] + list(out.finished)):
            out.sharing[rid] = self.output_processor.sharing(self.requests[rid])
        swapped, cpu = self.scheduler.swapped, bool(self.num_cpu_blocks)
        # A verification's cache keeps its newest token and the accepted drafts (the rejected ones rolled back).
        scheduled = [dataclasses.replace(s, num_computed_tokens=s.num_computed_tokens + out.spec[s.request_id].accepted)
                     if s.phase == "decode" and s.request_id in out.spec else s for s in scheduled]
        events = self.events.drain()
        return StepReport(
            step=self.step_index, phase=batch.phase, scheduled=scheduled,
            new_token_ids=out.new_token_ids, new_text=out.new_text, finished=out.finished,
            preempted=[g.request_id for g in batch.preempted],
            events=events,
            block_tables=self.kv.snapshot(self.scheduler.running),
            kv_groups=self.kv.kv_groups(self.scheduler.running),
            spec=out.spec, spec_acceptance_rate=_rate(out.spec)[0], spec_mean_accepted_length=_rate(out.spec)[1],
            memory=self.memory_usage(),
            prefix_cache=self.prefix_cache_stats(),
            free_queue=self.kv.free_queue(),
            cached_free=self.kv.cached_free_hashes(),
            swapped=[g.request_id for g in swapped],
            swapped_out=[g.request_id for g in batch.swapped_out],
            swapped_in=[g.request_id for g in batch.swapped_in],
            admissions=list(batch.admissions) if batch.admission_reasons is not None else None,
            passed_over=dict(batch.passed_over),
            kv_offload=self.kv.offload_stats(),
            radix_tree=self.prefix_reporter.radix_tree(events) if self.prefix_reporter else None,
            prefix_matches=self._prefix_matches(events),
            blocks_to_swap_out=list(batch.blocks_to_swap_out),
            blocks_to_swap_in=list(batch.blocks_to_swap_in),
            cpu_memory=self.kv.cpu_usage(swapped) if cpu else None,
            cpu_block_tables=self.kv.cpu_snapshot(swapped) if cpu else [],
            seq_new_text=out.seq_new_text, seq_finished=out.seq_finished, sharing=out.sharing,
            beam_scores=out.beam_scores, errors=out.errors, waiting=batch.waiting,
        )

    def _prefix_matches(self, events: list) -> dict:
        if self.prefix_reporter is None:
            return {}
        hit = {e.request_id for e in events if e.kind == CACHE_HIT}
        # What the (re)prefill covers: the prompt, and after a recompute preemption its output so far too.
        prompts = {rid: seq.token_ids[: max(self.requests[rid].num_prompt_tokens, seq.num_computed_tokens)]
                   for rid in hit if rid in self.requests for seq in self.requests[rid].seqs[:1]}
        return {rid: dataclasses.replace(m, recompute=self.requests[rid].num_preemptions > 0)
                for rid, m in self.prefix_reporter.matches(events, prompts).items()}

    def _make_kv_manager(self, max_num_batched_tokens: int) -> KVCacheManager:
        cfg = self.config
        seed = cfg.seed if cfg.shuffle_blocks else None
        if cfg.allocator == "paged":
            chunk = max_num_batched_tokens if cfg.enable_chunked_prefill else None
            return make_kv_cache_manager(self.kv_cache_config, self.num_blocks, cfg.block_size, chunk, shuffle_seed=seed,
                                         enable_caching=cfg.enable_prefix_caching, num_cpu_blocks=self.num_cpu_blocks,
                                         null_block=cfg.reserve_null_block, events=self.events, prefix_cache=cfg.prefix_cache,
                                         kv_offload_blocks=cfg.kv_offload_blocks)
        from engine.baselines.contiguous import ContiguousAllocator

        return ContiguousAllocator(self.num_blocks, cfg.block_size, reservation=cfg.reservation, placement=cfg.placement,
                                   max_model_len=self.max_model_len, events=self.events)


class _Timer:
    """Wall time per phase of a step, in ms (``StepReport.timings_ms``)."""

    def __init__(self) -> None:
        self.start = self.last = time.perf_counter()
        self.ms: dict[str, float] = {}

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        self.ms[phase] = 1e3 * (now - self.last)
        self.last = now

    def timings_ms(self) -> dict[str, float]:
        return {**self.ms, "total": 1e3 * (self.last - self.start)}


def _rate(spec: dict) -> tuple[float, float]:
    """A step's acceptance rate and mean accepted length over its speculating requests."""
    proposed = sum(len(s.proposed) for s in spec.values())
    accepted = sum(s.accepted for s in spec.values())
    return (accepted / proposed if proposed else 0.0), ((accepted + len(spec)) / len(spec) if spec else 0.0)


def _eos_token_ids(config, tokenizer) -> set[int]:
    ids = set()
    for value in (getattr(config, "eos_token_id", None), tokenizer.eos_token_id):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(value)
    return ids


def model_kv_cache_spec(model, block_size: int, dtype: torch.dtype) -> dict:
    """Each layer's KV cache spec (``engine/core/kv_cache_interface.py``) from the model's
    ``layer_types`` and ``sliding_windows`` (Hugging Face's names; every layer full attention where the
    model names none)."""
    windows = [w for w in getattr(model, "sliding_windows", None) or [] if w]
    return layer_specs(model.num_layers, block_size, model.num_kv_heads, model.head_dim, torch.empty((), dtype=dtype).element_size(),
                       sliding_window=max(windows) if windows else None, layer_types=getattr(model, "layer_types", None))
