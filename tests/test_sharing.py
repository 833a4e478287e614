"""Memory sharing (paper §4.4): sequence groups, fork, copy-on-write, parallel sampling, beam search.

- a block's refcount is the number of block tables holding it, and it is free iff that is 0;
- a write into a shared block copies it first, and the last holder writes in place (Figure 8);
- sharing changes no number: each sample, replayed alone without sharing, has the same logprobs;
- the prompt of n samples is prefilled once;
- beam search gives transformers' beams, and pruned beams free their blocks at once;
- nothing leaks once every request has finished.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest
import torch
import transformers
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import LLM, BeamSearchParams, EngineConfig, LLMEngine, SamplingParams
from engine.core.block_manager import PagedBlockManager
from engine.report import COPY_ON_WRITE, FORK, FREE
from engine.core.scheduler import Scheduler
from engine.core.sequence import Sequence, SequenceGroup, SequenceStatus, fork_samples
from tests.conftest import make_tiny_model

STORY = [{"role": "user", "content": "Tell me a short story about a cat."}]


# ---- the allocator under random sharing (no model) ------------------------------------------------

def check_sharing_invariants(kv: PagedBlockManager, scheduler: Scheduler) -> None:
    alloc = kv.allocator
    held = Counter(b for g in scheduler.running for s in g.unfinished_seqs() for b in s.block_table)
    free = Counter(alloc.free_blocks)
    assert all(n == 1 for n in free.values()), "a block is on the free list twice"
    for block in range(kv.num_blocks):
        assert alloc.ref_counts[block] == held[block], f"block {block}: refcount {alloc.ref_counts[block]}, held by {held[block]} tables"
        assert (block in free) == (alloc.ref_counts[block] == 0), f"block {block}: free iff refcount 0"
    for group in scheduler.waiting:
        assert all(not s.block_table for s in group.unfinished_seqs()), "a waiting request holds blocks"
    # Memory counts each physical slot once: a block holds the tokens of its fullest holder.
    filled = {}
    for group in scheduler.running:
        for seq in group.unfinished_seqs():
            for i, b in enumerate(seq.block_table):
                filled[b] = max(filled.get(b, 0), min(kv.block_size, max(0, seq.num_computed_tokens - i * kv.block_size)))
    usage = kv.usage(scheduler.running, None)
    assert usage.token_states == sum(filled.values())
    assert usage.shared_slots == sum(n for b, n in filled.items() if alloc.ref_counts[b] > 1)
    assert usage.blocks_with_sharing == len(filled) == sum(1 for b in range(kv.num_blocks) if alloc.ref_counts[b] > 0)
    assert usage.blocks_without_sharing == sum(held.values())


def model_free_group_step(scheduler: Scheduler, rng: random.Random, next_seq_id) -> None:
    """One engine step without a model: compute the scheduled tokens, fork a first-prefilled group
    into its samples, emit one token per sequence, and sometimes finish or prune a sequence."""
    batch = scheduler.schedule()
    for seq in batch.prefill_seqs + batch.decode_seqs:
        seq.num_computed_tokens = seq.num_tokens
    for group in list(scheduler.running):
        fork_samples(group, scheduler.fork, next_seq_id)  # after the prompt's one prefill
        for seq in group.unfinished_seqs():
            seq.append_token()
            live = group.unfinished_seqs()
            done = seq.num_tokens >= seq.max_len or (not group.is_single and rng.random() < 0.05)
            if done and len(live) > 1:
                scheduler.finish_seq(seq, "stop")
            elif done:
                scheduler.finish(group, "length")
                break
        if not group.is_single and group.status is SequenceStatus.RUNNING and rng.random() < 0.1:
            live = group.unfinished_seqs()  # a beam-search-like prune and fork
            if len(live) > 1:
                pruned, survivor = live[-1], live[0]
                scheduler.finish_seq(pruned, "pruned")
                child = survivor.fork(next_seq_id(), pruned.index)
                scheduler.fork(survivor, child)
                group.seqs.append(child)


@settings(max_examples=60, deadline=None)
@given(
    requests=st.lists(st.tuples(st.integers(1, 30), st.integers(1, 30), st.integers(1, 4)), min_size=1, max_size=8),
    block_size=st.sampled_from([1, 2, 3, 4, 16]),
    num_blocks=st.integers(8, 60),
    max_num_seqs=st.integers(1, 5),
    seed=st.integers(0, 1000),
)
def test_refcounts_and_free_list_hold_under_fork_copy_on_write_free_and_preempt(requests, block_size, num_blocks, max_num_seqs, seed):
    rng = random.Random(seed)
    kv = PagedBlockManager(num_blocks, block_size, shuffle_seed=seed)
    scheduler = Scheduler(kv, max_num_seqs, max_num_batched_tokens=10_000)
    ids = iter(range(1000, 10**6))
    for i, (prompt, output, n) in enumerate(requests):
        seq = Sequence(i, prompt, max_len=min(prompt + output, num_blocks * block_size), seq_id=next(ids))
        if prompt + 1 > seq.max_len:
            continue  # the engine rejects these in add_request
        group = SequenceGroup(i, [seq], SamplingParams(n=n))
        if kv.fits_ever(group):
            scheduler.add(group)
    steps = 0
    while scheduler.has_unfinished():
        model_free_group_step(scheduler, rng, lambda: next(ids))
        check_sharing_invariants(kv, scheduler)
        steps += 1
        assert steps < 5_000, "the scheduler stopped making progress"
    assert kv.allocator.num_free == num_blocks, "blocks leaked"


def test_copy_on_write_needs_one_block_per_writer_but_the_last():
    """Figure 8: 3 sequences share a partly filled block (refcount 3); two writers copy it, the
    third sees refcount 1 and writes in place."""
    kv = PagedBlockManager(num_blocks=8, block_size=4)
    parent = Sequence(0, num_prompt_tokens=6, max_len=20)
    group = SequenceGroup(0, [parent], SamplingParams(n=3))
    kv.allocate(group)
    parent.num_computed_tokens = 6
    children = [parent.fork(i, i) for i in (1, 2)]
    for child in children:
        kv.fork(parent, child)
    group.seqs += children
    last = parent.block_table[1]
    assert kv.allocator.ref_counts[last] == 3 and kv.allocator.num_free == 6
    for seq in group.seqs:
        seq.append_token()
    assert kv._blocks_to_append(group.seqs) == 2 and kv.can_append_slots(group)
    copies = [kv.append_slot(seq) for seq in group.seqs]
    assert copies[:2] == [(last, children[0].block_table[1]), (last, children[1].block_table[1])] or copies[0][0] == last
    assert copies[2] is None and group.seqs[2].block_table[1] == last, "the last holder writes in place"
    assert kv.allocator.ref_counts[last] == 1 and kv.allocator.num_free == 4
    assert [e.kind for e in kv.events].count(COPY_ON_WRITE) == 2 and [e.kind for e in kv.events].count(FORK) == 2


def test_a_group_that_can_never_finish_alone_is_not_admitted():
    kv = PagedBlockManager(num_blocks=10, block_size=4)
    fits = SequenceGroup(0, [Sequence(0, 8, max_len=16)], SamplingParams(n=4))  # 2 shared + 4 x 2 own = 10
    too_wide = SequenceGroup(1, [Sequence(1, 8, max_len=16)], SamplingParams(n=5))  # 2 + 5 x 2 = 12
    assert kv.fits_ever(fits) and not kv.fits_ever(too_wide)


# ---- the real engine ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def engine():
    return LLMEngine(EngineConfig(block_size=16, num_gpu_blocks=128, max_num_seqs=16))


def run(engine, prompt, params):
    request_id = engine.add_request(prompt, params)
    reports = []
    while engine.has_unfinished_requests():
        reports.append(engine.step())
    return engine.get_output(request_id), reports


@pytest.mark.slow
def test_parallel_sampling_prefills_once_and_shares_then_copies_on_write(engine):
    prompt_len = len(engine.encode(STORY))
    assert prompt_len % 16, "the Figure 8 situation needs a partly filled last prompt block"
    out, reports = run(engine, STORY, SamplingParams(n=4, max_tokens=8, temperature=0.8, seed=11))
    prefills = [s for r in reports for s in r.scheduled if s.phase == "prefill"]
    assert len(prefills) == 1 and prefills[0].num_tokens == prompt_len, "the prompt is prefilled once"
    first = reports[0]
    assert [e.kind for e in first.events].count(FORK) == 3
    tables = [b for b in first.block_tables if b.request_id == out.request_id]
    assert len(tables) == 4 and len({tuple(b.block_table) for b in tables}) == 1, "all 4 samples point at the same blocks"
    assert all(b.ref_counts == [4] * len(b.block_table) for b in tables)
    assert first.memory.memory_saved_by_sharing == pytest.approx(0.75)
    cow = [e for e in reports[1].events if e.kind == COPY_ON_WRITE]
    last_prompt_block = tables[0].block_table[-1]
    assert len(cow) == 3 and {e.block_id for e in cow} == {last_prompt_block}, "3 writers copy, the last writes in place"
    assert all(b.ref_counts[-1] == 1 for b in reports[1].block_tables)
    assert len(out.outputs) == 4 and [c.index for c in out.outputs] == [0, 1, 2, 3]
    assert out.text == out.outputs[0].text and out.token_ids == out.outputs[0].token_ids
    assert engine.kv.allocator.num_free == engine.num_blocks


@pytest.mark.slow
def test_copy_on_write_copies_every_layer_and_leaves_the_source_alone(engine):
    engine.add_request(STORY, SamplingParams(n=2, max_tokens=4, temperature=1.0, seed=2))
    engine.step()  # prefill + fork
    batch = engine.scheduler.schedule()
    (src, dst), = batch.blocks_to_copy
    before = [(k[src].clone(), v[src].clone()) for k, v in engine.runner.kv_caches]
    prompt_slots = len(engine.encode(STORY)) % 16
    engine.runner.execute(batch, engine.kv)
    for (k, v), (k0, v0) in zip(engine.runner.kv_caches, before):
        assert torch.equal(k[dst][:prompt_slots], k0[:prompt_slots]) and torch.equal(v[dst][:prompt_slots], v0[:prompt_slots])
        assert torch.equal(k[src][:prompt_slots], k0[:prompt_slots]), "the source block's prompt part is unchanged"
    for group in list(engine.scheduler.running):
        engine.scheduler.finish(group, "abort")
    assert engine.kv.allocator.num_free == engine.num_blocks


@pytest.mark.slow
def test_sharing_changes_no_number_teacher_forced(engine, default_model_dir):
    """Each sample replayed alone (prompt + its tokens, one forward pass of transformers, no
    sharing) gives the logprobs the engine computed while the samples shared blocks."""
    out, _ = run(engine, STORY, SamplingParams(n=3, max_tokens=12, temperature=1.0, seed=5))
    hf = transformers.AutoModelForCausalLM.from_pretrained(default_model_dir, dtype=torch.float32).eval()
    prompt = out.prompt_token_ids
    for sample in out.outputs:
        ids = torch.tensor([prompt + sample.token_ids])
        with torch.inference_mode():
            logprobs = torch.log_softmax(hf(ids).logits[0].float(), dim=-1)
        expected = [float(logprobs[len(prompt) - 1 + i, t]) for i, t in enumerate(sample.token_ids)]
        assert sample.logprobs == pytest.approx(expected, abs=1e-4), f"sample {sample.index}"


@pytest.mark.slow
def test_samples_are_seeded_and_sample_zero_is_the_single_sample(engine):
    params = SamplingParams(n=3, max_tokens=10, temperature=1.0, seed=42)
    a, _ = run(engine, STORY, params)
    b, _ = run(engine, STORY, params)
    single, _ = run(engine, STORY, SamplingParams(max_tokens=10, temperature=1.0, seed=42))
    assert [c.token_ids for c in a.outputs] == [c.token_ids for c in b.outputs]
    assert a.outputs[0].token_ids == single.token_ids
    assert len({tuple(c.token_ids) for c in a.outputs}) > 1, "different samples"


@pytest.mark.slow
@pytest.mark.parametrize("block_size, num_blocks", [(1, 150), (3, 50), (16, 9)])
def test_parallel_samples_survive_preemption_and_odd_block_sizes(default_model_dir, block_size, num_blocks):
    """A pool small enough to preempt the group (or odd block sizes) gives the same samples as a
    roomy one: recompute re-prefills the shared prompt once plus each sample's own tokens."""
    prompts = [STORY, [{"role": "user", "content": "Name three colours."}]]
    params = SamplingParams(n=3, max_tokens=12, temperature=0.9, seed=7, ignore_eos=True)

    def outputs(engine):
        ids = [engine.add_request(p, params) for p in prompts]
        reports = []
        while engine.has_unfinished_requests():
            reports.append(engine.step())
        return [[c.token_ids for c in engine.get_output(i).outputs] for i in ids], reports

    roomy, _ = outputs(LLMEngine(EngineConfig(block_size=16, num_gpu_blocks=128)))
    tight = LLMEngine(EngineConfig(block_size=block_size, num_gpu_blocks=num_blocks, max_num_seqs=8))
    got, reports = outputs(tight)
    assert got == roomy
    if block_size == 16:
        assert any(r.preempted for r in reports), "the pool was meant to force a preemption"
    assert tight.kv.allocator.num_free == num_blocks


# ---- beam search ----------------------------------------------------------------------------------

@torch.inference_mode()
def hf_beams(hf, prompt_ids, width, max_new_tokens, length_penalty=1.0):
    out = hf.generate(
        torch.tensor([prompt_ids]), attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
        num_beams=width, num_return_sequences=width, do_sample=False, max_new_tokens=max_new_tokens,
        length_penalty=length_penalty, early_stopping=False, pad_token_id=hf.generation_config.eos_token_id,
        temperature=None, top_p=None, top_k=None,
    )
    eos = hf.generation_config.eos_token_id
    beams = []
    for row in out[:, len(prompt_ids):].tolist():
        if eos in row:
            row = row[: row.index(eos) + 1]
        beams.append(row)
    return beams


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "qwen3"])
def test_beam_search_matches_transformers_on_tiny_models(model_type, tmp_path_factory, default_model_dir):
    directory = make_tiny_model(tmp_path_factory.mktemp(f"beam-{model_type}"), model_type, default_model_dir, seed=3)
    hf = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float64).eval()
    engine = LLMEngine(EngineConfig(model=str(directory), dtype="float64", block_size=4, num_gpu_blocks=200))
    g = torch.Generator().manual_seed(0)
    for width, length_penalty in [(2, 1.0), (3, 0.5)]:
        prompt = torch.randint(3, hf.config.vocab_size, (7,), generator=g).tolist()
        out, reports = run(engine, prompt, BeamSearchParams(beam_width=width, max_tokens=10, length_penalty=length_penalty))
        assert [s.token_ids for s in out.sequences] == hf_beams(hf, prompt, width, 10, length_penalty)
        assert any(e.kind == FORK for r in reports for e in r.events)
    assert engine.kv.allocator.num_free == 200


@pytest.mark.slow
@pytest.mark.parametrize("width", [2, 4])
def test_beam_search_matches_transformers_on_the_default_model(width, default_model_dir):
    llm = LLM(block_size=16, num_gpu_blocks=256, max_num_seqs=16)
    engine = llm.engine
    hf = transformers.AutoModelForCausalLM.from_pretrained(default_model_dir, dtype=torch.float32).eval()
    prompts = [STORY, [{"role": "user", "content": "What is the capital of France?"}],
               [{"role": "user", "content": "Explain a KV cache in one sentence."}],
               [{"role": "user", "content": "Write a haiku about memory."}]]
    outputs = llm.beam_search(prompts, BeamSearchParams(beam_width=width, max_tokens=24))
    for prompt, out in zip(prompts, outputs):
        expected = hf_beams(hf, engine.encode(prompt), width, 24)
        assert [s.token_ids for s in out.sequences] == expected
        assert all(s.text for s in out.sequences) and all(s.cumulative_logprob < 0 for s in out.sequences)
    assert engine.kv.allocator.num_free == 256


@pytest.mark.slow
def test_pruned_beams_free_their_blocks_at_once(engine):
    _, reports = run(engine, STORY, BeamSearchParams(beam_width=4, max_tokens=20))
    pruned = [e for r in reports for e in r.events if e.kind == FREE]
    assert pruned, "some beam was pruned and gave its references back"
    for r in reports:  # never more than beam_width live beams
        assert len(r.block_tables) <= 4
        held = Counter(b for t in r.block_tables for b in t.block_table)
        for t in r.block_tables:
            assert t.ref_counts == [held[b] for b in t.block_table]
    assert engine.kv.allocator.num_free == engine.num_blocks


# ---- bad input ------------------------------------------------------------------------------------

@pytest.mark.parametrize("make, message", [
    (lambda: SamplingParams(n=0), "n .parallel samples. must be an integer >= 1"),
    (lambda: BeamSearchParams(beam_width=0), "beam_width must be an integer >= 1"),
    (lambda: BeamSearchParams(beam_width=2, temperature=0.7), "deterministic: temperature must be 0"),
])
def test_bad_sharing_parameters_are_clear_errors(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_a_beam_width_the_pool_can_never_hold_is_refused_and_the_engine_keeps_serving(tiny_llama_dir):
    engine = LLMEngine(EngineConfig(model=str(tiny_llama_dir), block_size=4, num_gpu_blocks=12))
    with pytest.raises(ValueError, match="8 sequences of up to .* tokens can never fit in the KV pool"):
        engine.add_request([5, 6, 7, 8, 9], BeamSearchParams(beam_width=8, max_tokens=20))
    out, _ = run(engine, [5, 6, 7, 8, 9], BeamSearchParams(beam_width=2, max_tokens=4))
    assert len(out.sequences) == 2 and engine.kv.allocator.num_free == 12


def test_the_contiguous_allocator_copies_instead_of_sharing_with_the_same_tokens(tiny_llama_dir):
    """Before vLLM, each sequence had its own range and a fork copied the prompt's KV into it: the
    tokens are the paged allocator's, the memory is not (the compare page shows the difference)."""
    prompt = [5, 6, 7, 8, 9, 10, 11]
    results = {}
    for allocator in ("paged", "contiguous"):
        engine = LLMEngine(EngineConfig(model=str(tiny_llama_dir), block_size=4, num_gpu_blocks=64, allocator=allocator,
                                        reservation="oracle"))
        a = engine.add_request(prompt, SamplingParams(n=3, max_tokens=6, temperature=1.0, seed=3))
        b = engine.add_request(prompt, BeamSearchParams(beam_width=3, max_tokens=6))
        reports = []
        while engine.has_unfinished_requests():
            reports.append(engine.step())
        results[allocator] = ([c.token_ids for c in engine.get_output(a).outputs], [c.token_ids for c in engine.get_output(b).outputs],
                              max(r.memory.allocated for r in reports))
        if allocator == "contiguous":
            assert engine.kv.gap_starts == [0] and not engine.kv.ranges and not engine.kv.spare, "every range returned"
    assert results["paged"][:2] == results["contiguous"][:2]
    assert results["contiguous"][2] > results["paged"][2], "copies take more memory than shared blocks"
