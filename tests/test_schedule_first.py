"""The scheduler's two rules on the real engine (engine/core/scheduler.py): vLLM v0's prefill-first rule,
the one the PagedAttention paper measured, and vLLM v1's decodes-first rule."""

from __future__ import annotations

import pytest

from engine import EngineConfig, LLMEngine
from tests.test_engine import tiny_reference  # noqa: F401 (fixture: 5 prompts' greedy outputs)


def test_prefill_first_steps_never_mix_and_outputs_do_not_change(tiny_llama_dir, tiny_reference):
    """Two requests run; three more arrive after five steps, while those decode. Under prefills
    first the step that admits them runs their prompts alone ("prefill", never "mixed"), the two
    running requests waiting one step; decodes first mixes them. The tokens are the same either way."""
    prompts, params, expected = tiny_reference
    phases = {}
    for rule in ("prefills", "decodes"):
        engine = LLMEngine(EngineConfig(model=str(tiny_llama_dir), dtype="float64", num_gpu_blocks=64, schedule_first=rule))
        ids = [engine.add_request(p, params) for p in prompts[:2]]
        reports = [engine.step() for _ in range(5)]
        ids += [engine.add_request(p, params) for p in prompts[2:]]
        while engine.has_unfinished_requests():
            reports.append(engine.step())
        assert [engine.get_output(i).token_ids for i in ids] == expected, rule
        phases[rule] = [r.phase for r in reports]
    assert phases["prefills"][:7] == ["prefill", "decode", "decode", "decode", "decode", "prefill", "decode"]
    assert "mixed" not in phases["prefills"]
    assert phases["decodes"][:6] == ["prefill", "decode", "decode", "decode", "decode", "mixed"]


def test_prefill_first_with_chunked_prefill_is_refused_by_name(tiny_llama_dir):
    with pytest.raises(ValueError, match="schedule_first='prefills'.*chunked prefill"):
        EngineConfig(model=str(tiny_llama_dir), schedule_first="prefills", enable_chunked_prefill=True)
