"""Speculative decoding's parts without the engine: the config's errors, prompt lookup, rejection
sampling's exactness (chi-square, and a broken rule that must fail it), the step-time model's
prediction, and the paged allocator's lookahead slots under random propose / accept / rollback
sequences with preemption (hypothesis drives the real scheduler and allocator)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
import transformers
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

from engine.core.block_manager import PagedBlockManager
from engine.core.scheduler import Scheduler
from engine.core.sequence import Sequence
from engine.sim.cost_model import expected_tokens_per_step, get_setup
from engine.sim.speculative import breakeven_batch, predict_speedup
from engine.spec_decode import SpeculativeConfig
from engine.spec_decode import rejection_sampler as rs
from engine.spec_decode.ngram import NgramProposer, propose_ngram

# --- configuration -------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs, field", [
    (dict(method="medusa"), "method"),
    (dict(num_speculative_tokens=0), "num_speculative_tokens"),
    (dict(num_speculative_tokens=-2), "num_speculative_tokens"),
    (dict(num_speculative_tokens=2.5), "num_speculative_tokens"),
    (dict(prompt_lookup_min=0), "prompt_lookup_min"),
    (dict(prompt_lookup_min=4, prompt_lookup_max=2), "prompt_lookup_min"),
    (dict(method="draft_layers"), "num_draft_layers"),
    (dict(method="draft_layers", num_draft_layers=0), "num_draft_layers"),
    (dict(method="ngram", num_draft_layers=1), "num_draft_layers"),
])
def test_bad_config_names_its_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SpeculativeConfig(**kwargs)


def test_config_defaults_and_vllm_lookup_rule():
    assert (SpeculativeConfig().prompt_lookup_min, SpeculativeConfig().prompt_lookup_max) == (1, 3)
    only_max = SpeculativeConfig(prompt_lookup_max=4)  # vLLM: one given, the other equals it
    assert (only_max.prompt_lookup_min, only_max.prompt_lookup_max) == (4, 4)


def test_checks_against_the_built_engine():
    cfg = SpeculativeConfig(method="draft_layers", num_draft_layers=2)
    cfg.verify_for_engine(num_layers=3, num_slots=64, max_model_len=64)
    with pytest.raises(ValueError, match=r"num_draft_layers \(L\) must be in 1 \.\. 1"):
        cfg.verify_for_engine(num_layers=2, num_slots=64, max_model_len=64)
    big = SpeculativeConfig(num_speculative_tokens=16)
    with pytest.raises(ValueError, match="more than the whole KV pool"):
        big.verify_for_engine(num_layers=2, num_slots=16, max_model_len=16)


# --- prompt lookup -------------------------------------------------------------------------------


@pytest.mark.parametrize("tokens, lo, hi, k, expected", [
    ([1, 2, 3, 4, 1, 2, 3], 2, 2, 2, [4, 1]),  # vLLM's test: suffix [2, 3] matched at 1
    ([1, 2, 3, 4, 1, 2, 3], 1, 3, 3, [4, 1, 2]),  # the longest suffix [1, 2, 3]
    ([1, 2, 3, 4, 5], 1, 3, 3, []),  # nothing repeats
    ([1, 2, 3, 4, 5, 1], 1, 4, 3, [2, 3, 4]),
    ([10, 20, 30, 40, 50, 70, 30, 40], 2, 3, 2, [50, 70]),
    ([5, 9, 5, 8, 5], 1, 1, 1, [9]),  # the earliest of equally long matches
    ([7, 7, 7, 7], 1, 3, 4, [7]),  # a match overlapping the suffix proposes what follows it
    ([1, 2, 1, 2, 1], 3, 3, 2, [2, 1]),
    ([3, 3], 2, 2, 2, []),  # shorter than min + 1
])
def test_ngram_cases(tokens, lo, hi, k, expected):
    assert propose_ngram(tokens, lo, hi, k) == expected


def test_ngram_stops_at_max_model_len_and_prefers_longer_over_earlier():
    assert propose_ngram([1, 2, 3, 4, 1, 2, 3], 1, 3, 4, max_model_len=9) == [4, 1]
    # [2] alone first occurs at 0 (-> 9), but the longer [1, 2] occurs at 3 (-> 5): longest wins.
    assert NgramProposer(1, 2, 1).propose([2, 9, 8, 1, 2, 5, 1, 2]) == [5]


# --- rejection sampling --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_distributions():
    """A real (tiny, random) model with an 8-token vocabulary: the target's distributions after a
    prompt and after each of two drafts, and its first-layer early exit's distribution (the draft)."""
    cfg = transformers.LlamaConfig(vocab_size=8, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=64, initializer_range=0.5, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    drafts = [1, 7]
    with torch.no_grad():
        out = model(torch.tensor([[1, 2, 3, 4, 5] + drafts]), output_hidden_states=True)
        target = torch.softmax(out.logits[0, -3:].float(), -1)  # after the prompt, after d1, after d1 d2
        early = model.lm_head(model.model.norm(out.hidden_states[1][0, -3]))
        draft = torch.softmax(early.float(), -1)
    assert (target[0] - draft).abs().max() > 0.2  # the draft is a poor one: the test can tell them apart
    return target, draft, drafts


DRAWS = 6_000


def first_token_counts(target, draft, drafts, one_hot: bool) -> Counter:
    gen = torch.Generator().manual_seed(1234)
    counts = Counter()
    for _ in range(DRAWS):
        if one_hot:
            _, out = rs.rejection_sample(drafts[:1], target[:2], None, gen)
        else:
            x = int(torch.multinomial(draft, 1, generator=gen))
            _, out = rs.rejection_sample([x], target[:2], draft[None], gen)
        counts[out[0]] += 1
    return counts


def p_value(counts: Counter, probs: torch.Tensor) -> float:
    observed = [counts[i] for i in range(len(probs))]
    probs = probs.double() / probs.double().sum()
    return chisquare(observed, (probs * sum(observed)).tolist()).pvalue


@pytest.mark.parametrize("one_hot", [False, True], ids=["draft-distribution", "one-hot-draft"])
def test_rejection_sampling_keeps_the_target_distribution(tiny_distributions, one_hot):
    target, draft, drafts = tiny_distributions
    assert p_value(first_token_counts(target, draft, drafts, one_hot), target[0]) > 1e-3


@pytest.mark.parametrize("broken", ["always-accept", "resample-from-target"])
def test_chi_square_fails_when_the_rule_is_broken(tiny_distributions, monkeypatch, broken):
    target, draft, drafts = tiny_distributions
    if broken == "always-accept":
        monkeypatch.setattr(rs, "acceptance_probability", lambda p_x, q_x: 1.0)
    else:  # a rejected position drawn from p instead of the residual max(0, p - q): biased to the draft
        monkeypatch.setattr(rs, "residual_distribution", lambda p, q: p)
    assert p_value(first_token_counts(target, draft, drafts, one_hot=False), target[0]) < 1e-6


def test_second_token_follows_the_target_given_the_first(tiny_distributions):
    target, _, drafts = tiny_distributions
    gen = torch.Generator().manual_seed(7)
    counts, kept = Counter(), 0
    for _ in range(DRAWS):
        accepted, out = rs.rejection_sample(drafts, target, None, gen)
        assert len(out) == accepted + 1 and out[:accepted] == drafts[:accepted]
        if out[0] == drafts[0]:
            counts[out[1]] += 1
            kept += 1
    assert kept > DRAWS // 10
    assert p_value(counts, target[1]) > 1e-3


def test_greedy_verification_is_the_longest_matching_prefix():
    assert rs.verify_greedy([5, 6, 7], [5, 6, 9, 1]) == (2, [5, 6, 9])
    assert rs.verify_greedy([5, 6, 7], [5, 6, 7, 1]) == (3, [5, 6, 7, 1])  # all accepted: the bonus token
    assert rs.verify_greedy([5], [4, 1]) == (0, [4])
    with pytest.raises(ValueError, match="target tokens"):
        rs.verify_greedy([5, 6], [5, 6])


def test_target_probs_match_the_sampler_filters():
    from engine.sampling_params import SamplingParams

    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0, 0.0]])
    probs = rs.target_probs(logits, SamplingParams(temperature=0.5, top_k=3))
    assert probs[0, 3] == 0 and probs[0, 4] == 0 and torch.isclose(probs.sum(), torch.tensor(1.0))
    probs = rs.target_probs(logits, SamplingParams(temperature=1.0, top_p=0.5))
    assert probs[0, 0] == 1.0  # the most likely alone reaches 0.5


# --- the step-time model -------------------------------------------------------------------------


def test_expected_tokens_per_step():
    assert expected_tokens_per_step(0.0, 4) == 1
    assert expected_tokens_per_step(1.0, 4) == 5
    assert expected_tokens_per_step(0.5, 2) == pytest.approx(1.75)
    with pytest.raises(ValueError, match="alpha"):
        expected_tokens_per_step(1.5, 2)


def test_prediction_wins_when_memory_bound_and_loses_when_compute_bound():
    cost = get_setup("h100-llama-3-8b").cost_model
    preds = predict_speedup(cost, [1, 2, 4, 8, 16, 64, 256, 1024], context_len=256, alpha=0.6, k=4)
    assert preds[0].speedup == pytest.approx(expected_tokens_per_step(0.6, 4), rel=0.02)  # k + 1 tokens for one's price
    assert all(b.speedup <= a.speedup * 1.001 for a, b in zip(preds, preds[1:]))  # falls as the batch grows
    assert breakeven_batch(preds) is not None and preds[-1].speedup < 1
    # A draft that costs something (early exit, 1 of 4 layers per draft token) wins less.
    assert predict_speedup(cost, [1], 256, 0.6, 4, draft_cost=0.25)[0].speedup < preds[0].speedup


# --- lookahead slots under random speculation (the allocator and scheduler, no model) -------------


def check_spec_invariants(kv: PagedBlockManager, scheduler: Scheduler) -> None:
    alloc = kv.allocator
    held = Counter(b for seq in scheduler.running for b in seq.block_table)
    for block in range(kv.num_blocks):
        assert (block in alloc.free_blocks) != (alloc.ref_counts[block] > 0)
        assert alloc.ref_counts[block] == held[block], f"block {block}: refcount {alloc.ref_counts[block]}, {held[block]} holders"
    assert not kv.lookahead, "a tentative slot survived the step"
    for seq in scheduler.running:
        assert len(seq.block_table) <= kv.blocks_needed(max(seq.num_tokens, 1)), "a block with no token in it"
    cache = kv.prefix_cache
    for block, block_hash in enumerate(cache.block_hash):
        if block_hash is None:
            continue
        tokens = cache.block_token_ids[block]
        for seq in scheduler.running:  # a cached block a sequence holds is one of its verified full blocks
            if block in seq.block_table:
                i = seq.block_table.index(block)
                assert (i + 1) * kv.block_size <= seq.num_computed_tokens, "an unverified token in the prefix cache"
                assert list(tokens) == seq.token_ids[i * kv.block_size : (i + 1) * kv.block_size]


def spec_step(scheduler: Scheduler, kv: PagedBlockManager, data) -> None:
    """One step as the speculative engine runs it, without a model: prefills compute their tokens;
    each decode gets lookahead slots for its drafts, accepts some, and rolls the rest back."""
    batch = scheduler.schedule()
    for seq in batch.prefill_seqs:
        seq.num_computed_tokens += batch.num_tokens_of(seq)
    for seq in batch.decode_seqs:
        granted = kv.allocate_lookahead_slots(seq, data.draw(st.integers(0, 5), label="drafts"))
        room = seq.max_len - seq.num_tokens
        tentative = kv.tentative_slots(seq)
        assert len(tentative) == granted
        own = {b * kv.block_size + o for b in seq.block_table for o in range(kv.block_size)}
        assert set(tentative) <= own, "a tentative slot outside the sequence's own blocks"
        accepted = min(data.draw(st.integers(0, granted), label="accepted"), room - 1)
        new_tokens = [data.draw(st.integers(0, 3), label="token") for _ in range(accepted + 1)]
        seq.num_computed_tokens = seq.num_tokens + accepted  # the newest token and the accepted drafts
        for token in new_tokens:
            seq.append_token(token)
        rolled_back, _ = kv.rollback_lookahead(seq)
        assert len(rolled_back) == granted - accepted
    kv.cache_blocks([s for s in batch.prefill_seqs + batch.decode_seqs])
    for seq in batch.prefill_seqs:
        if seq.num_computed_tokens == seq.num_tokens:
            seq.is_prefill = False
            seq.append_token(data.draw(st.integers(0, 3), label="token"))
    for seq in list(batch.prefill_seqs + batch.decode_seqs):
        if seq.num_tokens >= seq.max_len and seq in scheduler.running:
            scheduler.finish(seq, "length")


@settings(max_examples=60, deadline=None)
@given(
    prompts=st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=20), min_size=1, max_size=6),
    block_size=st.sampled_from([1, 2, 4, 8]),
    num_blocks=st.integers(6, 30),
    mode=st.sampled_from(["recompute", "swap"]),
    chunked=st.booleans(),
    data=st.data(),
)
def test_lookahead_slots_never_leak_or_reach_the_prefix_cache(prompts, block_size, num_blocks, mode, chunked, data):
    kv = PagedBlockManager(num_blocks, block_size, enable_caching=True, num_cpu_blocks=num_blocks if mode == "swap" else 0)
    scheduler = Scheduler(kv, max_num_seqs=4, max_num_batched_tokens=64 if not chunked else 8, preemption_mode=mode,
                          enable_chunked_prefill=chunked)
    capacity = num_blocks * block_size
    for i, prompt in enumerate(prompts):
        seq = Sequence(i, len(prompt), max_len=min(len(prompt) + 12, capacity), token_ids=list(prompt))
        if len(prompt) + 1 > capacity or not kv.fits_ever(seq):
            continue
        scheduler.add(seq)
    steps = 0
    while scheduler.has_unfinished():
        spec_step(scheduler, kv, data)
        check_spec_invariants(kv, scheduler)
        steps += 1
        assert steps < 2_000, "no progress"
    assert kv.allocator.num_free == num_blocks, "blocks leaked"
    if kv.cpu_allocator is not None:
        assert kv.cpu_allocator.num_free == num_blocks, "CPU blocks leaked"


def test_rollback_on_a_block_boundary_frees_the_empty_block():
    kv = PagedBlockManager(num_blocks=8, block_size=4, enable_caching=True)
    seq = Sequence(0, 3, max_len=40, token_ids=[1, 2, 3])
    kv.allocate(seq)
    seq.num_computed_tokens, seq.is_prefill = 3, False
    seq.append_token(9)  # 4 tokens, the newest at position 3 (block 0's last slot)
    kv.append_slot(seq)
    assert kv.allocate_lookahead_slots(seq, 5) == 5  # positions 4..8: blocks 1 and 2
    assert len(seq.block_table) == 3
    third = seq.block_table[2]
    # One draft accepted: verified up to position 4, the rejection lands at position 5.
    seq.num_computed_tokens = 5
    seq.append_token(4), seq.append_token(5)
    rolled_back, freed = kv.rollback_lookahead(seq)
    assert len(rolled_back) == 4 and freed == [third] and len(seq.block_table) == 2
    # The next rejection lands exactly on a block boundary: position 8, the first slot of block 2.
    kv.append_slot(seq)  # position 5, in block 1
    assert kv.allocate_lookahead_slots(seq, 4) == 4  # positions 6..9: block 2 again
    fresh = seq.block_table[2]
    seq.num_computed_tokens = seq.num_tokens + 2  # = 8: the newest token and two drafts verified
    for token in (7, 8, 9):
        seq.append_token(token)
    rolled_back, freed = kv.rollback_lookahead(seq)
    assert len(rolled_back) == 2
    assert freed == [fresh] and len(seq.block_table) == 2 and not kv.lookahead
    kv.append_slot(seq)  # position 8: the block is taken again, by a verified token this time
    assert len(seq.block_table) == 3
    assert kv.allocator.num_free == 8 - 3


def test_the_formulas_alpha_comes_from_the_mean_accepted_length_not_from_accepted_over_proposed():
    from engine.sim.cost_model import expected_tokens_per_step
    from engine.sim.speculative import alpha_from_mean_accepted_length

    for alpha in (0.0, 0.2, 0.55, 0.9):
        for k in (1, 3, 5):
            assert alpha_from_mean_accepted_length(expected_tokens_per_step(alpha, k), k) == pytest.approx(alpha, abs=1e-9)
    # k = 4 drafts each verification, 2.09 tokens per verification: accepted / proposed is
    # (2.09 - 1) / 4 = 0.27, but the formula needs the per-draft α of 0.55.
    assert alpha_from_mean_accepted_length(2.09, 4) == pytest.approx(0.55, abs=0.01)
    with pytest.raises(ValueError, match="mean accepted length"):
        alpha_from_mean_accepted_length(5.5, 4)
    with pytest.raises(ValueError, match="k must be"):
        alpha_from_mean_accepted_length(1.0, 0)


def test_speculative_config_takes_vllms_dict_form_and_names_a_bad_key(tiny_llama_dir):
    from engine import LLM, EngineConfig, SamplingParams
    from engine.config import SpeculativeConfig

    settings = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    config = EngineConfig(speculative_config=settings)
    assert config.speculative_config == SpeculativeConfig(**settings)
    with pytest.raises(ValueError, match=r"speculative_config has no setting 'ngram_window'.*num_speculative_tokens"):
        EngineConfig(speculative_config={"method": "ngram", "ngram_window": 3})
    with pytest.raises(ValueError, match=r"speculative_config.num_speculative_tokens"):
        EngineConfig(speculative_config={"method": "ngram", "num_speculative_tokens": 0})
    llm = LLM(str(tiny_llama_dir), speculative_config=settings, num_gpu_blocks=64)
    assert llm.engine.spec is not None and llm.engine.config.speculative_config.num_speculative_tokens == 4
    [out] = llm.generate("1, 2, 3, 1, 2, 3, 1, 2,", SamplingParams(max_tokens=6, temperature=0.0))
    plain = LLM(str(tiny_llama_dir), num_gpu_blocks=64).generate("1, 2, 3, 1, 2, 3, 1, 2,", SamplingParams(max_tokens=6, temperature=0.0))[0]
    assert out.token_ids == plain.token_ids  # greedy speculative decoding gives the tokens plain decoding gives
