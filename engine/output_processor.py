"""Output processing: what a step's sampled tokens do to their requests (vLLM v1's ``OutputProcessor``).

The engine samples; this module does the rest, request by request:

- **detokenize** each sequence's newest token into its text (``engine/detokenizer.py``), streaming
  only text no later token can change;
- **stop rules**: EOS, ``stop_token_ids``, stop strings (the text is cut before the first one found;
  while a sequence runs, ``len(longest stop) - 1`` characters are held back, vLLM's stop buffer),
  ``max_tokens`` and ``max_model_len``;
- **forks**: parallel sampling forks the other samples after the prompt's one prefill
  (:func:`~engine.core.sequence.fork_samples`, paper §4.4);
- **beams**: a beam-search step (``engine/core/beam_search.py`` decides) forks the survivors and
  prunes the other beams;
- **outputs**: :class:`~engine.report.RequestOutput` / :class:`~engine.report.CompletionOutput`, and the
  per-request deltas the OpenAI server streams (:class:`RequestDelta`).

A request that fails in its own part of a step fails alone: it finishes with reason "error".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from engine.core.beam_search import beam_search_step
from engine.core.events import EventLog
from engine.core.scheduler import Scheduler
from engine.core.sequence import Sequence, SequenceGroup, SequenceStatus, fork_samples
from engine.detokenizer import Detokenizer, complete_text
from engine.report import (FINISH, PRUNED, SHARING_BEAM, SHARING_NONE, SHARING_PARALLEL, BeamScore, CompletionOutput,
                           RequestOutput, StepReport)
from engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    import torch


@dataclass
class StepOutputs:
    """What one step produced, per request (and per sequence), gathered for its StepReport."""

    new_token_ids: dict[int, list[int]] = field(default_factory=dict)
    new_text: dict[int, str] = field(default_factory=dict)
    finished: dict[int, str] = field(default_factory=dict)
    seq_new_text: dict[int, dict[int, str]] = field(default_factory=dict)
    seq_finished: dict[int, dict[int, str]] = field(default_factory=dict)
    sharing: dict[int, str] = field(default_factory=dict)
    beam_scores: dict[int, dict[int, BeamScore]] = field(default_factory=dict)
    errors: dict[int, str] = field(default_factory=dict)
    spec: dict = field(default_factory=dict)  # request_id -> SpecDecodeOutput (speculative decoding)


@dataclass
class GroupSample:
    """What the sampler gave a request of several sequences (parallel sampling or beam search).

    Attributes:
        group: the request.
        seqs: its sequences that computed their last token this step, in batch order.
        logprobs: ``[len(seqs), vocab]`` float32 log-softmax of their next-token logits.
        tokens: parallel sampling: ``(sample index, token id, logprob)`` per sample, index order;
            at the prompt's one prefill every sample draws from the prompt's row. Beam search: empty.
        error: sampling failed for this request (it then fails alone).
    """

    group: SequenceGroup
    seqs: list[Sequence]
    logprobs: torch.Tensor | None = None
    tokens: list[tuple[int, int, float]] = field(default_factory=list)
    error: Exception | None = None


@dataclass
class Samples:
    """One step's sampling: one token per one-sequence request, a :class:`GroupSample` per group,
    and the one-sequence requests whose sampling failed."""

    plain: list[tuple[Sequence, int, float | None]] = field(default_factory=list)  # (seq, token, its logprob if asked)
    groups: list[GroupSample] = field(default_factory=list)
    failed: list[tuple[SequenceGroup, Exception]] = field(default_factory=list)
    spec: list = field(default_factory=list)  # speculative decoding: (Sequence, SpecOutcome) per verified sequence


@dataclass
class RequestDelta:
    """What one engine step gave one request (vLLM's ``RequestOutputKind.DELTA``).

    Attributes:
        texts: choice index (the sample index, 0..n-1) -> the text that step added to that choice,
            a true delta: joining a choice's texts over all deltas gives its final text.
        num_new_tokens: tokens the step added over all the request's sequences.
        finish_reasons: choice index -> finish reason ("stop", "length", "abort", "error") of the
            choices that finished this step.
        token_ids: choice index -> the token ids that step added to that choice (vLLM's
            ``return_token_ids`` stream deltas; several with speculative decoding).
        output: the request's final :class:`~engine.RequestOutput`, in its last delta; else None.
        error: the request failed ("TypeError: ..."): its own part of a step, or the whole step; else None.
    """

    texts: dict[int, str] = field(default_factory=dict)
    num_new_tokens: int = 0
    finish_reasons: dict[int, str] = field(default_factory=dict)
    output: RequestOutput | None = None
    error: str | None = None
    aborted: bool = False
    token_ids: dict[int, list[int]] = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        """The last delta of its request: it finished, failed or was aborted."""
        return self.output is not None or self.error is not None or self.aborted


class OutputProcessor:
    """The engine's requests from their sampled tokens to their outputs.

    Args:
        tokenizer: the model's tokenizer.
        scheduler: frees finished sequences and requests, and forks (``Scheduler.fork``).
        events: the engine's event log (FINISH events).
        eos_token_ids: tokens that end a sequence unless ``ignore_eos``.
        max_model_len: a sequence that reaches it stops ("length").

    Attributes:
        requests: request_id -> its :class:`~engine.core.sequence.SequenceGroup`, until its output
            is taken (:meth:`take_output`).
        detokenizer, texts: each sequence's text (``texts[seq_id]``).
        errors: request_id -> "TypeError: ..." of a request that failed (finish reason "error").
        next_seq_id: the id the next new sequence gets.
    """

    def __init__(self, tokenizer, scheduler: Scheduler, events: EventLog, eos_token_ids: set[int], max_model_len: int):
        self.tokenizer = tokenizer
        self.scheduler = scheduler
        self.events = events
        self.eos_token_ids = eos_token_ids
        self.max_model_len = max_model_len
        self.requests: dict[int, SequenceGroup] = {}
        self.prompt_texts: dict[int, str] = {}
        self.detokenizer = Detokenizer(tokenizer)  # incremental where exact (engine/detokenizer.py)
        self.texts: dict[int, str] = self.detokenizer.texts  # per seq_id
        self.errors: dict[int, str] = {}
        self.next_seq_id = 0

    # ---- requests in and out ----------------------------------------------------------------

    def add_request(self, group: SequenceGroup, prompt_text: str) -> None:
        """Keep a new request, whose one sequence has id :attr:`next_seq_id`."""
        self.next_seq_id += 1
        self.requests[group.request_id] = group
        self.prompt_texts[group.request_id] = prompt_text
        self.detokenizer.add(group.seqs[0].seq_id)

    def abort(self, group: SequenceGroup) -> None:
        """Finish ``group`` now with reason "abort"; its texts end where their streamed text ended."""
        self.scheduler.finish(group, "abort")
        self.events.emit(FINISH, group.request_id, detail="abort")
        self._release_seqs(group, truncate=True)

    def get_output(self, request_id: int) -> RequestOutput:
        """The request's output so far (final once ``finish_reason`` is set). KeyError if unknown."""
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
            num_cached_tokens=request.seqs[0].num_prefix_hit_tokens if request.seqs else 0,
            error=self.errors.get(request_id),
            prompt_text=self.prompt_texts[request_id],
            kv_transfer_params=request.kv_transfer_params,
        )

    def take_output(self, request_id: int) -> RequestOutput:
        """A finished request's final output, handed over once; the request is then forgotten.

        Raises:
            KeyError: an unknown request, or one whose output was already taken.
            ValueError: the request has not finished.
        """
        if request_id not in self.requests:
            raise KeyError(f"request {request_id}: unknown, or its output was already taken")
        request = self.requests[request_id]
        if request.status != SequenceStatus.FINISHED:
            raise ValueError(f"request {request_id} has not finished: its output can be taken once it has (or abort it)")
        output = self.get_output(request_id)
        del self.requests[request_id], self.prompt_texts[request_id]
        self.errors.pop(request_id, None)
        for seq in request.seqs:
            self.detokenizer.remove(seq.seq_id)
        return output

    def stream_deltas(self, report: StepReport) -> dict[int, RequestDelta]:
        """Per request that ``report``'s step touched, its :class:`RequestDelta`; a request that
        finished gets its final output in it, taken (:meth:`take_output`)."""
        deltas: dict[int, RequestDelta] = {}
        for request_id in set(report.seq_new_text) | set(report.seq_finished) | set(report.finished):
            request = self.requests.get(request_id)
            if request is None:
                continue
            index_of = {seq.seq_id: seq.index for seq in request.seqs}
            texts = report.seq_new_text.get(request_id, {})
            if request.is_single:  # speculative decoding may add several tokens in one step
                token_ids = {index_of[sid]: list(report.new_token_ids.get(request_id, [])) for sid in texts}
            else:  # one new token per sequence per step
                last_token = {seq.seq_id: seq.token_ids[-1] for seq in request.seqs if seq.token_ids}
                token_ids = {index_of[sid]: [last_token[sid]] for sid in texts if sid in last_token}
            delta = RequestDelta(
                texts={index_of[sid]: text for sid, text in texts.items()},
                num_new_tokens=sum(len(ids) for ids in token_ids.values()) if token_ids else len(texts),
                finish_reasons={index_of[sid]: reason for sid, reason in report.seq_finished.get(request_id, {}).items()},
                token_ids=token_ids,
            )
            if request_id in report.finished:
                delta.output = self.take_output(request_id)
                delta.error = delta.output.error
                for completion in delta.output.outputs:
                    delta.finish_reasons.setdefault(completion.index, completion.finish_reason)
            deltas[request_id] = delta
        return deltas

    @staticmethod
    def sharing(request: SequenceGroup) -> str:
        """How ``request``'s sequences share its prompt (``StepReport.sharing``)."""
        if request.is_single:
            return SHARING_NONE
        return SHARING_PARALLEL if request.beam_search is None else SHARING_BEAM

    def beam_text(self, token_ids: list[int]) -> str:
        """A beam's text: its tokens decoded, less a character left incomplete."""
        return complete_text(self.tokenizer.decode(token_ids, skip_special_tokens=True))

    # ---- one step ---------------------------------------------------------------------------

    def process(self, samples: Samples, out: StepOutputs) -> None:
        """Give every sampled sequence its token: text, stop rules, forks and beams, in batch
        order (one-sequence requests first, then groups). A request whose part fails fails alone."""
        for group, error in samples.failed:
            self.fail(group, error, out)
        for seq, token, logprob in samples.plain:
            self._guarded(seq.request_id, out, self._append, seq, token, logprob, out)
        for sample in samples.groups:
            if sample.error is not None:
                self.fail(sample.group, sample.error, out)
            else:
                self._guarded(sample.group.request_id, out, self._group_step, sample, out)

    def fail(self, request: SequenceGroup, error: Exception, out: StepOutputs) -> None:
        """Finish ``request`` with reason "error": free its blocks, log and report the error."""
        message = f"{type(error).__name__}: {error}"
        rid = request.request_id
        self.errors[rid] = message
        for seq in request.unfinished_seqs():
            out.seq_finished.setdefault(rid, {})[seq.seq_id] = "error"
        if request.status != SequenceStatus.FINISHED:
            self.scheduler.finish(request, "error")
        request.finish_reason = "error"
        self.events.emit(FINISH, rid, detail=f"error: {message}")
        out.finished[rid] = "error"
        out.errors[rid] = message
        self._release_seqs(request, truncate=True)

    def append_tokens(self, seq: Sequence, tokens: list[int], out: StepOutputs) -> bool:
        """Speculative decoding: give ``seq`` several tokens in one step, one after the other as
        :meth:`process` gives one; stops at the first that finishes it. Returns whether it still runs."""
        for token in tokens:
            self._append(seq, token, None, out)
            if seq.status is SequenceStatus.FINISHED:
                return False
        return True

    def guarded(self, request_id: int, out: StepOutputs, work: Callable, *args) -> None:
        """``work(*args)``: one request's part of the step; if it raises, that request fails alone."""
        self._guarded(request_id, out, work, *args)

    def _guarded(self, request_id: int, out: StepOutputs, work: Callable, *args) -> None:
        """``work(*args)``: one request's part of the step; if it raises, that request fails alone."""
        try:
            work(*args)
        except Exception as error:
            self.fail(self.requests[request_id], error, out)

    def _append(self, seq: Sequence, token: int, logprob: float | None, out: StepOutputs) -> None:
        """Give ``seq`` its sampled token and stream its new text; finish it (and its request, when
        that was the last) if a stopping rule says so. A request's first sequence speaks for it in
        the report's ``new_token_ids`` and ``new_text``; every sequence has its ``seq_new_text``."""
        seq.append_token(token, logprob)
        self._update_text(seq)
        reason = self._finish_reason(seq, token)
        delta = self.detokenizer.delta(seq.seq_id, 0 if reason else _stop_buffer(seq.sampling_params))
        texts = out.seq_new_text.setdefault(seq.request_id, {})
        texts[seq.seq_id] = texts.get(seq.seq_id, "") + delta  # several tokens a step with speculative decoding
        if seq.index == 0:
            out.new_token_ids.setdefault(seq.request_id, []).append(token)
            out.new_text[seq.request_id] = out.new_text.get(seq.request_id, "") + delta
        if not reason:
            return
        out.seq_finished.setdefault(seq.request_id, {})[seq.seq_id] = reason
        self.detokenizer.forget(seq.seq_id)
        request = self.requests[seq.request_id]
        if len(request.unfinished_seqs()) > 1:
            self.scheduler.finish_seq(seq, reason)
            return
        self._finish_request(request, reason, out)

    def _finish_request(self, request: SequenceGroup, reason: str, out: StepOutputs) -> None:
        for seq in request.unfinished_seqs():
            out.seq_finished.setdefault(request.request_id, {}).setdefault(seq.seq_id, reason)
        self.scheduler.finish(request, reason)
        self.events.emit(FINISH, request.request_id, detail=reason)
        out.finished[request.request_id] = reason
        self._release_seqs(request)

    def _release_seqs(self, request: SequenceGroup, truncate: bool = False) -> None:
        """A finished request's sequences need no stable point any more. ``truncate`` (abort,
        error): their texts end where their streamed text ended."""
        for seq in request.seqs:
            self.detokenizer.forget(seq.seq_id)
            if truncate and seq.seq_id in self.texts:
                self.texts[seq.seq_id] = self.texts[seq.seq_id][: self.detokenizer.emitted[seq.seq_id]]

    def _group_step(self, sample: GroupSample, out: StepOutputs) -> None:
        """A group's tokens for this step: a beam-search step, or parallel samples (forked first
        at the prompt's one prefill)."""
        group = sample.group
        if group.beam_search is not None:
            self._beam_step(group, sample.seqs, sample.logprobs, out)
            return
        if len(group.seqs) < group.num_samples:
            self._fork_samples(group)
        seq_of = {s.index: s for s in group.seqs}
        for index, token, logprob in sample.tokens:
            self._append(seq_of[index], token, logprob, out)

    def _fork_samples(self, group: SequenceGroup) -> None:
        """Parallel sampling after the one prefill of the prompt: samples 1..n-1 fork sample 0
        (its block table, every block's refcount + 1; paper §4.4, Figure 8) and its text."""
        parent = group.seqs[0]
        for child in fork_samples(group, self.scheduler.fork, self.new_seq_id):
            self.detokenizer.add(child.seq_id, like=parent.seq_id)

    def new_seq_id(self) -> int:
        self.next_seq_id += 1
        return self.next_seq_id - 1

    def _fork(self, parent: Sequence, index: int) -> Sequence:
        child = parent.fork(self.new_seq_id(), index)
        self.scheduler.fork(parent, child)
        self.detokenizer.add(child.seq_id, like=parent.seq_id)
        return child

    def _beam_step(self, group: SequenceGroup, beams: list[Sequence], logprobs: torch.Tensor, out: StepOutputs) -> None:
        """One beam-search step (``engine/core/beam_search.py`` decides): survivors fork their parents,
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
            out.new_text[rid] = self.beam_text(best)
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

    # ---- text, stop rules, completions ------------------------------------------------------

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

    def _completions(self, request: SequenceGroup) -> list[CompletionOutput]:
        if request.is_single:
            seq = request.seqs[0]
            if seq.sampling_params.logprobs is None:
                return [CompletionOutput(0, self.texts[seq.seq_id], seq.output_token_ids, request.finish_reason)]
            return [CompletionOutput(0, self.texts[seq.seq_id], seq.output_token_ids, request.finish_reason, seq.cumulative_logprob,
                                     list(seq.output_logprobs))]
        if request.beam_search is None:
            return [CompletionOutput(s.index, self.texts[s.seq_id], s.output_token_ids, s.finish_reason, s.cumulative_logprob,
                                     list(s.output_logprobs)) for s in sorted(request.seqs, key=lambda s: s.index)]
        beams = request.finished_beams or [  # still searching: the live beams, best first
            _LiveBeam(s.output_token_ids, s.cumulative_logprob) for s in request.unfinished_seqs()]
        reason = request.finish_reason
        return [CompletionOutput(i, self.beam_text(b.token_ids), b.token_ids, reason, b.cumulative_logprob)
                for i, b in enumerate(beams)]


def _stop_buffer(params: SamplingParams) -> int:
    """Characters held back while a sequence runs, so that no text a stop string will cut is
    streamed first (vLLM's ``stop_buffer_length``): the longest stop string's length - 1."""
    return max(map(len, params.stop), default=1) - 1


@dataclass(frozen=True)
class _LiveBeam:
    token_ids: list[int]
    cumulative_logprob: float
