"""``python -m engine bench``: the engine against transformers ``generate`` on one workload, one process.

Workload "mixed": ``num_prompts`` chat prompts whose max_tokens are spread evenly from ``min_tokens``
to ``max_tokens``, greedy, ignore_eos (so every request runs its full length). The engine batches
continuously: a request leaves the batch as soon as it is done. transformers generates the same
prompts as one left-padded static batch until the longest is done; each of its outputs is cut to
that request's max_tokens. Both count only the tokens asked for, so tokens/s compares like with like.
"""

from __future__ import annotations

import time

import numpy as np
import torch
import transformers

from engine.config import EngineConfig
from engine.llm import LLM
from engine.model_loader import resolve_model
from engine.sampling_params import SamplingParams

TOPICS = [
    "the water cycle", "how a CPU cache works", "the French revolution", "photosynthesis",
    "why the sky is blue", "a recipe for pancakes", "black holes", "the history of the bicycle",
    "how vaccines work", "the rules of chess", "volcanoes", "how a compiler works",
    "the Great Wall of China", "electric cars", "the stock market", "honey bees",
]


def mixed_workload(num_prompts: int, min_tokens: int, max_tokens: int) -> tuple[list[list[dict]], list[int]]:
    """Chat prompts and their max_tokens (evenly spread, in tokens)."""
    prompts = [[{"role": "user", "content": f"Tell me about {TOPICS[i % len(TOPICS)]}."}] for i in range(num_prompts)]
    lengths = np.linspace(min_tokens, max_tokens, num_prompts).round().astype(int).tolist()
    return prompts, lengths


def run_bench(model: str | None = None, num_prompts: int = 16, min_tokens: int = 8, max_tokens: int = 128, block_size: int = 16, seed: int = 0) -> dict:
    """Run the workload through both, fp32 on CPU (bf16 on CUDA); returns the figures as a dict.

    Keys: engine_tokens_per_s, hf_tokens_per_s, ratio (engine / hf), outputs_identical, mismatches
    (request, first differing position, top-2 logit margin there), engine_seconds, hf_seconds, tokens.
    """
    torch.manual_seed(seed)
    prompts, lengths = mixed_workload(num_prompts, min_tokens, max_tokens)
    llm = LLM(model, block_size=block_size, seed=seed, max_num_seqs=num_prompts)
    engine = llm.engine
    prompt_ids = [engine.encode(p) for p in prompts]
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in lengths]
    # Warm-up on the full batch, as for transformers below: the first steps of a process pay for
    # fresh memory pages (the allocator has not settled yet), which is not what we measure.
    llm.generate(prompt_ids, SamplingParams(max_tokens=4, ignore_eos=True))
    t0 = time.perf_counter()
    outputs = llm.generate(prompt_ids, params)
    engine_s = time.perf_counter() - t0

    hf = transformers.AutoModelForCausalLM.from_pretrained(resolve_model(model), dtype=engine.dtype).to(engine.device).eval()
    hf_outputs, hf_s = _hf_generate(hf, engine.tokenizer, prompt_ids, max(lengths), engine.device)
    mismatches = []
    for i, (out, n) in enumerate(zip(outputs, lengths)):
        theirs = hf_outputs[i][:n]
        if out.token_ids != theirs:
            pos = next(j for j, (a, b) in enumerate(zip(out.token_ids, theirs)) if a != b)
            margin = _top2_margin(hf, prompt_ids[i] + out.token_ids[:pos], engine.device)
            mismatches.append({"request": i, "position": pos, "top2_logit_margin": margin})
    tokens = sum(lengths)
    return {
        "workload": "mixed", "num_prompts": num_prompts, "tokens": tokens, "device": str(engine.device),
        "dtype": str(engine.dtype).replace("torch.", ""),
        "engine_seconds": engine_s, "hf_seconds": hf_s,
        "engine_tokens_per_s": tokens / engine_s, "hf_tokens_per_s": tokens / hf_s,
        "ratio": hf_s / engine_s, "outputs_identical": not mismatches, "mismatches": mismatches,
    }


@torch.inference_mode()
def _hf_generate(hf, tokenizer, prompt_ids: list[list[int]], max_new: int, device) -> tuple[list[list[int]], float]:
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    width = max(len(p) for p in prompt_ids)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompt_ids], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompt_ids], device=device)
    # No EOS at all (ignore_eos): passing eos_token_id=None would fall back to the model's default.
    hf.generation_config.eos_token_id = None
    kwargs = dict(do_sample=False, pad_token_id=pad, temperature=None, top_p=None, top_k=None)
    hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=4, **kwargs)  # warm-up, as for the engine
    t0 = time.perf_counter()
    out = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new, **kwargs)
    seconds = time.perf_counter() - t0
    return out[:, width:].tolist(), seconds


@torch.inference_mode()
def _top2_margin(hf, ids: list[int], device) -> float:
    logits = hf(torch.tensor([ids], device=device)).logits[0, -1].float()
    top = torch.topk(logits, 2).values
    return float(top[0] - top[1])


def format_result(r: dict) -> str:
    lines = [
        f"workload mixed: {r['num_prompts']} chat prompts, {r['tokens']} generated tokens, greedy, ignore_eos, {r['dtype']} on {r['device']}",
        f"engine (continuous batching, paged KV): {r['engine_seconds']:.2f} s  {r['engine_tokens_per_s']:.1f} tokens/s",
        f"transformers generate (static batch):   {r['hf_seconds']:.2f} s  {r['hf_tokens_per_s']:.1f} tokens/s",
        f"ratio engine/transformers: {r['ratio']:.2f}x   outputs identical: {r['outputs_identical']}",
    ]
    for m in r["mismatches"]:
        lines.append(f"  request {m['request']}: first difference at token {m['position']}, top-2 logit margin {m['top2_logit_margin']:.4g}")
    return "\n".join(lines)
