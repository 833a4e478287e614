"""One request as the scheduler and the KV allocators see it (vLLM's ``Sequence``)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from engine.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    """A request's tokens and its place in the KV cache.

    Lengths are kept as counts so that the model-free simulator can run the same scheduler and
    allocators on 100,000 requests without holding their token ids; the engine also keeps
    ``token_ids``.

    Attributes:
        request_id: the engine's id for it.
        num_prompt_tokens: tokens in the prompt.
        num_tokens: prompt + output tokens so far (tokens).
        num_computed_tokens: tokens whose K and V are in the cache. After a step the newest sampled
            token is not yet cached: decode computes it next step. Preemption by recompute resets it to 0.
        max_len: the longest this request can become (prompt + max_tokens, capped at max_model_len), or
            exactly prompt + output length when it is known (the simulator, the oracle reservation).
        block_table: physical block ids, one per logical block (paged allocator).
        token_ids: prompt then output token ids (engine only; empty in the simulator).
    """

    request_id: int
    num_prompt_tokens: int
    max_len: int
    sampling_params: SamplingParams = field(default_factory=SamplingParams)
    token_ids: list[int] = field(default_factory=list)
    arrival_time: float = 0.0
    status: SequenceStatus = SequenceStatus.WAITING
    num_tokens: int = 0
    num_computed_tokens: int = 0
    block_table: list[int] = field(default_factory=list)
    num_preemptions: int = 0
    finish_reason: str | None = None

    def __post_init__(self) -> None:
        if self.num_tokens == 0:
            self.num_tokens = self.num_prompt_tokens

    @property
    def num_output_tokens(self) -> int:
        return self.num_tokens - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_new_tokens(self) -> int:
        """Tokens the next step must compute: the whole (re)prompt at prefill, 1 at decode."""
        return self.num_tokens - self.num_computed_tokens

    def append_token(self, token_id: int | None = None) -> None:
        if token_id is not None:
            self.token_ids.append(token_id)
        self.num_tokens += 1
