"""Small helpers the lab tests share: requests and a scheduler on the engine's own classes, no model."""

from __future__ import annotations

from engine.core.block_manager import PagedBlockManager
from engine.core.scheduler import Scheduler
from engine.core.sequence import Sequence, SequenceGroup


def request(request_id: int, num_prompt_tokens: int, max_new: int = 16) -> SequenceGroup:
    """A one-sequence request whose prompt is ``num_prompt_tokens`` distinct token ids."""
    seq = Sequence(request_id, num_prompt_tokens, num_prompt_tokens + max_new,
                   token_ids=[1000 * (request_id + 1) + i for i in range(num_prompt_tokens)])
    return SequenceGroup(request_id, [seq])


def scheduler(num_blocks: int, block_size: int, max_num_seqs: int = 8, max_num_batched_tokens: int = 64, **kw) -> Scheduler:
    manager_kw = {k: kw.pop(k) for k in ("num_cpu_blocks", "enable_caching") if k in kw}
    kv = PagedBlockManager(num_blocks, block_size, watermark=0.0, **manager_kw)
    return Scheduler(kv, max_num_seqs, max_num_batched_tokens, **kw)


def step(sched: Scheduler):
    """One scheduler step without a model: schedule, mark computed, sample a token for the ready sequences."""
    out = sched.schedule()
    for seq in sched.update_from_output(out):
        seq.append_token(7)
    return out
