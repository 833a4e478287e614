"""Streamed text with the real default model (SmolLM2-135M-Instruct): answers in Chinese, in French
with accents and in emoji, for one sequence, for each of n = 4 parallel samples and for beam search.
Every step's delta joins into the final text, with no character repeated and no U+FFFD; every
sample's and beam's text is rebuilt from the step reports alone; a saved run keeps it all."""

from __future__ import annotations

import pytest

from engine import BeamSearchParams, EngineConfig, LLMEngine, SamplingParams
from engine.detokenizer import REPLACEMENT
from engine.report import SHARING_BEAM, SHARING_NONE, SHARING_PARALLEL, sequence_texts
from engine.runfile import Run, Workload, WorkloadRequest, load_run, run_json

# Prompts the default model answers (greedy, sampled at seed 1, and by beam search) in Chinese
# characters, with French accents, and with emoji: characters whose UTF-8 bytes span tokens.
PROMPTS = {"chinese": "Translate 'thank you' into Chinese.", "french": "Translate 'coffee' into French.",
           "emoji": "Send me a smiley emoji."}
KINDS = {
    SHARING_NONE: SamplingParams(max_tokens=8),
    SHARING_PARALLEL: SamplingParams(max_tokens=8, n=4, temperature=0.8, seed=1),
    SHARING_BEAM: BeamSearchParams(beam_width=4, max_tokens=8),
}


@pytest.fixture(scope="module")
def run():
    """All nine requests in one run; the beams' live texts as the engine holds them, step by step."""
    engine = LLMEngine(EngineConfig(num_gpu_blocks=128))
    ids = {(lang, kind): engine.add_request([{"role": "user", "content": prompt}], params)
           for lang, prompt in PROMPTS.items() for kind, params in KINDS.items()}
    reports, live_beams = [], []
    while engine.has_unfinished_requests():
        reports.append(engine.step())
        live_beams.append({rid: {s.seq_id: engine.output_processor.beam_text(s.output_token_ids) for s in engine.requests[rid].unfinished_seqs()}
                           for (lang, kind), rid in ids.items() if kind == SHARING_BEAM and engine.requests[rid].finish_reason is None})
    outputs = {key: engine.get_output(rid) for key, rid in ids.items()}
    return engine, ids, reports, live_beams, outputs


def test_the_answers_hold_characters_split_over_tokens(run):
    engine, _, _, _, outputs = run
    tokenizer = engine.tokenizer
    split = {lang for (lang, _), out in outputs.items() for o in out.outputs
             if any(tokenizer.decode(o.token_ids[:n]).endswith(REPLACEMENT) for n in range(1, len(o.token_ids)))}
    assert split == set(PROMPTS), "each language's answers must split a character's bytes over tokens"
    assert any("\u4e00" <= ch <= "\u9fff" for o in outputs["chinese", SHARING_NONE].outputs for ch in o.text)
    assert any(ch in "éèàçêô" for o in outputs["french", SHARING_NONE].outputs for ch in o.text)
    assert any(ord(ch) > 0x1F000 for o in outputs["emoji", SHARING_NONE].outputs for ch in o.text)


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("lang", list(PROMPTS))
def test_a_requests_deltas_join_into_its_final_text(run, lang, kind):
    _, ids, reports, _, outputs = run
    rid, out = ids[lang, kind], outputs[lang, kind]
    deltas = [r.new_text[rid] for r in reports if rid in r.new_text]
    assert "".join(deltas) == out.text and out.text
    assert not any(REPLACEMENT in d for d in deltas)
    assert [t for r in reports for t in r.new_token_ids.get(rid, [])] == out.token_ids
    assert {r.sharing[rid] for r in reports if rid in r.sharing} == {kind}
    if kind == SHARING_BEAM:  # nothing is certain until the search ends; then the best beam, whole
        assert deltas[:-1] == [] and out.finish_reason is not None


@pytest.mark.parametrize("lang", list(PROMPTS))
def test_every_samples_text_is_rebuilt_from_the_reports(run, lang):
    _, ids, reports, _, outputs = run
    rid, out = ids[lang, SHARING_PARALLEL], outputs[lang, SHARING_PARALLEL]
    texts = sequence_texts(reports, rid)
    assert list(texts.values()) == [o.text for o in out.outputs] and len(texts) == 4
    deltas = [d for r in reports for d in r.seq_new_text.get(rid, {}).values()]
    assert not any(REPLACEMENT in d for d in deltas)
    single = ids[lang, SHARING_NONE]
    assert list(sequence_texts(reports, single).values()) == [outputs[lang, SHARING_NONE].text]


@pytest.mark.parametrize("lang", list(PROMPTS))
def test_every_live_beams_text_and_score_is_rebuilt_from_the_reports(run, lang):
    engine, ids, reports, live_beams, _ = run
    rid = ids[lang, SHARING_BEAM]
    steps = [k for k, live in enumerate(live_beams) if rid in live]
    assert len(steps) >= 3
    for k in steps:
        texts = sequence_texts(reports[: k + 1], rid)
        live = live_beams[k][rid]
        assert {s: texts[s] for s in live} == live, f"step {k}"
        scores = reports[k].beam_scores[rid]
        assert list(scores) == list(live)
        assert [b.rank for b in scores.values()] == list(range(len(scores)))
        cumulative = [b.cumulative_logprob for b in scores.values()]
        assert cumulative == sorted(cumulative, reverse=True) and all(c < 0 for c in cumulative)
        n = k + 1 - steps[0]  # output tokens of every live beam after step k
        assert all(abs(b.score - b.cumulative_logprob / n) < 1e-6 for b in scores.values())  # length_penalty 1
    pruned = {s for r in reports for s, why in r.seq_finished.get(rid, {}).items() if why == "pruned"}
    assert pruned, "some beams are pruned along the way"
    assert not any(REPLACEMENT in d for r in reports for d in r.seq_new_text.get(rid, {}).values())


def test_a_saved_run_keeps_every_sequences_text_and_old_files_still_load(run):
    engine, ids, reports, _, outputs = run
    workload = Workload([WorkloadRequest(p, 8) for p in PROMPTS.values()])
    saved = Run(workload, {"model_name": engine.model_name, "block_size": 16, "num_blocks": 128, "bytes_per_slot": 1},
                {rid: "" for rid in ids.values()}, reports)
    loaded = load_run(run_json(saved).encode(), "run.json").steps
    assert loaded == reports
    for rid in ids.values():
        assert sequence_texts(loaded, rid) == sequence_texts(reports, rid)
    # A file written before these fields existed loads, with them empty.
    import json

    data = json.loads(run_json(saved))
    new_fields = ("seq_new_text", "seq_finished", "sharing", "beam_scores", "errors")
    for step in data["steps"]:  # a compact run file leaves out fields at their default and lists unchanged ones in "same"
        for key in new_fields:
            step.pop(key, None)
        if "same" in step:
            step["same"] = [key for key in step["same"] if key not in new_fields]
    assert not any(key in step for step in data["steps"] for key in new_fields)
    old = load_run(json.dumps(data).encode(), "old.json").steps
    assert [r.new_text for r in old] == [r.new_text for r in reports]
    assert all(r.seq_new_text == {} and r.beam_scores == {} and r.sharing == {} for r in old)
