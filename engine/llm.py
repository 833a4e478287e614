"""The one-call interface: ``LLM().generate(prompts)`` runs the engine until every request finishes (vLLM's ``LLM``)."""

from __future__ import annotations

from typing import Callable

from tqdm.auto import tqdm

from engine.config import EngineConfig
from engine.llm_engine import LLMEngine, Prompt
from engine.report import RequestOutput, StepReport
from engine.sampling_params import BeamSearchParams, SamplingParams


class LLM:
    """Offline batched generation.

    Args:
        model: as ``EngineConfig.model`` (None = the default SmolLM2-135M-Instruct).
        **config: any other :class:`~engine.EngineConfig` field (block_size, num_gpu_blocks, ...).
    """

    def __init__(self, model: str | None = None, **config):
        self.engine = LLMEngine(EngineConfig(model=model, **config))

    def generate(
        self,
        prompts: Prompt | list[Prompt],
        sampling_params: SamplingParams | BeamSearchParams | list[SamplingParams] | None = None,
        use_tqdm: bool = False,
        on_step: Callable[[StepReport], None] | None = None,
    ) -> list[RequestOutput]:
        """Generate for every prompt; outputs come back in the order of ``prompts``.

        Args:
            prompts: one prompt or a list (a prompt is text, chat messages, or token ids).
            sampling_params: one for all, or one per prompt.
            use_tqdm: show a progress bar over finished requests.
            on_step: called with each step's report.

        Returns:
            One :class:`~engine.RequestOutput` per prompt; a request that failed on its own has
            ``finish_reason`` "error" and its ``error``. The engine keeps nothing of them after.

        Raises:
            ValueError: a bad prompt or one that can never fit; no request of this call stays queued.
        """
        prompts = _as_list(prompts)
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"{len(params)} sampling_params for {len(prompts)} prompts")
        ids = []
        try:
            for prompt, p in zip(prompts, params):
                ids.append(self.engine.add_request(prompt, p))
        except Exception:
            for request_id in ids:
                self.engine.abort_request(request_id)
                self.engine.take_output(request_id)
            raise
        try:
            with tqdm(total=len(ids), disable=not use_tqdm, desc="requests") as bar:
                while any(self.engine.requests[i].finish_reason is None for i in ids):
                    report = self.engine.step()
                    bar.update(len(report.finished))
                    if on_step:
                        on_step(report)
        except BaseException:
            for request_id in ids:  # a failed step (or Ctrl-C): this call's requests leave the engine too
                self.engine.abort_request(request_id)
                self.engine.take_output(request_id)
            raise
        # Taken, not only read: the engine then holds nothing for them (vLLM's LLM.generate).
        return [self.engine.take_output(i) for i in ids]

    def beam_search(self, prompts: Prompt | list[Prompt], params: BeamSearchParams, on_step: Callable[[StepReport], None] | None = None) -> list[RequestOutput]:
        """Beam search inside the engine (vLLM's ``LLM.beam_search``): one output per prompt, whose
        ``.sequences`` are its ``beam_width`` beams best first, each with ``token_ids``, ``text`` and
        ``cumulative_logprob``. The beams share blocks through forks (paper §4.4, Figure 9).

        Raises:
            ValueError: bad params, a bad prompt, or beams that could never fit in the KV pool.
        """
        if not isinstance(params, BeamSearchParams):
            raise ValueError("params must be a BeamSearchParams")
        return self.generate(prompts, params, on_step=on_step)


def _as_list(prompts) -> list:
    if not isinstance(prompts, (str, list, tuple)) or not prompts:
        raise ValueError("prompts must be a prompt or a non-empty list of prompts")
    if isinstance(prompts, str):
        return [prompts]
    if isinstance(prompts, list) and prompts and isinstance(prompts[0], (dict, int)):
        return [prompts]  # one chat conversation or one list of token ids
    return list(prompts)
