"""The lab's engine beside real vLLM: the same requests through both, outputs and schedulers compared.

Two uses, one vLLM subprocess each (:class:`~engine.vllm_bridge.process.VLLMProcess`):

* ``python -m engine bench --against vllm``: a third column in the bench (:class:`VLLMBenchSide`);
* ``python -m engine replay --against vllm WORKLOAD.json``: one saved workload (engine/runfile.py's
  format) through both, step counts, preemptions, KV usage and prefix-cache hits side by side
  (:func:`run_replay`), every difference explained by :data:`KNOWN_DIFFERENCES`.

The comparison itself (:func:`compare_outputs`, :func:`engine_metrics`, :func:`compare_replay`)
works on plain data, so it is tested on recorded vLLM results without vLLM.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

VLLM_BLOCK_MULTIPLE = 32  # vLLM's CPU attention: "No common block size for 16 (CPU_ATTN: [MultipleOf(32)])"
VLLM_BENCH_BLOCK_SIZE = 32
KV_CACHE_GIB = 1.0


@dataclass(frozen=True)
class KnownDifference:
    """One way the two schedulers (or their settings) differ, and the test that pins it."""

    key: str
    text: str
    test: str


KNOWN_DIFFERENCES = (
    KnownDifference(
        "null_block",
        "vLLM keeps block 0 of its pool as a null block, so N blocks give N - 1 usable ones: the replay "
        "gives vLLM num_gpu_blocks + 1 so that both pools hold the same blocks.",
        "tests/test_vllm_compare.py::test_vllm_pool_has_one_more_block_for_its_null_block",
    ),
    KnownDifference(
        "block_size",
        "vLLM's CPU attention takes block sizes that are multiples of 32 only; a workload saved with "
        "another block_size is replayed at 32 on both sides, with the pool's slots kept.",
        "tests/test_vllm_compare.py::test_block_size_16_is_replayed_at_32_with_the_same_slots",
    ),
    KnownDifference(
        "chunked_prefill",
        "Both split prompts over steps under one token budget, in different orders: the engine "
        "schedules running decodes first, then the partial prefill, then new prompts (vLLM v0's "
        "order); vLLM v1 walks its running requests in admission order and then the waiting ones. "
        "The replay turns chunking off on both sides; with --chunked-prefill, step counts and "
        "preemptions may differ.",
        "tests/test_vllm_compare.py::test_chunked_prefill_orders_differ",
    ),
    KnownDifference(
        "prefix_caching",
        "Both reuse cached blocks (automatic prefix caching) with --prefix-caching; a re-prefill after a "
        "preemption hits its own blocks, and admission counts hits against the free blocks in each "
        "system's own way, so steps and preemptions may differ where blocks are evicted.",
        "tests/test_vllm_compare.py::test_prefix_caching_runs_on_both_sides",
    ),
    KnownDifference(
        "same_step_hits",
        "vLLM caches a prompt's full blocks as it allocates them, so a request scheduled in the same step as "
        "another with the same prefix already hits those blocks (their KV is written in the same forward pass, "
        "before attention reads it); the lab caches a block once its KV is computed, so requests admitted "
        "together each compute the shared prefix, and hold their own copies of it while they run.",
        "tests/test_vllm_compare.py::test_prefix_cache_hits_equal_vllms_but_within_one_step",
    ),
    KnownDifference(
        "sampling",
        "With temperature > 0 the two draw from different random generators, so outputs are not "
        "expected to match; only greedy (temperature 0) outputs are compared token for token.",
        "tests/test_vllm_compare.py::test_sampled_outputs_are_not_expected_to_match",
    ),
    KnownDifference(
        "numerics",
        "Both run float32 with different kernels (vLLM: torch.compile and its CPU attention), so a "
        "greedy token can differ where the top two logits are almost equal; the first difference is "
        "shown with the logit margin there.",
        "tests/test_vllm_compare.py::test_first_difference_and_margin_are_reported",
    ),
)


def known_difference(key: str) -> KnownDifference:
    return next(d for d in KNOWN_DIFFERENCES if d.key == key)


# ---- outputs ------------------------------------------------------------------------------------


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first position where two token lists differ (a length difference counts), or None."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare_outputs(
    engine_ids: list[list[int]], vllm_ids: list[list[int]],
    margin: Callable[[int, int], float] | None = None,
) -> dict:
    """Token-for-token comparison of two runs' outputs, request by request.

    Args:
        engine_ids, vllm_ids: generated token ids per request, in request order.
        margin: ``(request, position) -> top-2 logit margin`` at the first difference (the
            engine's prefix), computed only for the requests that differ.

    Returns:
        {"num_requests", "num_identical", "identical" (bool), "first_differences": [{"request",
        "position", "engine_token", "vllm_token", "top2_logit_margin"}]} (tokens None past an end).

    Raises:
        ValueError: the runs hold different numbers of requests.
    """
    if len(engine_ids) != len(vllm_ids):
        raise ValueError(f"{len(engine_ids)} engine outputs but {len(vllm_ids)} vLLM outputs")
    differences = []
    for request, (ours, theirs) in enumerate(zip(engine_ids, vllm_ids)):
        pos = first_difference(ours, theirs)
        if pos is None:
            continue
        differences.append({
            "request": request, "position": pos,
            "engine_token": ours[pos] if pos < len(ours) else None,
            "vllm_token": theirs[pos] if pos < len(theirs) else None,
            "top2_logit_margin": margin(request, pos) if margin else None,
        })
    n = len(engine_ids)
    return {"num_requests": n, "num_identical": n - len(differences), "identical": not differences, "first_differences": differences}


# ---- the bench's third column ---------------------------------------------------------------------


class VLLMBenchSide:
    """vLLM as the bench's third side: the bench workload's token ids, greedy, ignore_eos.

    Args:
        python: an interpreter that imports vLLM.
        model_dir: the engine's resolved HF directory (vLLM reads the same files, offline).
        prompt_ids, lengths: the workload's prompt token ids and max_tokens per request.
        block_size: vLLM's block size (a multiple of 32 on CPU).
        num_slots: KV pool in token slots, the engine's; vLLM gets as many plus its null block.
        max_num_seqs, max_num_batched_tokens, max_model_len, dtype: the engine's.
        enable_prefix_caching: vLLM's automatic prefix caching, as the engine's side has it (the bench's ``prefix_caching``).

    vLLM starts loading at once (in its own process), so the engine and transformers load meanwhile.
    """

    def __init__(self, python, model_dir, prompt_ids, lengths, block_size, num_slots, max_num_seqs, max_num_batched_tokens, max_model_len, dtype="float32",
                 enable_prefix_caching=False):
        from engine.vllm_bridge.process import VLLMProcess

        requests = [{"prompt_token_ids": p, "max_tokens": n, "ignore_eos": True} for p, n in zip(prompt_ids, lengths)]
        self.block_size, self.num_requests = block_size, len(requests)
        self.process = VLLMProcess(python, {
            "model": str(model_dir), "dtype": dtype, "block_size": block_size,
            "num_gpu_blocks": math.ceil(num_slots / block_size) + 1, "max_num_seqs": max_num_seqs,
            "max_num_batched_tokens": max_num_batched_tokens, "max_model_len": max_model_len,
            "enable_prefix_caching": enable_prefix_caching, "requests": requests,
        }, KV_CACHE_GIB)
        self.runs_s: list[float] = []
        self.token_ids: list[list[int]] = []

    def warm_up(self, max_tokens: int = 4) -> None:
        """Wait for vLLM to load, then one short run of every prompt (not measured)."""
        self.process.wait_ready()
        self.process.generate([max_tokens] * self.num_requests)

    def run(self) -> float:
        """One measured run of the whole workload; seconds."""
        reply = self.process.generate()
        self.runs_s.append(reply["seconds"])
        self.token_ids = reply["token_ids"]
        return reply["seconds"]

    def figures(self, tokens: int, engine_runs_s: list[float], engine_ids: list[list[int]], margin) -> dict:
        """The bench's vLLM keys: vllm_tokens_per_s, engine_vllm_ratio (engine tokens/s / vLLM's, i.e.
        median vLLM seconds / median engine seconds), vllm_outputs_identical, vllm_mismatches,
        vllm_seconds, vllm_runs_s, vllm_ratios (per repeat), vllm_block_size, vllm_version."""
        vllm_s, engine_s = statistics.median(self.runs_s), statistics.median(engine_runs_s)
        outputs = compare_outputs(engine_ids, self.token_ids, margin)
        return {
            "vllm_version": self.process.ready["vllm_version"], "vllm_block_size": self.block_size,
            "vllm_seconds": vllm_s, "vllm_runs_s": list(self.runs_s), "vllm_tokens_per_s": tokens / vllm_s,
            "engine_vllm_ratio": vllm_s / engine_s, "vllm_ratios": [v / e for e, v in zip(engine_runs_s, self.runs_s)],
            "vllm_outputs_identical": outputs["identical"], "vllm_mismatches": outputs["first_differences"],
        }

    def close(self) -> None:
        self.process.close()


def vllm_min_blocks(engine, block_size: int, max_num_batched_tokens: int | None = None, max_model_len: int | None = None) -> int:
    """The fewest pool blocks vLLM starts with for the engine's model: one request of ``max_model_len``
    tokens must fit (vLLM's ``check_enough_kv_cache_memory``), its null block included.

    Per KV cache group (vLLM's ``max_memory_usage_bytes``): a full-attention group
    ``ceil(max_model_len / block_size)`` blocks; a sliding-window group the window less one plus a step's
    token budget, at most ``max_model_len``, in blocks, plus one (the window need not start on a block).
    The lab's own rule (``SlidingWindowSpec``) counts one block, not a step's budget, so a hybrid model
    such as Gemma 3 can start the lab's engine on a pool smaller than vLLM accepts.

    Args:
        engine: the lab's ``LLMEngine`` (its ``kv_cache_spec`` and ``max_model_len``).
        block_size: vLLM's block size in tokens (a multiple of 32 on its CPU build).
        max_num_batched_tokens: vLLM's token budget per step (default: the engine's).
        max_model_len: vLLM's longest request in tokens (default: the engine's).
    """
    from engine.core.kv_cache_interface import SLIDING_WINDOW, get_kv_cache_groups

    budget = max_num_batched_tokens or engine.scheduler.max_num_batched_tokens
    length = max_model_len or engine.max_model_len
    blocks = 0
    for group in get_kv_cache_groups(engine.kv_cache_spec):
        spec = group.kv_cache_spec
        if spec.attention_type == SLIDING_WINDOW:
            blocks += math.ceil(min(spec.sliding_window - 1 + budget, length) / block_size) + 1
        else:
            blocks += math.ceil(length / block_size)
    return blocks + 1


def vllm_greedy(engine, prompt_ids: list[list[int]], max_tokens: int, ignore_eos: bool = False, python=None) -> dict:
    """The same prompts, greedy, through real vLLM on the engine's model (``python -m engine generate --against vllm``).

    vLLM gets the engine's converted Hugging Face directory, float32, the engine's pool in slots (block size
    rounded up to a multiple of 32, plus vLLM's null block; at least :func:`vllm_min_blocks`, without which
    vLLM refuses to start: the pool sets no greedy token), max_model_len and token budget.

    Returns:
        {"vllm_version", "token_ids": one list per prompt}.

    Raises:
        engine.vllm_bridge.env.VLLMUnavailable: vLLM cannot run here, or stopped (its last words).
    """
    from engine.model_executor.model_loader import resolve_model
    from engine.vllm_bridge.env import resolve_python
    from engine.vllm_bridge.process import VLLMProcess

    block_size = VLLM_BLOCK_MULTIPLE * math.ceil(engine.config.block_size / VLLM_BLOCK_MULTIPLE)
    requests = [{"prompt_token_ids": p, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": ignore_eos} for p in prompt_ids]
    job = {"model": str(resolve_model(engine.config.model)), "dtype": "float32", "block_size": block_size,
           "num_gpu_blocks": max(math.ceil(engine.num_blocks * engine.config.block_size / block_size) + 1, vllm_min_blocks(engine, block_size)),
           "max_num_seqs": len(requests),
           "max_num_batched_tokens": engine.scheduler.max_num_batched_tokens, "max_model_len": engine.max_model_len,
           "enable_prefix_caching": False, "requests": requests}
    kv_gib = max(KV_CACHE_GIB, 1.2 * job["num_gpu_blocks"] * block_size * engine.bytes_per_slot / 2**30)
    with VLLMProcess(resolve_python(python), job, kv_gib) as vllm:
        ready = vllm.wait_ready()
        return {"vllm_version": ready["vllm_version"], "token_ids": vllm.generate()["token_ids"]}


def format_vllm_column(r: dict, engine_block_size: int) -> list[str]:
    """The bench's vLLM lines (after the engine's and transformers' lines)."""
    lines = [
        f"vLLM {r['vllm_version']} (its CPU build, same token ids): {r['vllm_seconds']:.2f} s  {r['vllm_tokens_per_s']:.1f} tokens/s",
        f"engine / vLLM tokens/s: {r['engine_vllm_ratio']:.2f}x   per run: " + ", ".join(f"{x:.2f}x" for x in r["vllm_ratios"])
        + f"   vLLM outputs identical to the engine's: {r['vllm_outputs_identical']}",
        f"block size: engine {engine_block_size}, vLLM {r['vllm_block_size']} (vLLM's CPU attention takes multiples of 32; "
        "--block-size sets both); same pool in slots, vLLM +1 null block",
    ]
    for m in r["vllm_mismatches"]:
        margin = "" if m["top2_logit_margin"] is None else f", top-2 logit margin {m['top2_logit_margin']:.4g}"
        lines.append(f"  vLLM request {m['request']}: first difference at token {m['position']}{margin}")
    return lines
