"""The engine against transformers, and the invariants of its KV cache, scheduler and step reports."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
import transformers

from conftest import make_tiny_model
from test_cpu_ops import all_kernels
from engine import BeamSearchParams, EngineConfig, LLM, LLMEngine, SamplingParams
from engine.tools.bench import format_result
from engine.model_executor.model_loader import ModelLoadError

CHAT_PROMPTS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Explain what a KV cache is in one paragraph."}],
    [{"role": "user", "content": "Write a short poem about the sea."}],
    [{"role": "user", "content": "List three uses of a paged memory allocator."}],
]


def run_engine(engine: LLMEngine, prompts, params) -> tuple[list[list[int]], list]:
    """Generate through the step API; returns output token ids per prompt and every step report."""
    ids = [engine.add_request(p, params) for p in prompts]
    reports = []
    while engine.has_unfinished_requests():
        reports.append(engine.step())
    return [engine.get_output(i).token_ids for i in ids], reports


@torch.inference_mode()
def hf_greedy(hf_model, prompt_ids: list[int], max_new_tokens: int, eos: int | None) -> list[int]:
    hf_model.generation_config.eos_token_id = eos
    out = hf_model.generate(
        torch.tensor([prompt_ids]), attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
        max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=0, temperature=None, top_p=None, top_k=None,
    )
    return out[0, len(prompt_ids):].tolist()


def engine_prefill_logits(engine: LLMEngine, prompt_ids: list[int]) -> torch.Tensor:
    """Last-position logits of a prompt, through the engine's scheduler, paged KV cache and model."""
    engine.add_request(prompt_ids, SamplingParams(max_tokens=1))
    batch = engine.scheduler.schedule()
    logits = engine.runner.execute(batch, engine.kv)
    for seq in batch.prefill_seqs:
        engine.scheduler.finish(engine.requests[seq.request_id], "abort")
    return logits[0]


# ---- (a) tiny random Llama, Qwen2, Qwen3 and Gemma 3 against transformers, float64 ------------------

@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen3", "gemma3_text"])
def tiny_model(request, tmp_path_factory, default_model_dir):
    directory = make_tiny_model(tmp_path_factory.mktemp(request.param), request.param, default_model_dir, seed=1)
    hf = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float64).eval()
    return directory, hf


def random_prompts(vocab: int, lengths: list[int], seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]


def test_tiny_models_match_transformers_token_for_token(tiny_model):
    directory, hf = tiny_model
    engine = LLMEngine(EngineConfig(model=str(directory), dtype="float64", num_gpu_blocks=64))
    prompts = random_prompts(hf.config.vocab_size, [5, 17, 33, 2])
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    ours, _ = run_engine(engine, prompts, params)
    theirs = [hf_greedy(hf, p, 12, eos=None) for p in prompts]
    assert ours == theirs


def test_tiny_models_last_position_logits_match(tiny_model):
    directory, hf = tiny_model
    engine = LLMEngine(EngineConfig(model=str(directory), dtype="float64", num_gpu_blocks=64))
    prompt = random_prompts(hf.config.vocab_size, [21], seed=3)[0]
    ours = engine_prefill_logits(engine, prompt)
    with torch.inference_mode():
        theirs = hf(torch.tensor([prompt])).logits[0, -1].float()
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=0)


# ---- the same outputs whatever the block size, block order or pool size ----------------------

@pytest.fixture(scope="module")
def tiny_reference(tiny_llama_dir):
    prompts = random_prompts(49152, [3, 9, 16, 31, 40], seed=5)
    params = SamplingParams(max_tokens=20, ignore_eos=True)
    engine = LLMEngine(EngineConfig(model=str(tiny_llama_dir), dtype="float64", num_gpu_blocks=64))
    outputs, _ = run_engine(engine, prompts, params)
    return prompts, params, outputs


@pytest.mark.parametrize("block_size", [1, 3, 16, 64])
def test_outputs_do_not_depend_on_block_size_or_block_order(tiny_llama_dir, tiny_reference, block_size):
    prompts, params, expected = tiny_reference
    num_blocks = 1024 // block_size
    config = EngineConfig(model=str(tiny_llama_dir), dtype="float64", block_size=block_size, num_gpu_blocks=num_blocks, shuffle_blocks=True, seed=block_size)
    engine = LLMEngine(config)
    outputs, reports = run_engine(engine, prompts, params)
    assert outputs == expected
    handed_out = [e.block_id for r in reports for e in r.events if e.kind == "allocate"]
    assert handed_out[: len(set(handed_out))] != list(range(len(set(handed_out)))), "block assignment should not be the identity"


def test_outputs_survive_preemption_by_recompute(tiny_llama_dir, tiny_reference):
    prompts, params, expected = tiny_reference
    # 5 requests of up to 60 tokens in a pool of 96 slots: they cannot all stay resident.
    engine = LLMEngine(EngineConfig(model=str(tiny_llama_dir), dtype="float64", block_size=4, num_gpu_blocks=24))
    outputs, reports = run_engine(engine, prompts, params)
    preempted = [r for r in reports if r.preempted]
    assert preempted, "the pool was meant to run out"
    assert outputs == expected
    kinds = [e.kind for e in preempted[0].events]
    assert "preempt" in kinds and "free" in kinds


# ---- (b) the default model against transformers ----------------------------------------------

@pytest.fixture(scope="module")
def default_engine():
    return LLMEngine(EngineConfig(max_num_seqs=8))


@pytest.mark.slow
def test_default_model_matches_transformers_on_chat_prompts(default_engine, default_model_dir):
    engine = default_engine
    hf = transformers.AutoModelForCausalLM.from_pretrained(default_model_dir, dtype=torch.float32).eval()
    prompt_ids = [engine.encode(p) for p in CHAT_PROMPTS]
    params = SamplingParams(max_tokens=40)
    ours, _ = run_engine(engine, prompt_ids, params)
    theirs = [hf_greedy(hf, p, 40, eos=engine.tokenizer.eos_token_id) for p in prompt_ids]
    assert ours == theirs
    assert sum(len(o) for o in ours) >= 4 * 32 - 40, "most answers should run well past 32 tokens"
    for p in prompt_ids[:2]:
        with torch.inference_mode():
            expected = hf(torch.tensor([p])).logits[0, -1].float()
        torch.testing.assert_close(engine_prefill_logits(engine, p), expected, atol=1e-4, rtol=0)


@pytest.mark.slow
def test_default_model_same_outputs_with_odd_blocks_shuffled_and_preempted(default_engine):
    prompt_ids = [default_engine.encode(p) for p in CHAT_PROMPTS]
    params = SamplingParams(max_tokens=36, ignore_eos=True)
    expected, _ = run_engine(default_engine, prompt_ids, params)
    small = LLMEngine(EngineConfig(block_size=3, num_gpu_blocks=60, shuffle_blocks=True, seed=7))
    outputs, reports = run_engine(small, prompt_ids, params)
    assert any(r.preempted for r in reports)
    assert outputs == expected


# ---- step reports ----------------------------------------------------------------------------

def test_step_report_tells_the_whole_story(tiny_llama_dir):
    engine = LLMEngine(EngineConfig(model=str(tiny_llama_dir), block_size=4, num_gpu_blocks=32))
    a = engine.add_request([5, 6, 7, 8, 9], SamplingParams(max_tokens=4, ignore_eos=True))
    first = engine.step()
    assert first.phase == "prefill" and first.num_tokens == 5
    allocations = [e for e in first.events if e.kind == "allocate"]
    assert [e.logical_index for e in allocations] == [0, 1]
    writes = [e for e in first.events if e.kind == "write"]
    table = first.block_tables[0].block_table
    assert [w.slot for w in writes] == [table[p // 4] * 4 + p % 4 for p in range(5)]
    assert first.block_tables[0].filled == [4, 1]
    m = first.memory
    assert (m.token_states, m.internal_fragmentation, m.free) == (5, 3, 128 - 8)
    assert m.bytes("token_states") == 5 * engine.bytes_per_slot
    b = engine.add_request([1, 2, 3], SamplingParams(max_tokens=2, ignore_eos=True))
    second = engine.step()
    assert second.phase == "mixed"
    assert {(s.request_id, s.phase) for s in second.scheduled} == {(a, "decode"), (b, "prefill")}
    reports = [engine.step() for _ in range(3)]
    assert engine.get_output(a).finish_reason == "length" and len(engine.get_output(a).token_ids) == 4
    assert any(e.kind == "finish" for r in reports for e in r.events)
    assert reports[-1].memory.free == 128 and not engine.has_unfinished_requests()
    for r in [first, second, *reports]:
        assert "total" in r.timings_ms and r.new_token_ids.keys() == {s.request_id for s in r.scheduled}


def test_abort_frees_blocks_and_the_engine_keeps_serving(tiny_llama_dir):
    engine = LLMEngine(EngineConfig(model=str(tiny_llama_dir), block_size=4, num_gpu_blocks=16))
    a = engine.add_request([4] * 10, SamplingParams(max_tokens=30, ignore_eos=True))
    engine.step()
    engine.abort_request(a)
    assert engine.get_output(a).finish_reason == "abort"
    assert engine.memory_usage().free == 64
    b = engine.add_request([4] * 10, SamplingParams(max_tokens=3))
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.get_output(b).finished


def test_stop_strings_and_sampling_are_honoured(tiny_llama_dir):
    engine = LLMEngine(EngineConfig(model=str(tiny_llama_dir)))
    free_run, _ = run_engine(engine, [[10, 11, 12]], SamplingParams(max_tokens=8, ignore_eos=True))
    text = engine.tokenizer.decode(free_run[0], skip_special_tokens=True)
    stop = text[len(text) // 2 :][:3]
    if stop.strip():
        rid = engine.add_request([10, 11, 12], SamplingParams(max_tokens=8, ignore_eos=True, stop=[stop]))
        while engine.has_unfinished_requests():
            engine.step()
        out = engine.get_output(rid)
        assert out.finish_reason == "stop" and stop not in out.text
    seeded = SamplingParams(max_tokens=6, temperature=0.8, top_k=50, top_p=0.9, seed=123, ignore_eos=True)
    first, _ = run_engine(engine, [[10, 11, 12]], seeded)
    again, _ = run_engine(engine, [[10, 11, 12]], seeded)
    assert first == again


# ---- bad input: a clear error, nothing queued, the engine still serves ------------------------

@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: SamplingParams(max_tokens=0), "max_tokens"),
        (lambda: SamplingParams(temperature=-1), "temperature"),
        (lambda: SamplingParams(top_p=0), "top_p"),
        (lambda: SamplingParams(top_p=1.5), "top_p"),
        (lambda: SamplingParams(temperature=float("inf")), "temperature"),
        (lambda: SamplingParams(temperature=float("nan")), "temperature"),
        (lambda: SamplingParams(top_k=True), "top_k"),
        (lambda: SamplingParams(top_k=2.5), "top_k"),
        (lambda: SamplingParams(stop=[123]), "stop"),
        (lambda: SamplingParams(stop=[""]), "stop"),
        (lambda: SamplingParams(stop=123), "stop"),
        (lambda: SamplingParams(stop_token_ids=5), "stop_token_ids"),
        (lambda: SamplingParams(stop_token_ids=[-1]), "stop_token_ids"),
        (lambda: SamplingParams(stop_token_ids=[True]), "stop_token_ids"),
        (lambda: SamplingParams(ignore_eos="no"), "ignore_eos"),
        (lambda: SamplingParams(n=True), "n "),
        (lambda: SamplingParams(max_tokens=2.0), "max_tokens"),
        (lambda: SamplingParams(seed=-1), "seed"),
        (lambda: BeamSearchParams(beam_width=2, length_penalty=float("nan")), "length_penalty"),
        (lambda: BeamSearchParams(beam_width=2, length_penalty=float("inf")), "length_penalty"),
        (lambda: BeamSearchParams(beam_width=True), "beam_width"),
        (lambda: BeamSearchParams(beam_width=2, ignore_eos=None), "ignore_eos"),
        (lambda: EngineConfig(block_size=0), "block_size"),
        (lambda: EngineConfig(num_gpu_blocks=-3), "num_gpu_blocks"),
        (lambda: EngineConfig(allocator="buddy"), "allocator"),
    ],
)
def test_bad_settings_are_refused_clearly(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_none_means_no_stop_strings_or_stop_tokens_as_in_vllm():
    params = SamplingParams(stop=None, stop_token_ids=None)
    assert params.stop == [] and params.stop_token_ids == []
    assert SamplingParams(stop="\n", stop_token_ids=(7,)).stop == ["\n"]


def test_stop_token_ids_outside_the_vocabulary_are_refused_at_add_request(tiny_llama_dir):
    engine = LLMEngine(EngineConfig(model=str(tiny_llama_dir), num_gpu_blocks=16))
    with pytest.raises(ValueError, match="stop_token_ids"):
        engine.add_request([5, 6], SamplingParams(stop_token_ids=[10**9]))
    assert not engine.has_unfinished_requests() and not engine.requests


def run_until_done(engine: LLMEngine, limit: int = 100) -> list:
    reports = []
    while engine.has_unfinished_requests() and len(reports) < limit:
        reports.append(engine.step())
    return reports


@pytest.mark.parametrize("field, value", [("stop", [123]), ("top_k", "all"), ("temperature", "hot"), ("stop_token_ids", 5)])
def test_a_request_that_fails_inside_a_step_fails_alone(tiny_llama_dir, field, value):
    """Fields changed after validation (the dataclass is not frozen) break a request inside the
    step: it finishes with reason "error" and its error, alone; the others run to their end."""
    engine = LLMEngine(EngineConfig(model=str(tiny_llama_dir), block_size=4, num_gpu_blocks=32))
    good = SamplingParams(max_tokens=4, ignore_eos=True)
    before = engine.add_request([5, 6, 7], good)
    bad_params = SamplingParams(max_tokens=4, ignore_eos=True, temperature=0.8, seed=3)
    bad = engine.add_request([8, 9, 10, 11], bad_params)
    samples = engine.add_request([4, 5, 6], SamplingParams(max_tokens=4, ignore_eos=True, n=2, temperature=0.8, seed=1))
    after = engine.add_request([7, 8], good)
    setattr(bad_params, field, value)
    with pytest.raises(ValueError, match=field):  # caught when a request is added with them
        engine.add_request([1, 2], bad_params)
    reports = run_until_done(engine)
    assert not engine.has_unfinished_requests()
    failed = [r for r in reports if bad in r.errors]
    assert len(failed) == 1 and failed[0].finished[bad] == "error"
    assert failed[0].errors[bad].startswith(("TypeError", "ValueError", "AttributeError")), failed[0].errors[bad]
    assert any(e.kind == "finish" and e.request_id == bad and e.detail.startswith("error: ") for e in failed[0].events)
    out = engine.get_output(bad)
    assert out.finish_reason == "error" and out.error == failed[0].errors[bad]
    for rid in (before, samples, after):
        assert engine.get_output(rid).finish_reason == "length"
        assert all(len(o.token_ids) == 4 for o in engine.get_output(rid).outputs)
    assert engine.memory_usage().free == 32 * 4, "the failed request's blocks are back in the pool"


def test_a_request_whose_sampling_fails_leaves_the_others_their_seeded_tokens(tiny_llama_dir):
    """The batched sampling call fails on one row; every other row's token is what it would have been."""
    def run(with_bad: bool):
        engine = LLMEngine(EngineConfig(model=str(tiny_llama_dir), num_gpu_blocks=32))
        ids = [engine.add_request([5, 6, 7], SamplingParams(max_tokens=5, temperature=0.9, seed=s, ignore_eos=True)) for s in (1, 2)]
        ids.append(engine.add_request([5, 6, 7], SamplingParams(max_tokens=5, temperature=0.9, seed=3, ignore_eos=True)))
        if with_bad:
            bad = SamplingParams(max_tokens=5, temperature=0.9, seed=4)
            engine.add_request([9, 9, 9], bad)
            bad.top_p = "most"  # changed after add_request: it breaks inside the step
        run_until_done(engine)
        return [engine.get_output(i).token_ids for i in ids]

    assert run(True) == run(False)


def test_after_a_failure_and_an_abort_the_engine_serves_on(tiny_llama_dir):
    engine = LLMEngine(EngineConfig(model=str(tiny_llama_dir), block_size=4, num_gpu_blocks=32))
    bad_params = SamplingParams(max_tokens=6, ignore_eos=True)
    bad = engine.add_request([5, 6, 7], bad_params)
    bad_params.stop = [123]
    slow = engine.add_request([5, 6, 7, 8], SamplingParams(max_tokens=12, ignore_eos=True))
    first = engine.step()
    assert first.finished == {bad: "error"} and "TypeError" in first.errors[bad]
    engine.step()
    engine.abort_request(slow)
    assert engine.get_output(slow).finish_reason == "abort"
    again = engine.add_request([5, 6, 7], SamplingParams(max_tokens=3, ignore_eos=True))
    run_until_done(engine)
    assert len(engine.get_output(again).token_ids) == 3 and engine.memory_usage().free == 32 * 4


def test_finished_requests_are_released_once_their_outputs_are_taken(tiny_llama_dir):
    engine = LLMEngine(EngineConfig(model=str(tiny_llama_dir), num_gpu_blocks=64))
    ids = [engine.add_request([5 + i, 6, 7], params) for i, params in enumerate([
        SamplingParams(max_tokens=3, ignore_eos=True), SamplingParams(max_tokens=4, ignore_eos=True, stop=["zz"]),
        SamplingParams(max_tokens=3, n=3, temperature=0.7, seed=2, ignore_eos=True),
        BeamSearchParams(beam_width=3, max_tokens=4, ignore_eos=True)])]
    ids.append(engine.add_request([1, 2, 3], SamplingParams(max_tokens=9)))
    engine.step()
    engine.abort_request(ids[-1])
    run_until_done(engine)
    texts = [engine.get_output(i).text for i in ids]
    assert not engine.generators, "finished sequences keep no random generator"
    outputs = [engine.take_output(i) for i in ids]
    assert [o.text for o in outputs] == texts
    assert engine.requests == {} and engine.generators == {} and engine.errors == {}
    assert engine.detokenizer.texts == {} and engine.detokenizer.emitted == {} and engine.detokenizer._stable == {}
    assert engine.kv.num_committed_blocks == {}
    with pytest.raises(KeyError, match="already taken"):
        engine.take_output(ids[0])
    running = engine.add_request([5, 6], SamplingParams(max_tokens=3))
    with pytest.raises(ValueError, match="not finished"):
        engine.take_output(running)


def test_llm_generate_leaves_nothing_behind_in_its_engine(tiny_llama_dir):
    llm = LLM(model=str(tiny_llama_dir), num_gpu_blocks=64)
    for _ in range(3):
        outs = llm.generate([[5, 6, 7], [8, 9]], SamplingParams(max_tokens=3, ignore_eos=True))
        assert [len(o.token_ids) for o in outs] == [3, 3]
    assert llm.engine.requests == {} and llm.engine.generators == {} and llm.engine.texts == {}


def test_bad_requests_leave_the_engine_usable(tiny_llama_dir):
    engine = LLMEngine(EngineConfig(model=str(tiny_llama_dir), block_size=4, num_gpu_blocks=8))
    with pytest.raises(ValueError, match="empty"):
        engine.add_request("")
    with pytest.raises(ValueError, match="empty"):
        engine.add_request([])
    with pytest.raises(ValueError, match="never fit|max_model_len|KV pool"):
        engine.add_request([7] * 40)
    with pytest.raises(ValueError, match="token ids"):
        engine.add_request([10**9])
    assert not engine.has_unfinished_requests()
    rid = engine.add_request([7, 8, 9], SamplingParams(max_tokens=3, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()
    assert len(engine.get_output(rid).token_ids) == 3


def test_unknown_model_path_is_a_clear_error(tmp_path):
    with pytest.raises(ModelLoadError, match="nowhere"):
        LLMEngine(EngineConfig(model=str(tmp_path / "nowhere")))


def test_kv_budget_smaller_than_one_block_is_refused(tiny_llama_dir):
    with pytest.raises(ValueError, match="smaller than one block"):
        LLMEngine(EngineConfig(model=str(tiny_llama_dir), kv_cache_memory=100))


# ---- the Triton backend generates what the torch backend does -------------------------------

def test_triton_backend_generates_the_same_tokens(tiny_llama_dir):
    prompts = random_prompts(49152, [7, 20], seed=9)
    params = SamplingParams(max_tokens=5, ignore_eos=True)
    outputs = {}
    for backend in ("torch", "triton"):
        engine = LLMEngine(EngineConfig(model=str(tiny_llama_dir), attention_backend=backend, block_size=8, num_gpu_blocks=16, shuffle_blocks=True))
        outputs[backend], _ = run_engine(engine, prompts, params)
    assert outputs["triton"] == outputs["torch"]


# ---- the command line ------------------------------------------------------------------------

def test_generate_command_prints_json(tiny_llama_dir):
    cmd = [sys.executable, "-m", "engine", "generate", "Hello there", "What is 2+2?", "--model", str(tiny_llama_dir), "--max-tokens", "3", "--block-size", "4", "--json"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert len(data["outputs"]) == 2 and data["steps"][0]["phase"] == "prefill"
    bad = subprocess.run(cmd[:-1] + ["--block-size", "0"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "block_size" in bad.stderr


def test_bench_command_compares_with_transformers(tiny_llama_dir):
    """The bench runs both sides on the real workload shape (tiny model, short) and finds them identical."""
    cmd = [sys.executable, "-m", "engine", "bench", "--model", str(tiny_llama_dir), "--num-prompts", "4",
           "--min-tokens", "2", "--max-tokens", "9", "--repeats", "2", "--json"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["tokens"] == sum([2, 4, 7, 9]) and len(data["engine_runs_s"]) == len(data["ratios"]) == 2
    assert data["outputs_identical"], data["mismatches"]
    assert data["ratio"] == pytest.approx(data["hf_seconds"] / data["engine_seconds"])
    # Continuous batching: the engine's decode batch shrinks from 4 requests to 1 as they finish.
    assert set(data["engine_decode_step_ms_by_batch"]) == {"4", "3", "2", "1"}
    assert data["engine_cpu_backend"].split(";")[0] == all_kernels()
    # Which ISA it ran on, and on which CPU: the loaded kernels' (all_kernels() loaded this process's, the same build).
    from engine.cpu import ops as cpu_ops

    assert data["isa"]["isa"] == cpu_ops.matmul_simd() and data["isa"]["cpu_isa"] == cpu_ops.cpu_isa()
    assert f"measured on: ISA {cpu_ops.matmul_simd()} (" in format_result(data)
    # The roofline: every decode step of the fastest engine run against the machine's measured limits (the
    # prefill gives each request its first token; max_tokens 2, 4, 7, 9 then take 1 step at batch 4, 2 at 3...).
    steps = data["roofline"]["steps"]
    assert [s["batch"] for s in steps] == [4, 3, 3, 2, 2, 2, 1, 1]
    assert all(0 < s["roofline_ms"] and 0 < s["share"] == pytest.approx(s["roofline_ms"] / s["ms"]) for s in steps)
    assert data["roofline"]["peaks"]["bandwidth_gb_s"] > 0 and data["roofline"]["mean_share"] > 0
    assert data["roofline"]["peaks"]["dtype"] == "float32"
    assert data["roofline"]["peaks"]["read_gb_s"] > 0 and 0 < data["roofline"]["mean_tight_share"] <= data["roofline"]["mean_share"] + 1e-9
    assert data["roofline"]["run"] == min(range(2), key=data["engine_runs_s"].__getitem__)
    assert data["roofline"]["mean_share_by_run"][data["roofline"]["run"]] == data["roofline"]["mean_share"]
    assert len(data["roofline"]["mean_share_by_run"]) == len(data["roofline"]["mean_tight_share_by_run"]) == 2
    # The machine measured at the start, after each of the 2 engine runs and at the end; the roofline's peaks
    # are the best of each figure.
    samples = data["roofline"]["peak_samples"]
    assert len(samples) == 4
    for key in ("bandwidth_gb_s", "matmul_gflop_s", "read_gb_s"):
        assert data["roofline"]["peaks"][key] == max(s[key] for s in samples)
    low, high = min(s["bandwidth_gb_s"] for s in samples), max(s["bandwidth_gb_s"] for s in samples)
    assert f"the machine measured 4 times, at the start, after each engine run and at the end: copy {low:.1f}-{high:.1f} GB/s" in format_result(data)
    # Prefix caching off on every side by default (vLLM's bench side has it off too): the workload repeats
    # its prompts, so with it on the engine alone would skip most of each run's prefill.
    assert data["prefix_caching"] is False and data["engine_prefix_cache_hits"] == 0
    assert "prefix caching: off on every side" in format_result(data)
    plain = subprocess.run(cmd + ["--no-cpu-kernels", "--repeats", "1", "--prefix-caching"], capture_output=True, text=True, timeout=600)
    assert plain.returncode == 0, plain.stderr
    plain_data = json.loads(plain.stdout)
    assert plain_data["engine_cpu_backend"].split(";")[0] == "torch"
    assert plain_data["prefix_caching"] is True and plain_data["engine_prefix_cache_hits"] > 0  # every full prompt block, after the warm-up
    assert plain_data["outputs_identical"], plain_data["mismatches"]
    bad = subprocess.run(cmd[:-1] + ["--repeats", "0"], capture_output=True, text=True, timeout=600)
    assert bad.returncode == 2 and "repeats" in bad.stderr
    bad = subprocess.run(cmd[:-1] + ["--min-tokens", "20"], capture_output=True, text=True, timeout=600)
    assert bad.returncode == 2 and "--min-tokens (20) must not exceed --max-tokens (9)" in bad.stderr


# ---- failures inside a step, and the order Triton is imported in -----------------------------

def test_a_failed_step_loses_no_request_and_leaves_the_engine_usable(tiny_llama_dir):
    engine = LLMEngine(EngineConfig(model=str(tiny_llama_dir), block_size=4, num_gpu_blocks=16))
    # Real fault, not a stand-in: a final norm of the wrong size makes the forward pass itself fail,
    # after the attention layers have written the KV cache.
    norm = engine.runner.model.model.norm
    weight = norm.weight.data
    norm.weight.data = weight[:-1].clone()
    rid = engine.add_request([5, 6, 7], SamplingParams(max_tokens=3, temperature=0.8, seed=1))
    with pytest.raises(RuntimeError):
        engine.step()
    group = engine.requests[rid]
    assert group in engine.scheduler.waiting and group.seqs[0].finish_reason is None, "the request must still be queued"
    assert engine.memory_usage().free == 64 and not group.seqs[0].block_table, "its blocks must be back in the pool"
    norm.weight.data = weight
    run_until_done(engine)
    assert len(engine.get_output(rid).token_ids) == 3, "it runs once the fault is gone"


def test_nan_logits_fail_the_sampling_request_alone(tiny_llama_dir):
    engine = LLMEngine(EngineConfig(model=str(tiny_llama_dir), block_size=4, num_gpu_blocks=16))
    engine.runner.model.model.norm.weight.data.fill_(float("nan"))  # every logit NaN
    rid = engine.add_request([5, 6, 7], SamplingParams(max_tokens=3, temperature=0.8, seed=1))
    report = engine.step()
    assert report.finished == {rid: "error"} and "RuntimeError" in report.errors[rid]
    assert engine.memory_usage().free == 64 and not engine.has_unfinished_requests()


def test_triton_backend_works_after_torch_imported_triton(tiny_llama_dir):
    script = f"""
import sys
from engine import LLMEngine, EngineConfig, SamplingParams
outs = []
for backend in ("torch", "triton"):  # the torch run makes torch import Triton first
    e = LLMEngine(EngineConfig(model={str(tiny_llama_dir)!r}, attention_backend=backend, block_size=8, num_gpu_blocks=8))
    rid = e.add_request([5, 6, 7, 8, 9], SamplingParams(max_tokens=3, ignore_eos=True))
    while e.has_unfinished_requests():
        e.step()
    outs.append(e.get_output(rid).token_ids)
assert outs[0] == outs[1], outs
print("same", outs[0])
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0 and "same" in result.stdout, result.stderr[-2000:]


def test_malformed_prompts_are_clear_errors(tiny_llama_dir):
    from engine import LLM

    llm = LLM(str(tiny_llama_dir), num_gpu_blocks=16)
    with pytest.raises(ValueError, match="role"):
        llm.engine.add_request([{"foo": "bar"}])
    for bad in (None, 5, []):
        with pytest.raises(ValueError, match="prompts"):
            llm.generate(bad)
    assert SamplingParams(temperature=1e-45).greedy  # a vanishing temperature means greedy, as in vLLM
    with pytest.raises(ValueError, match="seed"):
        SamplingParams(seed="a")


def test_a_pool_too_large_to_allocate_is_a_clear_error(tiny_llama_dir):
    with pytest.raises(ValueError, match="cannot allocate"):
        LLMEngine(EngineConfig(model=str(tiny_llama_dir), block_size=1024, num_gpu_blocks=10**9))


def test_cli_reports_missing_files_without_a_traceback(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "engine", "simulate", "--trace", str(tmp_path / "missing.jsonl")],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 2 and "error:" in result.stderr and "Traceback" not in result.stderr


def test_the_bench_waits_for_a_quiet_machine_before_each_run(monkeypatch, tmp_path):
    import threading
    import time

    from engine.tools import bench

    monkeypatch.setattr(bench, "SETTLE_S", 0.05)
    assert 0.05 <= bench.settle() < bench.SETTLE_MAX_S  # nothing else running: little more than SETTLE_S
    stop = time.perf_counter() + 0.6

    def busy():  # one core's worth of work for 0.6 s
        while time.perf_counter() < stop:
            pass

    worker = threading.Thread(target=busy)
    worker.start()
    waited = bench.settle()
    worker.join()
    assert waited >= 0.45  # until the busy thread ended (0.6 s after it started)
    monkeypatch.setattr(bench, "SETTLE_MAX_S", 0.2)
    stop = time.perf_counter() + 1.0
    worker = threading.Thread(target=busy)
    worker.start()
    assert bench.settle() < 0.5  # never longer than SETTLE_MAX_S (and a window)
    worker.join()
    monkeypatch.setattr(bench, "PROC_STAT", str(tmp_path / "absent"))  # not Linux: SETTLE_S only
    assert bench._cpu_busy_s() is None and bench.settle() < 0.2
