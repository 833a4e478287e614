"""Speculative decoding on the real engine: the early-exit drafter against transformers, greedy
output identical with and without speculation, and the same as transformers' assisted generation."""

from __future__ import annotations

import paged_kernels  # noqa: F401  (first: it switches Triton to its CPU interpreter before anything imports Triton)
import pytest
import torch
import transformers

from conftest import make_tiny_model
from engine import EngineConfig, LLMEngine, SamplingParams
from engine.spec_decode.draft_layers import EarlyExitDrafter


@pytest.fixture(scope="module")
def deep_tiny(tmp_path_factory, default_model_dir):
    """A 4-layer tiny random Llama (early exit needs layers to leave out), float64 in both."""
    directory = make_tiny_model(tmp_path_factory.mktemp("tiny-llama-4"), "llama", default_model_dir, seed=2, num_hidden_layers=4)
    hf = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float64).eval()
    return directory, hf


def hf_early_exit_greedy(hf, ids: list[int], num_layers: int, k: int) -> list[int]:
    """k greedy tokens from the first ``num_layers`` layers, the final norm and the LM head, as
    transformers' EarlyExitCandidateGenerator runs them (``config.num_hidden_layers`` lowered)."""
    full = hf.config.num_hidden_layers
    hf.config.num_hidden_layers = num_layers
    try:
        out = []
        with torch.inference_mode():
            for _ in range(k):
                token = int(hf(torch.tensor([ids + out])).logits[0, -1].argmax())
                out.append(token)
        return out
    finally:
        hf.config.num_hidden_layers = full


@pytest.mark.parametrize("num_layers", [1, 3])
def test_early_exit_drafts_equal_transformers(deep_tiny, num_layers):
    directory, hf = deep_tiny
    engine = LLMEngine(EngineConfig(model=str(directory), dtype="float64", block_size=4, num_gpu_blocks=32))
    prompt = torch.randint(3, hf.config.vocab_size, (9,), generator=torch.Generator().manual_seed(num_layers)).tolist()
    rid = engine.add_request(prompt, SamplingParams(max_tokens=20, ignore_eos=True))
    engine.step()  # the prefill: the prompt's KV in the pool, the first token sampled
    seq = engine.requests[rid].seqs[0]
    k = 5
    engine.kv.append_slot(seq)
    assert engine.kv.allocate_lookahead_slots(seq, k) == k
    drafter = EarlyExitDrafter(engine.runner.model, num_layers, engine.runner.backend)
    drafts = drafter.propose([seq], [k], engine.kv, engine.runner.caches_for(engine.kv.attention_block_size))
    assert drafts == [hf_early_exit_greedy(hf, seq.token_ids, num_layers, k)]


# ---- lossless at temperature 0: the same tokens with and without speculation ---------------------

from engine.model_executor.model_loader import load_model  # noqa: E402
from engine.spec_decode import SpeculativeConfig  # noqa: E402

MAX_TOKENS = 24


def run(engine: LLMEngine, prompts, params) -> tuple[list[list[int]], list]:
    ids = [engine.add_request(p, params) for p in prompts]
    reports = []
    while engine.has_unfinished_requests():
        reports.append(engine.step())
        assert len(reports) < 500
    return [engine.get_output(i).token_ids for i in ids], reports


def tiny_prompts(vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(11)
    prompts = [torch.randint(3, vocab, (n,), generator=g).tolist() for n in (5, 13, 30)]
    return prompts + [[7, 8, 9, 10] * 4, [7, 8, 9, 10] * 4 + [11, 12]]  # a shared prefix (prefix caching hits it)


@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen3"])
def tiny_family(request, tmp_path_factory, default_model_dir):
    """A 3-layer tiny model of each family, loaded once, with its greedy outputs without speculation."""
    # A small vocabulary: cheap LM heads, and outputs that repeat themselves, so prompt lookup finds drafts.
    directory = make_tiny_model(tmp_path_factory.mktemp(request.param), request.param, default_model_dir, seed=3, num_hidden_layers=3,
                                vocab_size=512)
    loaded = load_model(str(directory), dtype=torch.float32)
    prompts = tiny_prompts(loaded.config.vocab_size)
    engine = LLMEngine(EngineConfig(model=str(directory), dtype="float64", block_size=4, num_gpu_blocks=64), loaded_model=loaded)
    expected, _ = run(engine, prompts, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))
    return directory, loaded, prompts, expected


SETTINGS = {
    "plain": dict(num_gpu_blocks=64),
    "recompute": dict(num_gpu_blocks=18, max_num_seqs=5),  # preemptions: 5 requests need up to 14 blocks each
    "swap": dict(num_gpu_blocks=18, max_num_seqs=5, preemption_mode="swap"),
    "chunked": dict(num_gpu_blocks=64, enable_chunked_prefill=True, max_num_batched_tokens=8, max_num_seqs=4),
    "no-prefix-caching": dict(num_gpu_blocks=64, enable_prefix_caching=False),
}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models run fastest on one thread (two threads on a busy two-core machine wait on each other)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# Each method meets every setting over its three k.
CASES = {("ngram", 1): ("plain", "recompute"), ("ngram", 3): ("swap", "chunked"), ("ngram", 5): ("no-prefix-caching", "recompute"),
         ("draft_layers", 1): ("swap", "chunked"), ("draft_layers", 3): ("plain", "recompute"),
         ("draft_layers", 5): ("no-prefix-caching", "swap")}


@pytest.mark.parametrize("method, k", list(CASES))
def test_greedy_tokens_identical_with_speculation(tiny_family, method, k):
    directory, loaded, prompts, expected = tiny_family
    spec = SpeculativeConfig(method, k, num_draft_layers=2 if method == "draft_layers" else None)
    for name in CASES[method, k]:
        engine = LLMEngine(EngineConfig(model=str(directory), dtype="float64", block_size=4, speculative_config=spec, **SETTINGS[name]),
                           loaded_model=loaded)
        outputs, reports = run(engine, prompts, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))
        assert outputs == expected, f"{method} k={k} under {name}"
        assert engine.spec.stats.verifications > 0 and engine.spec.stats.accepted > 0
        assert engine.kv.allocator.num_free == engine.kv.num_usable_blocks and not engine.kv.lookahead
        if name in ("recompute", "swap"):
            assert any(r.preempted for r in reports), f"{name}: no preemption happened"


# ---- the same as transformers' assisted generation ---------------------------------------------


@torch.inference_mode()
def hf_generate(hf, prompt: list[int], max_new_tokens: int, **assist) -> list[int]:
    hf.generation_config.eos_token_id = None
    out = hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long), max_new_tokens=max_new_tokens,
                      do_sample=False, pad_token_id=0, temperature=None, top_p=None, top_k=None, **assist)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("method, assist", [("ngram", dict(prompt_lookup_num_tokens=3)), ("draft_layers", dict(assistant_early_exit=1))])
def test_same_tokens_as_transformers_assisted_generation(tiny_family, method, assist):
    directory, loaded, prompts, expected = tiny_family
    hf = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float64).eval()
    spec = SpeculativeConfig(method, 3, num_draft_layers=1 if method == "draft_layers" else None)
    engine = LLMEngine(EngineConfig(model=str(directory), dtype="float64", block_size=4, num_gpu_blocks=64, speculative_config=spec),
                       loaded_model=loaded)
    ours, _ = run(engine, prompts[-2:], SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))
    theirs = [hf_generate(hf, p, MAX_TOKENS, **assist) for p in prompts[-2:]]
    plain = [hf_generate(hf, p, MAX_TOKENS) for p in prompts[-2:]]
    assert ours == theirs == plain == expected[-2:]


# ---- rollback on and just after a block boundary ------------------------------------------------


@pytest.mark.parametrize("offset", [0, 1], ids=["on-the-boundary", "one-after"])
def test_rejection_on_a_block_boundary(tiny_family, offset, monkeypatch):
    """A proposer that knows the greedy answer drafts it right up to a chosen position and wrong
    from there: the first rejected draft lands exactly on a block's first slot (or one after)."""
    directory, loaded, prompts, expected = tiny_family
    block_size = 4
    engine = LLMEngine(EngineConfig(model=str(directory), dtype="float64", block_size=block_size, num_gpu_blocks=64,
                                    speculative_config=SpeculativeConfig("ngram", 5)), loaded_model=loaded)
    prompt, answer = prompts[0], expected[0]
    full = prompt + answer

    def oracle(token_ids, k):
        n = len(token_ids)  # drafts go to positions n .. n + k - 1; the first wrong one on a boundary (+ offset)
        right = (offset - n) % block_size
        drafts = full[n : n + min(right, k)]
        return drafts + [(full[n + len(drafts)] + 1) % 512] * (k - len(drafts)) if n + k < len(full) else full[n : n + k]

    monkeypatch.setattr(engine.spec.ngram, "propose", oracle)
    rid = engine.add_request(prompt, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))
    freed_blocks = 0
    first_rejected = []
    while engine.has_unfinished_requests():
        engine.step()
        for outcome in engine.spec.take_step_outcomes().values():
            if outcome.rejected:
                first_rejected.append(outcome.tentative_slots[outcome.accepted])
                freed_blocks += len(outcome.freed_blocks)
        kv = engine.kv
        assert not kv.lookahead
    assert engine.get_output(rid).token_ids == answer
    assert first_rejected and all(slot % block_size == offset for slot in first_rejected)
    if offset == 0:
        assert freed_blocks > 0  # a rejection on a block's first slot leaves that block empty: freed
    assert engine.kv.allocator.num_free == engine.kv.num_usable_blocks


# ---- what speculation refuses, and sampling -------------------------------------------------------


def test_refusals_name_their_cause(tiny_family):
    directory, loaded, prompts, _ = tiny_family
    make = lambda spec, **kw: LLMEngine(EngineConfig(model=str(directory), dtype="float64", speculative_config=spec, **kw),  # noqa: E731
                                        loaded_model=loaded)
    with pytest.raises(ValueError, match=r"num_draft_layers \(L\) must be in 1 \.\. 2"):
        make(SpeculativeConfig("draft_layers", 2, num_draft_layers=3))
    with pytest.raises(ValueError, match="more than the whole KV pool"):
        make(SpeculativeConfig("ngram", 40), block_size=4, num_gpu_blocks=8)
    with pytest.raises(ValueError, match="allocator='paged'"):
        EngineConfig(allocator="contiguous", enable_prefix_caching=False, speculative_config=SpeculativeConfig())
    engine = make(SpeculativeConfig("ngram", 2), num_gpu_blocks=32)
    from engine import BeamSearchParams

    with pytest.raises(ValueError, match="n=2 is refused"):
        engine.add_request(prompts[0], SamplingParams(n=2))
    with pytest.raises(ValueError, match="beam search is refused"):
        engine.add_request(prompts[0], BeamSearchParams(beam_width=2))
    rid = engine.add_request(prompts[0], SamplingParams(max_tokens=3))  # the engine still serves
    while engine.has_unfinished_requests():
        engine.step()
    assert len(engine.get_output(rid).token_ids) == 3


def test_sampling_with_speculation_is_seeded_and_stops_at_max_tokens(tiny_family):
    directory, loaded, prompts, _ = tiny_family
    outputs = []
    for _ in range(2):
        engine = LLMEngine(EngineConfig(model=str(directory), dtype="float64", block_size=4, num_gpu_blocks=64,
                                        speculative_config=SpeculativeConfig("ngram", 4)), loaded_model=loaded)
        params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.7, top_k=50, seed=5, ignore_eos=True)
        got, reports = run(engine, prompts[-2:], params)
        outputs.append(got)
        assert [len(o) for o in got] == [MAX_TOKENS] * 2
    assert outputs[0] == outputs[1]


# ---- the default model: a prompt lookup can copy from ------------------------------------------

COPY_PROMPT = [{"role": "user", "content": "Repeat this text exactly: The quick brown fox jumps over the lazy dog. The library "
                                           "opens at nine and closes at five on weekdays, and at noon on Saturdays."}]


@pytest.fixture(scope="module")
def default_plain(default_model_dir):
    """The default model, loaded once, and its greedy answer to the copy prompt without speculation."""
    loaded = load_model(None)
    plain, reports = run(LLMEngine(EngineConfig(block_size=4), loaded_model=loaded), [COPY_PROMPT], SamplingParams(max_tokens=32))
    return loaded, plain, len(reports)


@pytest.mark.slow
@pytest.mark.parametrize("spec", [SpeculativeConfig("ngram", 4), SpeculativeConfig("draft_layers", 3, num_draft_layers=20)],
                         ids=["ngram", "draft_layers"])
def test_default_model_greedy_identical_and_fewer_steps(default_plain, spec):
    loaded, plain, plain_steps = default_plain
    engine = LLMEngine(EngineConfig(block_size=4, speculative_config=spec), loaded_model=loaded)
    ours, reports = run(engine, [COPY_PROMPT], SamplingParams(max_tokens=32))
    assert ours == plain
    assert engine.spec.stats.accepted > 0
    if spec.method == "ngram":
        assert len(reports) < plain_steps * 0.7  # the copy is found: several tokens per step


# ---- what the step report says -------------------------------------------------------------------


def test_step_report_shows_proposals_acceptance_and_rollback(tiny_family, monkeypatch):
    from engine.report import FREE, SPEC_ACCEPT, SPEC_PROPOSE, SPEC_REJECT

    directory, loaded, prompts, expected = tiny_family
    engine = LLMEngine(EngineConfig(model=str(directory), dtype="float64", block_size=4, num_gpu_blocks=64,
                                    speculative_config=SpeculativeConfig("ngram", 3)), loaded_model=loaded)
    full = prompts[0] + expected[0]
    # Two right drafts, then a wrong one: every verification accepts 2 and rejects 1.
    monkeypatch.setattr(engine.spec.ngram, "propose", lambda ids, k: full[len(ids) : len(ids) + 2] + [(full[len(ids) + 2] + 1) % 512]
                        if k >= 3 and len(ids) + 3 < len(full) else [])
    rid = engine.add_request(prompts[0], SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))
    seen = 0
    while engine.has_unfinished_requests():
        report = engine.step()
        if rid not in report.spec:
            continue
        seen += 1
        spec = report.spec[rid]
        assert spec.accepted == 2 and len(spec.rejected) == 1 and len(spec.emitted) == 3
        assert report.new_token_ids[rid] == spec.emitted and spec.emitted[:2] == spec.proposed[:2]
        assert report.spec_acceptance_rate == pytest.approx(2 / 3) and report.spec_mean_accepted_length == 3
        kinds = {kind: [e for e in report.events if e.kind == kind] for kind in (SPEC_PROPOSE, SPEC_ACCEPT, SPEC_REJECT, FREE)}
        assert [e.slot for e in kinds[SPEC_PROPOSE]] == spec.tentative_slots
        assert [e.slot for e in kinds[SPEC_ACCEPT]] == spec.tentative_slots[:2]
        assert [e.slot for e in kinds[SPEC_REJECT]] == spec.rolled_back_slots == spec.tentative_slots[2:]
        assert [e.block_id for e in kinds[FREE]] == spec.freed_blocks
        table = next(t for t in report.block_tables if t.request_id == rid)
        assert len(table.block_table) == -(-engine.requests[rid].seqs[0].num_computed_tokens // 4)  # no block past the verified tokens
    assert seen >= 4
    assert engine.get_output(rid).token_ids == expected[0]
    assert engine.spec.request_stats[rid].acceptance_rate == pytest.approx(2 / 3)


def test_triton_backend_verifies_the_same(tiny_llama_dir):
    """The verification chunk through the Triton prefill kernel (its CPU interpreter without a GPU)."""
    loaded = load_model(str(tiny_llama_dir))
    prompts = [[7, 8, 9, 10] * 3, [5, 6, 5, 6, 5]]
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    make = lambda spec: LLMEngine(EngineConfig(model=str(tiny_llama_dir), dtype="float32", attention_backend="triton", block_size=4,  # noqa: E731
                                               num_gpu_blocks=16, speculative_config=spec), loaded_model=loaded)
    plain, _ = run(make(None), prompts, params)
    engine = make(SpeculativeConfig("ngram", 3))
    ours, _ = run(engine, prompts, params)
    assert ours == plain and engine.spec.stats.verifications > 0


def test_a_verification_counts_every_query_token_it_computes(tiny_family, monkeypatch):
    """A verification step computes the newest token and its k drafts, 1 + k query tokens per request:
    the report's scheduled tokens (the app's "Tokens processed"), its WRITE events and the cost
    model's verification shape all count them."""
    from engine.report import WRITE
    from engine.sim.cost_model import speculative_step_shape
    from engine.tools.calibrate import shape_of_report

    directory, loaded, prompts, expected = tiny_family
    k = 3
    engine = LLMEngine(EngineConfig(model=str(directory), dtype="float64", block_size=4, num_gpu_blocks=64,
                                    speculative_config=SpeculativeConfig("ngram", k)), loaded_model=loaded)
    full = prompts[0] + expected[0]
    # One right draft, then two wrong ones: 3 drafts verified, 1 accepted.
    monkeypatch.setattr(engine.spec.ngram, "propose", lambda ids, n: full[len(ids) : len(ids) + 1] + [1, 2]
                        if n >= k and len(ids) + k < len(full) else [])
    rid = engine.add_request(prompts[0], SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))
    seen = 0
    while engine.has_unfinished_requests():
        before = engine.requests[rid].seqs[0].num_tokens
        report = engine.step()
        if rid not in report.spec:
            continue
        seen += 1
        (scheduled,) = report.scheduled
        writes = [e for e in report.events if e.kind == WRITE]
        assert scheduled.phase == "decode" and scheduled.num_tokens == 1 + k == report.num_tokens == len(writes)
        assert scheduled.context_len == before + k == max(e.position for e in writes) + 1
        assert scheduled.num_computed_tokens == before + report.spec[rid].accepted
        assert shape_of_report(report, 4) == speculative_step_shape(1, before - 1, k, 4)
    assert seen >= 4
