"""Lab open_scheduler: Open lab: a scheduling policy of your own / 开放实验：自己设计的调度策略.

Design the order in which waiting requests are offered admission (order_waiting, the scheduler's
policy hook, as vLLM's --scheduler-cls). The simulator runs it on a fixed trace: beat FCFS's TTFT
p90 by 10% while keeping 95% of its throughput; grade prints your place against FCFS and the model
answer.

设计等待中的请求获得准入机会的顺序（order_waiting，调度器的策略接口，类似 vLLM 的 --scheduler-cls）。模拟器在固定的请求轨迹上运行它：TTFT p90 要比先来先服务低 10%，同时保持其 95% 的吞吐量；grade 会打印你的策略相对先来先服务与参考答案的名次。

Your part plugs into the engine in place of its own, in engine/core/scheduler.py (the engine module's names are in
scope here). Grade it in your copy of the starters (labs/README.md), where the labs build on
each other:

    python -m lessons grade open_scheduler --impl labs/mine

Cut by `python -m lessons labs build` from engine/core/scheduler.py; work on a copy.

The module engine/core/scheduler.py, for context:

Iteration-level scheduling: which requests run in the next step, and who is preempted.

Continuous batching (Orca's iteration-level scheduling, vLLM's scheduler): every step, each running
request decodes one token and, if no one had to be preempted, waiting requests are admitted first
come, first served, with their whole prompt as a prefill in the same batch. When the pool cannot
give a running request its next slot, the most recently admitted request is preempted (PagedAttention
paper §4.5), in one of two ways:

- *recompute* (the default): its blocks are freed and it goes back to the front of the waiting
  queue, to be prefilled again later with its prompt and the tokens it had produced;
- *swap*: its blocks are copied to the CPU swap space and it waits in the ``swapped`` queue. While
  any request is swapped out no new request is admitted, and swapped requests come back (their
  blocks copied in again) before waiting ones; when the CPU pool is full it falls back to recompute.

With *chunked prefill* (vLLM's ``enable_chunked_prefill``) each step spends one token budget,
``max_num_batched_tokens``: running decodes first, then the prompt that did not fit last step (a
partial prefill), then new requests, whose prompts may be cut into chunks. A long prompt then
spans several steps and no longer stalls every decode.

Which part of the batch comes first is ``schedule_first``, the one place where vLLM's two schedulers differ:

- ``"decodes"``: running requests decode first and waiting prompts join the same step within the
  token budget those decodes leave. This is vLLM v1's scheduler, v0's with chunked prefill, and
  also the scheduler of the paper's own prototype and of vLLM 0.1 (2023: decodes reserved their
  slots first, then prompts were admitted while ``running + prompt tokens <= max_num_batched_tokens``,
  2,560 by default). Without chunked prefill, and with a budget under ``max_model_len +
  max_num_seqs``, a long prompt at the head of the queue can wait until enough running requests
  have finished for it to fit beside their decodes (head-of-line blocking), however much memory
  is free.
- ``"prefills"`` (vLLM v0's default scheduler from 0.2 on, without chunked prefill): while no
  request is swapped out, waiting prompts are admitted first with the whole token budget, and a
  step that admits any runs prefills only; the running requests decode in the next step without
  one. Whole prompts only: vLLM v0's chunked prefill put decodes first.

The unit of scheduling is the *sequence group* (a request and all its sequences, ``engine/core/sequence.py``):
a group's sequences decode together, a preemption frees or swaps all of them, and it is finished as
a whole. Every request is one, whether it holds one sequence or several (the simulator's lock-step
path alone schedules a bare ``Sequence``, which answers the same interface).

With a KV connector (prefill/decode disaggregation, vLLM v1's ``KVConnector``; ``engine/kv_transfer/``)
the scheduler asks it at admission how many prompt tokens another engine computed. Such a request gets
its blocks and waits in ``waiting_for_remote_kvs`` (``WAITING_FOR_REMOTE_KVS``) while the workers read
the KV into them; once read, it is admitted before the waiting queue with one prompt token left to
compute (the last one, whose logits choose its first token). A load that fails is recomputed: the
request goes back to the head of the queue and prefills its prompt itself. On the prefill side a
finished request's blocks may outlive it, lent under a lease until its decode instance has read them.
In the push order (SGLang's) a prefill request first waits in ``bootstrapping``, outside the queue and
holding no block, until its decode instance has reserved blocks for its KV.

The scheduler knows nothing of models or tensors: the engine runs it on a real model and the
simulator runs the very same code on lengths alone (its lock-step fast path, for one-sequence
requests under recompute without chunking, wraps it: ``engine/sim/lockstep.py``).
"""

from __future__ import annotations
import bisect
from collections import deque
from typing import TYPE_CHECKING
from engine.config import PREEMPTION_MODES, check_schedule_first
from engine.core.kv_cache_manager import KVCacheManager
from engine.core.prefix_cache import PrefixCacheStats
from engine.core.scheduler_output import SchedulerOutput
from engine.core.scheduling_policy import LONGEST_PREFIX, lpm_order
from engine.report import (PREEMPT, PREEMPTED_BY_RECOMPUTE, PREEMPTED_BY_SWAP, RECOMPUTE_CPU_POOL_FULL, RECOMPUTE_PARTIAL_PREFILL,
                           WAIT_BUDGET, WAIT_LPM_PASSED_OVER, WAIT_MAX_NUM_SEQS, WAIT_NO_FREE_BLOCK, WAIT_PREEMPTION, WAIT_QUEUE,
                           WAIT_SWAPPED)
from engine.core.sequence import Sequence, SequenceGroup, SequenceStatus

LAB = "open_scheduler"  # the lab whose parts this file holds


class ShortestPromptFirstScheduler:
    """A policy beside first come, first served: requests preempted while running come back
    first, then the shortest prompt first (shortest job first on the part a scheduler knows; the
    open lab's model answer, measured against FCFS on TTFT p90 and throughput by the simulator)."""

    def order_waiting(self, waiting: list[SequenceGroup]) -> list[SequenceGroup]:
        """Preempted requests first (they held memory and made progress), then the shortest
        prompt (``seqs[0].num_tokens``, tokens to prefill), ties by arrival."""
        # TODO(open_scheduler): write this part (see the docstring and labs/README.md)
        raise NotImplementedError("lab open_scheduler: ShortestPromptFirstScheduler.order_waiting")
