"""What one scheduler step hands the model runner: the batch and the block copies to run first
(vLLM v1's ``vllm/v1/core/sched/output.py``, v0's ``SchedulerOutputs``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.core.sequence import Sequence, SequenceGroup
from engine.report import ScheduledRequest


@dataclass
class SchedulerOutput:
    """One step's batch: prefills (whole prompts, or chunks of them) then decodes (one token each).

    Attributes:
        prefill_seqs: sequences prefilling this step; each computes ``num_tokens_of(seq)`` tokens.
        decode_seqs: running sequences computing their one newest token.
        preempted: requests (groups) preempted this step, by recompute or swap, in order.
        blocks_to_copy: copy-on-write ``(src, dst)`` block pairs (attention blocks) to copy before
            the forward pass, in order (vLLM's ``blocks_to_copy``).
        num_scheduled_tokens: seq_id -> tokens a prefill computes this step (vLLM v1's name): its
            whole remaining prompt, or a chunk with chunked prefill.
        swapped_out, swapped_in: requests swapped out to / back in from the CPU pool this step.
        blocks_to_swap_out: ``(gpu_block, cpu_block)`` copies to run first, before any other copy
            or write of the step; blocks_to_swap_in: ``(cpu_block, gpu_block)`` copies, next.
        waiting: the waiting queue after scheduling, head first: request id -> why it was not
            admitted (``engine.report.WAIT_REASONS``).
        admissions: scheduling_policy "lpm": ``(request id, reason, cached prompt tokens)`` of each
            request admitted this step, in order (reasons: ``engine/core/scheduling_policy.py``).
        passed_over: "lpm": each waiting request a later arrival was admitted before this step -> that
            request's id (``waiting`` says WAIT_LPM_PASSED_OVER).
        admission_reasons: "lpm": the order's reason for each waiting request it looked at; None
            under FCFS.
        kv_offload_out, kv_offload_in: the prefix cache's CPU tier (``engine/core/kv_offload.py``):
            ``(gpu_block, cpu_block)`` copies of evicted cached blocks, run with the swap-outs, and
            ``(cpu_block, gpu_block)`` loads of CPU hits, run with the swap-ins.
        kv_connector_metadata: with a KV connector, what its worker side must move this step (a
            ``engine.kv_transfer.base.KVConnectorMetadata``; vLLM's ``SchedulerOutput.kv_connector_metadata``).
    """

    prefill_seqs: list[Sequence] = field(default_factory=list)
    decode_seqs: list[Sequence] = field(default_factory=list)
    preempted: list[SequenceGroup] = field(default_factory=list)
    blocks_to_copy: list[tuple[int, int]] = field(default_factory=list)
    num_scheduled_tokens: dict[int, int] = field(default_factory=dict)
    swapped_out: list[SequenceGroup] = field(default_factory=list)
    swapped_in: list[SequenceGroup] = field(default_factory=list)
    blocks_to_swap_out: list[tuple[int, int]] = field(default_factory=list)
    blocks_to_swap_in: list[tuple[int, int]] = field(default_factory=list)
    waiting: dict[int, str] = field(default_factory=dict)
    admissions: list[tuple[int, str, int]] = field(default_factory=list)
    admission_reasons: dict[int, tuple[str, int]] | None = None
    passed_over: dict[int, int] = field(default_factory=dict)
    kv_offload_out: list[tuple[int, int]] = field(default_factory=list)
    kv_offload_in: list[tuple[int, int]] = field(default_factory=list)
    kv_connector_metadata: object | None = None  # typed loosely: the connector sits above core

    @property
    def is_empty(self) -> bool:
        return not self.prefill_seqs and not self.decode_seqs

    @property
    def phase(self) -> str:
        if self.prefill_seqs and self.decode_seqs:
            return "mixed"
        return "prefill" if self.prefill_seqs else "decode" if self.decode_seqs else "idle"

    def num_tokens_of(self, seq: Sequence) -> int:
        """Tokens ``seq`` computes this step (before :meth:`Scheduler.update_from_output`)."""
        return self.num_scheduled_tokens.get(seq.seq_id, seq.num_new_tokens)

    def scheduled_requests(self, drafts: dict[int, int] | None = None) -> list[ScheduledRequest]:
        """Each scheduled sequence's share of the step, as a StepReport shows it (call it before
        :meth:`Scheduler.update_from_output`: it reads what was computed before the step): the query
        tokens the forward pass computed for it. ``drafts``: seq_id -> the draft tokens a speculating
        sequence was verified over this step; its decode computes its newest token and those drafts,
        1 + drafts query tokens, its last one attending to ``num_tokens + drafts``."""
        drafts = drafts or {}
        scheduled = []
        for s in self.prefill_seqs:
            n = self.num_tokens_of(s)
            scheduled.append(ScheduledRequest(s.request_id, "prefill", n, s.num_computed_tokens + n, s.num_computed_tokens + n, s.num_tokens))
        for s in self.decode_seqs:
            k = drafts.get(s.seq_id, 0)
            scheduled.append(ScheduledRequest(s.request_id, "decode", 1 + k, s.num_tokens + k, s.num_tokens))
        return scheduled
