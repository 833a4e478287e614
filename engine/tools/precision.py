"""How far a lower-precision run's greedy tokens stay with float32's (``python -m engine bench --dtype bfloat16``).

bfloat16 keeps 8 significant bits, so a bf16 run and an fp32 run of the same model round differently
and their greedy tokens may part where two logits are close. That is expected at a near-tie and a bug
anywhere else, so for each request this reports how many tokens agree before the first difference and,
there, the fp32 model's top-2 logit margin (a margin of a few hundredths: a near-tie).
float32 stays the engine's default and the reference.
"""

from __future__ import annotations

import torch

from engine.llm import LLM
from engine.sampling_params import SamplingParams


def fp32_agreement(
    model: str | None, prompt_ids: list[list[int]], params: list[SamplingParams], outputs: list[list[int]], hf_fp32, **engine_config
) -> dict:
    """Run the same requests in float32 through a second engine and compare greedy tokens.

    Args:
        model: the model of the run being checked.
        prompt_ids: each request's prompt token ids.
        params: each request's sampling params (greedy).
        outputs: the checked run's token ids per request.
        hf_fp32: the transformers model in float32, for the logit margins.
        engine_config: the rest of the checked engine's :class:`engine.EngineConfig` (dtype excepted).

    Returns:
        ``{"tokens", "agreeing_tokens" (before each request's first difference, summed), "agreement"
        (their share), "identical_requests", "divergences": [{"request", "position", "fp32_top2_margin"}]}``.
    """
    llm = LLM(model, dtype="float32", **engine_config)
    reference = [o.token_ids for o in llm.generate(prompt_ids, params)]
    del llm
    agreeing, divergences = 0, []
    for i, (ours, theirs) in enumerate(zip(outputs, reference)):
        pos = next((j for j, (a, b) in enumerate(zip(ours, theirs)) if a != b), len(theirs))
        agreeing += pos
        if pos < len(theirs):
            divergences.append({"request": i, "position": pos, "fp32_top2_margin": top2_margin(hf_fp32, prompt_ids[i] + theirs[:pos])})
    tokens = sum(len(t) for t in reference)
    return {
        "tokens": tokens, "agreeing_tokens": agreeing, "agreement": agreeing / tokens if tokens else 1.0,
        "identical_requests": len(reference) - len(divergences), "divergences": divergences,
    }


@torch.inference_mode()
def top2_margin(hf, ids: list[int]) -> float:
    """The gap between the largest and second-largest next-token logit after ``ids`` (transformers model)."""
    device = next(hf.parameters()).device
    logits = hf(torch.tensor([ids], device=device)).logits[0, -1].float()
    top = torch.topk(logits, 2).values
    return float(top[0] - top[1])


def format_agreement(report: dict, dtype: str) -> str:
    """One line for the totals, one per request that parted from fp32."""
    lines = [
        f"{dtype} vs float32 greedy tokens: {100 * report['agreement']:.1f}% agree up to each request's first difference "
        f"({report['agreeing_tokens']}/{report['tokens']} tokens; {report['identical_requests']} requests identical)"
    ]
    for d in report["divergences"]:
        lines.append(f"  request {d['request']}: first difference at token {d['position']}, fp32 top-2 logit margin {d['fp32_top2_margin']:.4g}")
    return "\n".join(lines)
