"""The engine: requests in, one scheduler iteration per :meth:`LLMEngine.step`, a :class:`StepReport` out.

One step = schedule (pick the batch, allocate KV room) -> run the model on the batch (write the new
K and V to the pool, attend through the block tables) -> sample one token per request -> check
stopping rules and free finished requests' blocks -> report (vLLM's ``LLMEngine.step``).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from engine.block_manager import KVCacheManager, PagedBlockManager
from engine.config import EngineConfig
from engine.detokenizer import Detokenizer, complete_text
from engine import cpu_ops, huge_pages
from engine.model import build_model
from engine.model_loader import LoadedModel, load_model
from engine.model_runner import CPU_KERNEL_BACKEND, TORCH_BACKEND, ModelRunner, kv_bytes_per_slot, triton_backend
from engine.beam_search import beam_search_step
from engine.prefix_cache import PrefixCacheStats
from engine.report import (FINISH, PRUNED, SHARING_BEAM, SHARING_NONE, SHARING_PARALLEL, WRITE, BeamScore, CompletionOutput, Event,
                           RequestOutput, ScheduledRequest, StepReport)
from engine.sampler import sample, sample_batch
from engine.sampling_params import BeamSearchParams, SamplingParams, sample_seed
from engine.scheduler import Scheduler
from engine.sequence import Sequence, SequenceGroup, SequenceStatus

DEFAULT_NUM_BLOCKS = 512
DEFAULT_CHUNKED_BUDGET = 512  # vLLM v0's max_num_batched_tokens with chunked prefill ("best balance between ITL and TTFT on A100")
DEFAULT_MAX_MODEL_LEN = 2048

Prompt = str | list[dict] | list[int]


class LLMEngine:
    """A step-through inference engine over a paged (or contiguous) KV cache.

    Args:
        config: :class:`~engine.EngineConfig`.
        progress: optional ``(stage, fraction)`` callback while the model is fetched and converted.
        loaded_model: weights already loaded by :func:`engine.model_loader.load_model` for ``config.model``
            (an app reuses them across engines instead of reading them again).

    Raises:
        ValueError: a bad setting (names it), a KV budget smaller than one block, or a triton backend
            asked for where it cannot run.
        engine.model_loader.ModelLoadError: the model cannot be found, fetched or read.
    """

    def __init__(
        self,
        config: EngineConfig | None = None,
        progress: Callable[[str, float], None] | None = None,
        loaded_model: LoadedModel | None = None,
    ):
        self.config = config = config or EngineConfig()
        self.device = _resolve_device(config.device)
        self.dtype = _resolve_dtype(config.dtype, self.device)
        backend = _resolve_backend(config.attention_backend, self.device, self.dtype)
        loaded = loaded_model or load_model(config.model, dtype=torch.float32, progress=progress)
        self.model_name, self.tokenizer, self.hf_config = loaded.name, loaded.tokenizer, loaded.config
        kernels = config.cpu_kernels and self.device.type == "cpu" and self.dtype in (torch.float32, torch.bfloat16)
        if kernels:
            kernels = cpu_ops.load_kernel(progress=progress)  # builds them on a machine's first run, saying so
        model = build_model(loaded.config, loaded.state_dict, self.dtype, self.device, config.cpu_kernels)
        if kernels and backend is TORCH_BACKEND:
            backend = CPU_KERNEL_BACKEND  # decode attention read in place through the block tables
        self.greedy_kernel = bool(kernels)  # greedy rows' argmax in one C++ call (engine/csrc/sampling.cpp)
        self.cpu_backend = _describe_cpu_backend(model, backend, self.dtype, self.greedy_kernel)
        self.bytes_per_slot = kv_bytes_per_slot(model.num_layers, model.num_kv_heads, model.head_dim, self.dtype)
        self.num_blocks = self._num_blocks()
        self.num_cpu_blocks = self._num_cpu_blocks()
        self.max_model_len = self._max_model_len()
        if config.enable_chunked_prefill:
            max_batched = config.max_num_batched_tokens or max(DEFAULT_CHUNKED_BUDGET, config.max_num_seqs)
        else:
            max_batched = config.max_num_batched_tokens or max(self.max_model_len, 2048)
            if max_batched < self.max_model_len:
                raise ValueError(f"max_num_batched_tokens ({max_batched}) must be >= max_model_len ({self.max_model_len}): "
                                 "without chunked prefill a prompt is prefilled whole (or set enable_chunked_prefill=True)")
        self.runner = ModelRunner(model, self.num_blocks, config.block_size, backend, self.num_cpu_blocks)
        self.kv = self._make_kv_manager()
        self.scheduler = Scheduler(self.kv, config.max_num_seqs, max_batched, config.preemption_mode, config.enable_chunked_prefill)
        self.eos_token_ids = _eos_token_ids(loaded.config, self.tokenizer)
        # Per request until its output is taken (take_output): the request, its sequences' random
        # generators and texts, and the error of a request that failed.
        self.requests: dict[int, Sequence | SequenceGroup] = {}
        self.generators: dict[int, torch.Generator] = {}  # per seq_id, while it samples
        self.detokenizer = Detokenizer(self.tokenizer)  # incremental where exact (engine/detokenizer.py)
        self.texts: dict[int, str] = self.detokenizer.texts  # per seq_id
        self.errors: dict[int, str] = {}  # request_id -> "TypeError: ..." (finish reason "error")
        self.step_index = 0
        self._next_request_id = 0
        self._next_seq_id = 0

    # ---- requests ---------------------------------------------------------------------------

    def encode(self, prompt: Prompt) -> list[int]:
        """Token ids of a prompt: text, chat messages (through the model's chat template) or token ids.

        Raises:
            ValueError: empty prompt, token ids outside the vocabulary, or an unknown prompt type.
        """
        if isinstance(prompt, str):
            ids = self.tokenizer(prompt).input_ids if prompt else []
        elif isinstance(prompt, list) and prompt and all(isinstance(m, dict) for m in prompt):
            if any(not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str) for m in prompt):
                raise ValueError("each chat message needs a string 'role' and a string 'content'")
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

    def add_request(self, prompt: Prompt, sampling_params: SamplingParams | BeamSearchParams | None = None) -> int:
        """Queue a request; returns its request_id.

        ``SamplingParams(n=k)`` asks for k parallel samples and :class:`~engine.BeamSearchParams` for
        beam search: the request is then a :class:`~engine.sequence.SequenceGroup` whose sequences
        share the prompt's blocks (paper §4.4). Otherwise it is one :class:`~engine.sequence.Sequence`.

        Raises:
            ValueError: a bad field of ``sampling_params`` (named), a stop token id outside the
                vocabulary, a bad prompt, or a request that can never fit: its prompt + 1 token is longer
                than max_model_len or larger than the KV pool, or its n samples / beam_width beams
                could not all reach their length in the pool. Nothing is queued then.
        """
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
            pool = self.num_blocks * self.config.block_size
            why = f"the KV pool holds {pool} tokens" if self.max_model_len == pool else f"max_model_len={self.max_model_len}"
            raise ValueError(f"prompt of {len(ids)} tokens leaves no room to generate: {why}")
        request_id = self._next_request_id
        beam = params if isinstance(params, BeamSearchParams) else None
        stopping = beam.stopping_params() if beam else params
        seq = Sequence(request_id, len(ids), max_len=min(len(ids) + stopping.max_tokens, self.max_model_len),
                       sampling_params=stopping, token_ids=ids, seq_id=self._next_seq_id)
        request = seq if beam is None and params.n == 1 else SequenceGroup(request_id, [seq], stopping, beam_search=beam)
        if not self.kv.fits_ever(request):
            what = f"{request.num_samples} sequences of up to {seq.max_len} tokens" if request.is_group else f"prompt of {len(ids)} tokens"
            raise ValueError(f"{what} can never fit in the KV pool ({self.kv.num_slots} slots)")
        self._next_request_id += 1
        self._next_seq_id += 1
        if beam is None:  # beam search chooses its tokens without randomness
            seed = stopping.seed if stopping.seed is not None else self.config.seed * 1_000_003 + request_id
            self.generators[seq.seq_id] = torch.Generator().manual_seed(seed)
        self.requests[request_id] = request
        self.detokenizer.add(seq.seq_id)
        self.scheduler.add(request)
        return request_id

    def abort_request(self, request_id: int) -> None:
        """Stop a request now and free its KV blocks (finish reason "abort"; the next step's events
        log it). Its output keeps the text streamed so far. Unknown ids raise KeyError."""
        request = self.requests[request_id]
        if request.status != SequenceStatus.FINISHED:
            self.scheduler.finish(request, "abort")
            self.kv.events.append(Event(FINISH, request_id, detail="abort"))
            self._release_seqs(request, truncate=True)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    def get_output(self, request_id: int) -> RequestOutput:
        """The request's output so far (final once ``finish_reason`` is set); the engine keeps the
        request. Unknown ids (or outputs already taken) raise KeyError."""
        request = self.requests[request_id]
        outputs = self._completions(request)
        first = outputs[0] if outputs else CompletionOutput(0, "", [], request.finish_reason)
        prompt = request.seqs[0].token_ids[: request.num_prompt_tokens] if request.seqs else []
        return RequestOutput(
            request_id=request_id,
            prompt_token_ids=prompt,
            token_ids=first.token_ids,
            text=first.text,
            finish_reason=request.finish_reason,
            num_preemptions=request.num_preemptions,
            outputs=outputs,
            num_cached_tokens=request.seqs[0].num_cached_tokens if request.seqs else 0,
            error=self.errors.get(request_id),
        )

    def take_output(self, request_id: int) -> RequestOutput:
        """A finished request's final output, handed over once: the engine then forgets the request
        (its sequences, texts and error), as vLLM's engine drops a request once its final
        ``RequestOutput`` is returned. A long-running engine so holds nothing per finished request.
        :meth:`LLM.generate <engine.LLM.generate>` takes its outputs this way.

        Raises:
            KeyError: an unknown request, or one whose output was already taken.
            ValueError: the request has not finished (abort it first to take it now).
        """
        if request_id not in self.requests:
            raise KeyError(f"request {request_id}: unknown, or its output was already taken")
        request = self.requests[request_id]
        if request.status != SequenceStatus.FINISHED:
            raise ValueError(f"request {request_id} has not finished: its output can be taken once it has (or abort it)")
        output = self.get_output(request_id)
        del self.requests[request_id]
        self.errors.pop(request_id, None)
        for seq in request.seqs:
            self.generators.pop(seq.seq_id, None)
            self.detokenizer.remove(seq.seq_id)
        return output

    def _completions(self, request) -> list[CompletionOutput]:
        if not request.is_group:
            return [CompletionOutput(0, self.texts[request.seq_id], request.output_token_ids, request.finish_reason)]
        if request.beam_search is None:
            return [CompletionOutput(s.index, self.texts[s.seq_id], s.output_token_ids, s.finish_reason, s.cumulative_logprob,
                                     list(s.output_logprobs)) for s in sorted(request.seqs, key=lambda s: s.index)]
        beams = request.finished_beams or [  # still searching: the live beams, best first
            _LiveBeam(s.output_token_ids, s.cumulative_logprob) for s in request.unfinished_seqs()]
        reason = request.finish_reason
        return [CompletionOutput(i, self._beam_text(b.token_ids), b.token_ids, reason, b.cumulative_logprob)
                for i, b in enumerate(beams)]

    def _beam_text(self, token_ids: list[int]) -> str:
        """A beam's text: its tokens decoded, less a character left incomplete."""
        return complete_text(self.tokenizer.decode(token_ids, skip_special_tokens=True))

    # ---- the step ---------------------------------------------------------------------------

    def step(self) -> StepReport:
        """Run one scheduler iteration and report everything it did (see :class:`~engine.report.StepReport`).

        A request that fails in its own part of the step (sampling, its stopping rules, its text)
        fails alone: it finishes with reason "error" (``StepReport.errors`` and its output's
        ``error`` say what failed), its blocks are freed, and the other requests run on. A failure
        of the step itself (the swap copies, the forward pass) raises, after putting every request
        of the batch back at the head of the queue with its blocks freed: no request is lost.
        """
        t0 = time.perf_counter()
        batch = self.scheduler.schedule()
        t1 = time.perf_counter()
        events = self.kv.events
        out = _StepOutputs()
        scheduled = [ScheduledRequest(s.request_id, "prefill", batch.num_tokens_of(s), s.num_computed_tokens + batch.num_tokens_of(s),
                                      s.num_computed_tokens + batch.num_tokens_of(s), s.num_tokens) for s in batch.prefill_seqs]
        scheduled += [ScheduledRequest(s.request_id, "decode", 1, s.num_tokens, s.num_tokens) for s in batch.decode_seqs]
        if batch.blocks_to_swap_out or batch.blocks_to_swap_in:
            try:  # before anything else: a block swapped out may be handed out again in this very step
                self.runner.swap(batch.blocks_to_swap_out, batch.blocks_to_swap_in)
            except Exception:
                self.scheduler.requeue(batch)
                raise
        t_swap = time.perf_counter()
        t2 = t3 = t_swap
        if not batch.is_empty:
            seqs = batch.prefill_seqs + batch.decode_seqs
            # A partial prefill (chunked) computes its chunk's KV but samples nothing this step.
            sampling = [i for i, s in enumerate(seqs) if s.num_computed_tokens + batch.num_tokens_of(s) == s.num_tokens]
            try:
                logits = self.runner.execute(batch, self.kv, events)
            except Exception:
                # Leave the engine as if the step had never been scheduled: no request is lost.
                self.scheduler.requeue(batch)
                events[:] = [e for e in events if e.kind != WRITE]
                raise
            t2 = time.perf_counter()
            self.scheduler.update_from_output(batch)  # num_computed_tokens advanced, full blocks cached
            plain = [i for i in sampling if not self._group(seqs[i]).is_group]
            for i, token in zip(plain, self._sample_plain(logits, seqs, plain, out)):
                if token is not None:
                    self._guarded(seqs[i].request_id, out, self._append, seqs[i], token, None, out)
            groups = {}
            for i in sampling:
                group = self._group(seqs[i])
                if group.is_group:
                    groups.setdefault(group.request_id, (group, []))[1].append(i)
            for group, rows in groups.values():
                self._guarded(group.request_id, out, self._group_step, group, [seqs[i] for i in rows], logits[rows], out)
            t3 = time.perf_counter()
        for rid in dict.fromkeys([s.request_id for s in scheduled] + list(out.finished)):
            out.sharing[rid] = self._sharing(self.requests[rid])
        report = StepReport(
            step=self.step_index,
            phase=batch.phase,
            scheduled=scheduled,
            new_token_ids=out.new_token_ids,
            new_text=out.new_text,
            finished=out.finished,
            preempted=[g.request_id for g in batch.preempted],
            events=list(events),
            block_tables=self.kv.snapshot(self.scheduler.running),
            memory=self.memory_usage(),
            prefix_cache=self.prefix_cache_stats(),
            free_queue=self.kv.free_queue(),
            cached_free=self.kv.cached_free_hashes(),
            swapped=[g.request_id for g in self.scheduler.swapped],
            swapped_out=[g.request_id for g in batch.swapped_out],
            swapped_in=[g.request_id for g in batch.swapped_in],
            blocks_to_swap_out=list(batch.blocks_to_swap_out),
            blocks_to_swap_in=list(batch.blocks_to_swap_in),
            cpu_memory=self.kv.cpu_usage(self.scheduler.swapped) if self.num_cpu_blocks else None,
            cpu_block_tables=self.kv.cpu_snapshot(self.scheduler.swapped) if self.num_cpu_blocks else [],
            seq_new_text=out.seq_new_text,
            seq_finished=out.seq_finished,
            sharing=out.sharing,
            beam_scores=out.beam_scores,
            errors=out.errors,
        )
        del events[:]  # cleared in place: the scheduler shares this list
        t4 = time.perf_counter()
        report.timings_ms = {
            "schedule": 1e3 * (t1 - t0),
            "swap": 1e3 * (t_swap - t1),
            "forward": 1e3 * (t2 - t_swap),
            "sample": 1e3 * (t3 - t2),
            "report": 1e3 * (t4 - t3),
            "total": 1e3 * (t4 - t0),
        }
        self.step_index += 1
        return report

    def _sample_plain(self, logits: torch.Tensor, seqs: list[Sequence], plain: list[int], out: _StepOutputs) -> list[int | None]:
        """One token per one-sequence request of the step: rows ``plain`` of ``logits`` (rows of
        ``seqs``). All in one batched call; if that fails, row by row from the same random state,
        so that a request whose sampling fails fails alone (its token is None) and the others get
        the tokens the batched call would have given them."""
        if not plain:
            return []
        rows = logits if len(plain) == len(logits) else logits[plain]  # no copy when every row is plain
        mine = [seqs[i] for i in plain]
        try:
            generators = [self.generators[s.seq_id] for s in mine]
            states = [None if s.sampling_params.greedy else g.get_state() for s, g in zip(mine, generators)]
            return sample_batch(rows, [s.sampling_params for s in mine], generators, self.greedy_kernel)
        except Exception:
            pass
        tokens: list[int | None] = []
        for k, seq in enumerate(mine):
            try:
                generator = self.generators[seq.seq_id]
                if states[k] is not None:
                    generator.set_state(states[k])
                tokens.append(sample_batch(rows[k : k + 1], [seq.sampling_params], [generator], self.greedy_kernel)[0])
            except Exception as error:
                self._fail(self.requests[seq.request_id], error, out)
                tokens.append(None)
        return tokens

    def _guarded(self, request_id: int, out: _StepOutputs, work: Callable, *args) -> None:
        """``work(*args)``: one request's part of the step; if it raises, that request fails alone."""
        try:
            work(*args)
        except Exception as error:
            self._fail(self.requests[request_id], error, out)

    def _fail(self, request, error: Exception, out: _StepOutputs) -> None:
        """Finish ``request`` with reason "error": free its blocks, log and report the error."""
        message = f"{type(error).__name__}: {error}"
        rid = request.request_id
        self.errors[rid] = message
        for seq in request.unfinished_seqs():
            out.seq_finished.setdefault(rid, {})[seq.seq_id] = "error"
        if request.status != SequenceStatus.FINISHED:
            self.scheduler.finish(request, "error")
        request.finish_reason = "error"
        self.kv.events.append(Event(FINISH, rid, detail=f"error: {message}"))
        out.finished[rid] = "error"
        out.errors[rid] = message
        self._release_seqs(request, truncate=True)

    def prefix_cache_stats(self) -> PrefixCacheStats | None:
        """A copy of the engine-wide prefix-cache counters (None with prefix caching off)."""
        cache = getattr(self.kv, "prefix_cache", None)
        return None if cache is None else dataclasses.replace(cache.stats)

    def memory_usage(self):
        """The pool now, in the paper's categories (:class:`~engine.accounting.MemoryUsage`)."""
        waiting = self.scheduler.waiting
        return self.kv.usage(self.scheduler.running, waiting[0] if waiting else None, self.bytes_per_slot)

    # ---- sequence groups: parallel sampling and beam search ---------------------------------

    def _group(self, seq: Sequence):
        return self.requests[seq.request_id]

    @staticmethod
    def _sharing(request) -> str:
        if not request.is_group:
            return SHARING_NONE
        return SHARING_PARALLEL if request.beam_search is None else SHARING_BEAM

    def _append(self, seq: Sequence, token: int, logprob: float | None, out: _StepOutputs) -> None:
        """Give ``seq`` its sampled token and stream its new text; finish it (and its request, when
        that was the last) if a stopping rule says so. A request's first sequence speaks for it in
        the report's ``new_token_ids`` and ``new_text``; every sequence has its ``seq_new_text``."""
        seq.append_token(token, logprob)
        self._update_text(seq)
        reason = self._finish_reason(seq, token)
        delta = self.detokenizer.delta(seq.seq_id, 0 if reason else _stop_buffer(seq.sampling_params))
        out.seq_new_text.setdefault(seq.request_id, {})[seq.seq_id] = delta
        if seq.index == 0:
            out.new_token_ids[seq.request_id] = [token]
            out.new_text[seq.request_id] = delta
        if not reason:
            return
        out.seq_finished.setdefault(seq.request_id, {})[seq.seq_id] = reason
        self.detokenizer.forget(seq.seq_id)
        self.generators.pop(seq.seq_id, None)
        request = self._group(seq)
        if request.is_group and len(request.unfinished_seqs()) > 1:
            self.scheduler.finish_seq(seq, reason)
            return
        self._finish_request(request, reason, out)

    def _finish_request(self, request, reason: str, out: _StepOutputs) -> None:
        for seq in request.unfinished_seqs():
            out.seq_finished.setdefault(request.request_id, {}).setdefault(seq.seq_id, reason)
        self.scheduler.finish(request, reason)
        self.kv.events.append(Event(FINISH, request.request_id, detail=reason))
        out.finished[request.request_id] = reason
        self._release_seqs(request)

    def _release_seqs(self, request, truncate: bool = False) -> None:
        """A finished request's sequences need no random generator nor stable point any more.
        ``truncate`` (abort, error): their texts end where their streamed text ended."""
        for seq in request.seqs:
            self.generators.pop(seq.seq_id, None)
            self.detokenizer.forget(seq.seq_id)
            if truncate and seq.seq_id in self.texts:
                self.texts[seq.seq_id] = self.texts[seq.seq_id][: self.detokenizer.emitted[seq.seq_id]]

    def _group_step(self, group: SequenceGroup, seqs: list[Sequence], logits: torch.Tensor, out: _StepOutputs) -> None:
        """A group's tokens for this step, from its sequences' logits ``[len(seqs), vocab]``."""
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        if group.beam_search is not None:
            self._beam_step(group, seqs, logprobs, out)
            return
        forked_now = len(group.seqs) < group.num_samples
        if forked_now:  # the prompt's one prefill: fork the other samples, all sample from its row
            self._fork_samples(group)
        rows = {s.seq_id: i for i, s in enumerate(seqs)}
        for seq in list(group.seqs):
            if not forked_now and seq.seq_id not in rows:
                continue  # finished in an earlier step
            row = 0 if forked_now else rows[seq.seq_id]
            # Sampled from the logits as a one-sequence request is, so sample 0 equals n = 1.
            token = sample(logits[row], seq.sampling_params, self.generators[seq.seq_id])
            self._append(seq, token, float(logprobs[row, token]), out)

    def _fork_samples(self, group: SequenceGroup) -> None:
        """Parallel sampling after the one prefill of the prompt: samples 1..n-1 fork sample 0
        (its block table, every block's refcount + 1; paper §4.4, Figure 8). Each has its own
        generator, seeded :func:`~engine.sampling_params.sample_seed` (seed, index)."""
        parent = group.seqs[0]
        seed = group.sampling_params.seed
        seed = seed if seed is not None else self.config.seed * 1_000_003 + group.request_id
        for index in range(1, group.num_samples):
            child = self._fork(parent, index)
            self.generators[child.seq_id] = torch.Generator().manual_seed(sample_seed(seed, index))
            group.seqs.append(child)

    def _fork(self, parent: Sequence, index: int) -> Sequence:
        child = parent.fork(self._next_seq_id, index)
        self._next_seq_id += 1
        self.scheduler.fork(parent, child)
        self.detokenizer.add(child.seq_id, like=parent.seq_id)
        return child

    def _beam_step(self, group: SequenceGroup, beams: list[Sequence], logprobs: torch.Tensor, out: _StepOutputs) -> None:
        """One beam-search step (``engine/beam_search.py`` decides): survivors fork their parents,
        parents left without a survivor free their blocks at once (pruned), and the group finishes
        when the search is done. Reports each live beam's text delta and :class:`BeamScore`; the
        request's ``new_text`` is empty until the search ends, then the best beam's whole text."""
        rid = group.request_id
        params = group.beam_search
        step = beam_search_step(beams, logprobs, params, group.finished_beams, self.eos_token_ids, self.max_model_len)
        group.finished_beams = step.finished
        if step.done:
            best = step.finished[0].token_ids if step.finished else []
            reason = "stop" if best and best[-1] in self.eos_token_ids and not params.ignore_eos else "length"
            out.new_token_ids[rid] = list(best)
            out.new_text[rid] = self._beam_text(best)
            self._finish_request(group, reason, out)
            for seq in group.seqs:
                self.detokenizer.remove(seq.seq_id)  # the result is the finished hypotheses' tokens
            return
        # Parents left without a survivor are pruned first: their blocks return at once (FREE
        # events), before the forks of the others (a contiguous allocator reuses their ranges).
        parents = {cand.parent.seq_id for cand in step.survivors}
        for beam in beams:
            if beam.seq_id not in parents:
                self.scheduler.finish_seq(beam, PRUNED)
                self.detokenizer.remove(beam.seq_id)
                out.seq_finished.setdefault(rid, {})[beam.seq_id] = PRUNED
        kept: set[int] = set()  # a parent is reused by its first (best) survivor, forked for the rest
        survivors = []
        for rank, cand in enumerate(step.survivors):
            child = self._fork(cand.parent, rank) if cand.parent.seq_id in kept else cand.parent
            kept.add(cand.parent.seq_id)
            survivors.append((child, cand))
        group.seqs = [child for child, _ in survivors]  # before anything else can fail: finish() frees them all
        scores = out.beam_scores.setdefault(rid, {})
        texts = out.seq_new_text.setdefault(rid, {})
        for rank, (child, cand) in enumerate(survivors):
            child.index = rank
            child.append_token(cand.token_id, cand.logprob)
            self.detokenizer.update(child.seq_id, child.output_token_ids)
            texts[child.seq_id] = self.detokenizer.delta(child.seq_id)
            length = child.num_output_tokens
            scores[child.seq_id] = BeamScore(rank, child.cumulative_logprob, child.cumulative_logprob / length**params.length_penalty)

    # ---- helpers ----------------------------------------------------------------------------

    def _update_text(self, seq: Sequence) -> None:
        """Decode ``seq``'s newest token into its text; cut it before the first stop string found
        (the sequence then stops, reason "stop")."""
        full = self.detokenizer.update(seq.seq_id, seq.output_token_ids)
        stops = seq.sampling_params.stop
        if not stops:
            return
        cuts = [i for i in (full.find(stop) for stop in stops) if i != -1]
        if cuts:
            self.detokenizer.cut(seq.seq_id, min(cuts))
            seq.finish_reason = "stop"  # confirmed by _finish_reason

    def _finish_reason(self, seq: Sequence, token: int) -> str | None:
        params = seq.sampling_params
        if seq.finish_reason == "stop":
            return "stop"
        if (token in self.eos_token_ids and not params.ignore_eos) or token in params.stop_token_ids:
            return "stop"
        if seq.num_output_tokens >= params.max_tokens or seq.num_tokens >= self.max_model_len:
            return "length"
        return None

    def _num_blocks(self) -> int:
        cfg = self.config
        if cfg.kv_cache_memory is None:
            return cfg.num_gpu_blocks or DEFAULT_NUM_BLOCKS
        num_blocks = cfg.kv_cache_memory // (self.bytes_per_slot * cfg.block_size)
        if num_blocks < 1:
            raise ValueError(f"kv_cache_memory={cfg.kv_cache_memory} bytes is smaller than one block ({self.bytes_per_slot * cfg.block_size} bytes)")
        return num_blocks

    def _num_cpu_blocks(self) -> int:
        """Blocks of the CPU swap space: none under recompute; ``swap_space`` bytes, or as many
        blocks as the GPU pool."""
        cfg = self.config
        if cfg.preemption_mode != "swap":
            return 0
        if cfg.swap_space is None:
            return self.num_blocks
        num_blocks = cfg.swap_space // (self.bytes_per_slot * cfg.block_size)
        if num_blocks < 1:
            raise ValueError(f"swap_space={cfg.swap_space} bytes is smaller than one block ({self.bytes_per_slot * cfg.block_size} bytes)")
        return num_blocks

    def _max_model_len(self) -> int:
        limit = getattr(self.hf_config, "max_position_embeddings", None) or DEFAULT_MAX_MODEL_LEN
        wanted = self.config.max_model_len or min(limit, DEFAULT_MAX_MODEL_LEN)
        if wanted > limit:
            raise ValueError(f"max_model_len={wanted} exceeds the model's limit of {limit} positions")
        # A lone request must always be able to finish, or preempting it would loop forever.
        return min(wanted, (self.num_blocks - self.config.reserve_null_block) * self.config.block_size)

    def _make_kv_manager(self) -> KVCacheManager:
        cfg = self.config
        seed = cfg.seed if cfg.shuffle_blocks else None
        if cfg.allocator == "paged":
            return PagedBlockManager(self.num_blocks, cfg.block_size, shuffle_seed=seed, enable_caching=cfg.enable_prefix_caching,
                                     num_cpu_blocks=self.num_cpu_blocks, null_block=cfg.reserve_null_block)
        from engine.contiguous import ContiguousAllocator

        return ContiguousAllocator(self.num_blocks, cfg.block_size, reservation=cfg.reservation, placement=cfg.placement, max_model_len=self.max_model_len)


@dataclass
class _StepOutputs:
    """What one step produced, per request (and per sequence), gathered for its StepReport."""

    new_token_ids: dict[int, list[int]] = field(default_factory=dict)
    new_text: dict[int, str] = field(default_factory=dict)
    finished: dict[int, str] = field(default_factory=dict)
    seq_new_text: dict[int, dict[int, str]] = field(default_factory=dict)
    seq_finished: dict[int, dict[int, str]] = field(default_factory=dict)
    sharing: dict[int, str] = field(default_factory=dict)
    beam_scores: dict[int, dict[int, BeamScore]] = field(default_factory=dict)
    errors: dict[int, str] = field(default_factory=dict)


def _stop_buffer(params: SamplingParams) -> int:
    """Characters held back while a sequence runs, so that no text a stop string will cut is
    streamed first (vLLM's ``stop_buffer_length``): the longest stop string's length - 1."""
    return max(map(len, params.stop), default=1) - 1


@dataclass(frozen=True)
class _LiveBeam:
    token_ids: list[int]
    cumulative_logprob: float


def _describe_cpu_backend(model, backend, dtype: torch.dtype, greedy_kernel: bool = False) -> str:
    """What runs each part of a CPU step, for the bench and the app: the engine's C++ kernels
    (engine/cpu_ops.py) or torch, whether a decode step runs each layer as one C++ call
    (engine.model.DecoderLayer.decode), greedy sampling's argmax, and in which pages the weights and
    KV cache live."""
    layer = model.model.layers[0]
    parts = [name for name, on in (("matmul", model.cpu_kernels), ("RMSNorm", layer.input_layernorm.cpu_kernel),
                                    ("RoPE", layer.self_attn.cpu_kernel), ("SiLU-and-mul", layer.mlp.cpu_kernel),
                                    ("decode attention", backend is CPU_KERNEL_BACKEND)) if on]
    on_cpu = next(model.parameters()).device.type == "cpu"
    pages = huge_pages.status("packed weights and KV cache" if model.cpu_kernels else "KV cache") if on_cpu else ""
    if not parts:
        return f"torch; {pages}" if pages else "torch"
    rest = [name for name in ("matmul", "RMSNorm", "RoPE", "SiLU-and-mul", "decode attention") if name not in parts]
    why = ""
    if "matmul" in rest:
        why = " (no AVX-512)" if dtype == torch.float32 else " (no AVX512-BF16)"
    text = f"engine CPU kernels ({', '.join(parts)})" + (f", torch {', '.join(rest)}{why}" if rest else "")
    if model.decode_layers and backend.cpu_decode_layer:
        text += "; decode steps: " + ("all decoder layers in one C++ call" if model.layers_decode_weights is not None else "one C++ call per decoder layer")
    if greedy_kernel:
        text += "; greedy sampling: one C++ call"
    return f"{text}; {pages}"


def _resolve_device(device: str) -> torch.device:
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' but no CUDA device is available")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(device)


def _resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, dtype)


def _resolve_backend(name: str, device: torch.device, dtype: torch.dtype):
    if name == "auto":
        name = "triton" if device.type == "cuda" else "torch"
    if name == "torch":
        return TORCH_BACKEND
    if device.type == "cpu" and dtype not in (torch.float32, torch.float16):
        raise ValueError(f"the triton backend on CPU runs in Triton's interpreter, which supports float32/float16, not {dtype}")
    backend = triton_backend()
    import kernels

    if device.type == "cpu" and not kernels.interpreter_ready():
        raise ValueError(
            "the triton backend cannot run here: Triton was imported before TRITON_INTERPRET=1 was set "
            "(import engine before running torch models, or set TRITON_INTERPRET=1 in the environment)"
        )
    return backend


def _eos_token_ids(config, tokenizer) -> set[int]:
    ids = set()
    for value in (getattr(config, "eos_token_id", None), tokenizer.eos_token_id):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(value)
    return ids
