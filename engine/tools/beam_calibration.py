"""How beams branch on a real model: the calibration behind the simulator's beam-search model.

In each step of beam search the ``beam_width`` survivors come from some number of distinct parent
beams: all from one parent (the best beam branches, the others are pruned), or one from each
(every beam goes on). How often each happens decides how much of the beams' KV is shared (paper
§4.4, Figure 9; §6.3, Figure 15). This module runs the engine's own beam search on the default
model, reads the forks out of the step reports, and prints that distribution; the simulator
keeps the measured table (``engine.sim.simulator.BEAM_PARENTS``)::

    python -m engine.tools.beam_calibration            # widths 2, 4 and 6, 8 chat prompts, 48 tokens
    python -m engine.tools.beam_calibration --num-prompts 4 --max-tokens 32   # what the table below was measured with
"""

from __future__ import annotations

import argparse
import json
from collections import Counter

from engine.report import FORK, StepReport

PROMPTS = [
    "Tell me a short story about a cat.",
    "What is the capital of France?",
    "Explain what a KV cache is.",
    "Write a haiku about memory.",
    "Give me three tips for learning to cook.",
    "Why is the sky blue?",
    "Summarise the plot of Romeo and Juliet.",
    "What does an operating system do?",
]


def survivor_parents(reports: list[StepReport], request_id: int) -> list[int]:
    """Per decode step of one beam-search request: how many distinct beams of the step before
    the survivors come from. A survivor that keeps its sequence id is its own parent's
    continuation; a forked one names its parent in the FORK event."""
    counts, previous = [], None
    for report in reports:
        live = {t.seq_id for t in report.block_tables if t.request_id == request_id}
        if not live:
            break
        parent = {e.seq_id: e.parent_seq_id for e in report.events if e.kind == FORK and e.request_id == request_id}
        if previous is not None:  # the first step is the prompt's prefill: one parent by definition
            counts.append(len({parent.get(s, s) for s in live}))
        previous = live
    return counts


def measure(beam_widths=(2, 4, 6), max_tokens: int = 48, prompts=PROMPTS) -> dict[int, dict[int, float]]:
    """Run beam search on the default model; returns, per width, the share of decode steps whose
    survivors come from k distinct parents (k = 1..width)."""
    from engine.llm_engine import LLMEngine
    from engine.sampling_params import BeamSearchParams
    from engine.config import EngineConfig

    engine = LLMEngine(EngineConfig(block_size=16, num_gpu_blocks=1024, max_num_seqs=64))
    table = {}
    for width in beam_widths:
        counts: Counter[int] = Counter()
        for text in prompts:
            request_id = engine.add_request([{"role": "user", "content": text}],
                                            BeamSearchParams(beam_width=width, max_tokens=max_tokens, ignore_eos=True))
            reports = []
            while engine.has_unfinished_requests():
                reports.append(engine.step())
            counts.update(survivor_parents(reports, request_id))
        total = sum(counts.values())
        table[width] = {k: round(counts[k] / total, 3) for k in range(1, width + 1)}
    return table


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m engine.tools.beam_calibration", description=__doc__.split("\n")[0])
    parser.add_argument("--widths", type=int, nargs="+", default=[2, 4, 6])
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--num-prompts", type=int, default=len(PROMPTS), choices=range(1, len(PROMPTS) + 1))
    args = parser.parse_args(argv)
    print(json.dumps(measure(tuple(args.widths), args.max_tokens, PROMPTS[: args.num_prompts]), indent=2))


if __name__ == "__main__":
    main()
