"""A decode step's decoder layer as one C++ call (engine.cpu.ops.decode_layer, engine/cpu/csrc/decode_layer.cpp):
bit for bit what the modules of engine/model_executor/model.py compute, on the same paged KV caches."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.profiler import ProfilerActivity, profile

from conftest import make_tiny_model
from engine import EngineConfig, LLMEngine, SamplingParams
from engine.cpu import ops as cpu_ops
from engine.model_executor.model import AttentionMetadata
from engine.model_executor.model_runner import CPU_KERNEL_BACKEND, TORCH_BACKEND
from engine.model_executor.attention import plan_writes
from paged_cases import make_paged_kv

MODEL_TYPES = ["llama", "qwen2", "qwen3"]  # qwen2: biases on q, k, v; qwen3: RMSNorm on q and k


def skip_without_the_matmul_kernel() -> None:
    """A layer in one C++ call runs on the engine's matmul (AVX-512 or AVX2); elsewhere each module runs on its own."""
    assert cpu_ops.load_kernel(), cpu_ops.kernel_error()
    if cpu_ops.matmul_simd() not in cpu_ops.MATMUL_ISAS:
        pytest.skip("a decoder layer in one C++ call needs the engine's matmul, AVX-512 or AVX2 (this build runs the modules)")


@pytest.fixture(scope="module")
def models(tmp_path_factory, default_model_dir):
    """(model type, dtype) -> the engine's model, with its CPU kernels."""
    assert cpu_ops.load_kernel(), cpu_ops.kernel_error()
    skip_without_the_matmul_kernel()
    dtypes = ["float32"] + (["bfloat16"] if cpu_ops.matmul_bf16() else [])
    out = {}
    for model_type in MODEL_TYPES:
        directory = make_tiny_model(tmp_path_factory.mktemp(model_type), model_type, default_model_dir, seed=3, initializer_range=0.1)
        for dtype in dtypes:
            model = LLMEngine(EngineConfig(model=str(directory), dtype=dtype, num_gpu_blocks=16)).runner.model
            assert model.decode_layers, (model_type, dtype)
            with torch.no_grad():  # transformers initialises biases to zero, which would hide a bias left out
                for m in model.modules():
                    if isinstance(m, torch.nn.Linear) and m.bias is not None:
                        m.bias.copy_(torch.randn(m.bias.shape, generator=torch.Generator().manual_seed(m.bias.numel())) * 0.1)
            out[model_type, dtype] = model
    return out


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bits as integers: NaN == NaN, and -0.0 != 0.0."""
    return t.view(torch.int32 if t.element_size() == 4 else torch.int16)


def _step(model, ctx_lens, block_size, dtype, seed, first):
    """Inputs of one decode step for one layer: hidden (and residual), RoPE angles, paged caches, metadata."""
    gen = torch.Generator().manual_seed(seed)
    hidden_size = model.config.hidden_size
    key_cache, value_cache, tables, lens = make_paged_kv(ctx_lens, block_size, model.num_kv_heads, model.head_dim, dtype, seed=seed, device="cpu")
    last = torch.tensor(ctx_lens) - 1  # this step's token: the last position of each context
    slots = tables.long().gather(1, (last // block_size)[:, None])[:, 0] * block_size + last % block_size
    n = len(ctx_lens)
    hidden = torch.randn(n, hidden_size, generator=gen).to(dtype)
    residual = None if first else torch.randn(n, hidden_size, generator=gen).to(dtype)
    cos, sin = model.rotary_emb(last, dtype)
    empty = torch.zeros(0, dtype=torch.int32)
    meta = AttentionMetadata(slots, 0, torch.zeros(1, dtype=torch.int32), empty, empty.reshape(0, 1), lens, tables,
                             CPU_KERNEL_BACKEND, plan_writes(slots, tables, lens, block_size))
    return hidden, residual, cos, sin, key_cache, value_cache, meta


# A decode step's inputs: model, dtype, block size and seed (the contexts are drawn by each test).
STEP = dict(model_type=st.sampled_from(MODEL_TYPES), bf16=st.booleans(), block_size=st.sampled_from([1, 16, 48]), seed=st.integers(0, 2**31 - 1))


@settings(max_examples=30, deadline=None)
@given(**STEP, ctx_lens=st.lists(st.integers(1, 70), min_size=1, max_size=20), first=st.booleans())
@torch.inference_mode()
def test_decode_layer_is_the_module_path_bit_for_bit(models, model_type, bf16, ctx_lens, block_size, first, seed):
    dtype = "bfloat16" if bf16 and (model_type, "bfloat16") in models else "float32"
    model = models[model_type, dtype]
    layer = model.model.layers[1]
    hidden, residual, cos, sin, key_cache, value_cache, meta = _step(model, ctx_lens, block_size, getattr(torch, dtype), seed, first)
    caches = [(key_cache.clone(), value_cache.clone()) for _ in range(2)]
    # The modules' norms write over the hidden and residual they are given (vLLM's fused_add_rms_norm): each path its own copies.
    modules = layer(hidden.clone(), None if residual is None else residual.clone(), cos, sin, caches[0], meta)
    one_call = layer.decode(hidden, residual, cos, sin, caches[1], meta)
    for a, b in zip(modules, one_call):
        assert a.dtype == b.dtype and torch.equal(_bits(a), _bits(b))
    for a, b in zip(caches[0], caches[1]):  # the same slots written with the same K and V; NaN elsewhere untouched
        assert torch.equal(_bits(a), _bits(b))
    assert not torch.equal(_bits(caches[1][0]), _bits(key_cache))  # this step's K was written


def _all_layers(model, ctx_lens, block_size, dtype, seed):
    """A whole decode step's inputs: input_ids, positions, every layer's own paged caches, metadata."""
    _, _, _, _, key_cache, value_cache, meta = _step(model, ctx_lens, block_size, dtype, seed, False)
    caches = [(key_cache.clone(), value_cache.clone()) for _ in range(model.num_layers)]  # NaN in every unused slot, as there
    gen = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, model.config.vocab_size, (len(ctx_lens),), generator=gen)
    return input_ids, torch.tensor(ctx_lens) - 1, caches, meta


@settings(max_examples=20, deadline=None)
@given(**STEP, ctx_lens=st.lists(st.integers(1, 70), min_size=1, max_size=16))
@torch.inference_mode()
def test_all_layers_in_one_call_are_the_per_layer_calls_and_the_modules_bit_for_bit(models, model_type, bf16, ctx_lens, block_size, seed):
    dtype = "bfloat16" if bf16 and (model_type, "bfloat16") in models else "float32"
    model = models[model_type, dtype]
    assert model.layers_decode_weights is not None and model.num_layers > 1
    input_ids, positions, caches, meta = _all_layers(model, ctx_lens, block_size, getattr(torch, dtype), seed)
    saved = model.layers_decode_weights
    results = []
    try:
        for all_layers, per_layer in ((True, True), (False, True), (False, False)):  # one call; a call per layer; the modules
            model.layers_decode_weights = saved if all_layers else None
            model.decode_layers = per_layer
            step_caches = [(k.clone(), v.clone()) for k, v in caches]
            results.append((model(input_ids, positions, step_caches, meta), step_caches))
    finally:
        model.layers_decode_weights, model.decode_layers = saved, True
    for out, step_caches in results[1:]:
        assert torch.equal(_bits(out), _bits(results[0][0]))
        for (k, v), (k0, v0) in zip(step_caches, results[0][1]):
            assert torch.equal(_bits(k), _bits(k0)) and torch.equal(_bits(v), _bits(v0))


@torch.inference_mode()
def test_all_layers_call_refuses_bad_lists_before_writing_and_stays_usable(models):
    model = models["llama", "float32"]
    input_ids, positions, caches, meta = _all_layers(model, [5, 17], 16, torch.float32, 0)
    weights, biases, sizes, scale, eps = model.layers_decode_weights
    hidden = model.model.embed_tokens(input_ids)
    cos, sin = model.rotary_emb(positions, hidden.dtype)
    before = [k.clone() for k, _ in caches]
    norm = model.model.norm
    args = [meta.slot_mapping, meta.decode_block_tables, meta.decode_context_lens]

    def call(kv=caches, w=weights, b=biases):
        return cpu_ops.decode_layers(hidden, cos, sin, kv, *args, w, b, sizes, scale, eps, norm.weight, norm.eps)

    with pytest.raises(RuntimeError, match="weights must be 9 .* per layer"):
        call(w=weights[:-1])
    with pytest.raises(RuntimeError, match="biases must be 7 per layer"):
        call(b=biases[:-1])
    with pytest.raises(RuntimeError, match="one per layer"):
        cpu_ops.decode_layers(hidden, cos, sin, [], *args, weights, biases, sizes, scale, eps, norm.weight, norm.eps)
    smaller = [caches[0], (caches[1][0][:-1], caches[1][1][:-1])]  # layer 1's pools one block short
    with pytest.raises(RuntimeError, match="layer 1's key_cache and value_cache must have layer 0's shape"):
        call(kv=smaller)
    assert all(torch.equal(_bits(k), _bits(b)) for (k, _), b in zip(caches, before))  # nothing written, not even layer 0
    out = call()
    assert out.shape == hidden.shape and not torch.equal(_bits(caches[0][0]), _bits(before[0]))


@torch.inference_mode()
def test_decode_layer_refuses_bad_inputs_before_writing_and_stays_usable(models):
    model = models["llama", "float32"]
    layer = model.model.layers[0]
    hidden, residual, cos, sin, key_cache, value_cache, meta = _step(model, [5, 17], 16, torch.float32, 0, False)
    before = key_cache.clone()
    weights, biases, sizes, scale, eps = layer.decode_weights
    args = [hidden, residual, cos, sin, key_cache, value_cache, meta.slot_mapping, meta.decode_block_tables, meta.decode_context_lens]
    with pytest.raises(RuntimeError, match="weights must be the 9 of a layer"):
        cpu_ops.decode_layer(*args, weights[:8], biases, sizes, scale, eps)
    with pytest.raises(RuntimeError, match="sizes must be"):
        cpu_ops.decode_layer(*args, weights, biases, sizes[:3], scale, eps)
    wrong = meta.slot_mapping.clone()
    wrong[1] = key_cache.shape[0] * key_cache.shape[1]  # one past the pool
    with pytest.raises(RuntimeError, match=r"slot_mapping\[1\] = 96 is not a slot of the pool \(96 slots\)"):
        cpu_ops.decode_layer(*args[:6], wrong, *args[7:], weights, biases, sizes, scale, eps)
    assert torch.equal(_bits(key_cache), _bits(before))  # nothing written, not even the good row
    out, new_residual = cpu_ops.decode_layer(*args, weights, biases, sizes, scale, eps)
    assert out.shape == new_residual.shape == hidden.shape and not torch.equal(_bits(key_cache), _bits(before))


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_engine_decode_steps_run_one_call_per_layer_with_the_same_tokens(models, model_type, tmp_path, default_model_dir):
    directory = make_tiny_model(tmp_path, model_type, default_model_dir, seed=3, initializer_range=0.1)
    engine = LLMEngine(EngineConfig(model=str(directory), num_gpu_blocks=64, block_size=16, shuffle_blocks=True))
    assert "; decode steps: all decoder layers in one C++ call;" in engine.cpu_backend
    prompts = ["The block table maps", [{"role": "user", "content": "Hi!"}], "Paged attention " * 12]
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    outputs = {}
    for one_call in (True, False):
        engine.runner.model.decode_layers = one_call
        ids = [engine.add_request(p, params) for p in prompts]
        engine.step()  # the prefill
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            engine.step()  # a decode step
        calls = {e.key: e.count for e in prof.key_averages()}
        assert calls.get("pagedattention_lab::decode_layers", 0) == (1 if one_call else 0)  # the layers inside it: no dispatcher
        assert calls.get("pagedattention_lab::decode_layer", 0) == 0
        while engine.has_unfinished_requests():
            engine.step()
        outputs[one_call] = [engine.get_output(i).token_ids for i in ids]
    assert outputs[True] == outputs[False]
    engine.runner.backend = TORCH_BACKEND  # decode attention through the torch oracle: the module path, same tokens
    engine.runner.model.decode_layers = True
    ids = [engine.add_request(p, params) for p in prompts]
    while engine.has_unfinished_requests():
        engine.step()
    assert [engine.get_output(i).token_ids for i in ids] == outputs[True]


def test_a_forward_hook_inside_the_layers_makes_decode_steps_run_the_modules(tiny_llama_dir):
    # The app's Kernel lab keeps each q_proj's output with a forward hook: it must see every step.
    skip_without_the_matmul_kernel()
    engine = LLMEngine(EngineConfig(model=str(tiny_llama_dir), num_gpu_blocks=64))
    model = engine.runner.model
    assert model.decode_layers
    seen = []
    handle = model.model.layers[1].self_attn.q_proj.register_forward_hook(lambda m, i, out: seen.append(out.shape[0]))
    engine.add_request("The block table maps", SamplingParams(max_tokens=4, ignore_eos=True))
    engine.add_request("Paged attention", SamplingParams(max_tokens=4, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()
    assert len(seen) == 4 and seen[1:] == [2, 2, 2]  # the prefill, then three decode steps of both requests
    handle.remove()
    engine.add_request("Paged attention", SamplingParams(max_tokens=3, ignore_eos=True))
    engine.step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        engine.step()
    assert sum(e.count for e in prof.key_averages() if e.key == "pagedattention_lab::decode_layers") == 1
    assert len(seen) == 4


@pytest.mark.parametrize("where", ["pre-hook inside the layers", "global hook"])
def test_a_pre_hook_or_a_global_hook_makes_decode_steps_run_the_modules(tiny_llama_dir, where):
    # The app's Kernel lab also reads o_proj's input with a pre-hook; a global hook sees every module.
    skip_without_the_matmul_kernel()
    engine = LLMEngine(EngineConfig(model=str(tiny_llama_dir), num_gpu_blocks=64))
    model = engine.runner.model
    seen = []
    o_proj = model.model.layers[0].self_attn.o_proj
    if where == "global hook":
        handle = torch.nn.modules.module.register_module_forward_hook(
            lambda m, i, out: seen.append(out.shape[0]) if m is o_proj else None)
    else:
        handle = o_proj.register_forward_pre_hook(lambda m, args: seen.append(args[0].shape[0]))
    engine.add_request("The block table maps", SamplingParams(max_tokens=3, ignore_eos=True))
    try:
        while engine.has_unfinished_requests():
            engine.step()
    finally:
        handle.remove()
    assert seen[1:] == [1, 1]  # after the prefill, both decode steps ran o_proj as a module
    engine.add_request("Paged attention", SamplingParams(max_tokens=3, ignore_eos=True))
    engine.step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        engine.step()  # hooks gone: one C++ call again
    assert sum(e.count for e in prof.key_averages() if e.key == "pagedattention_lab::decode_layers") == 1
    assert len(seen) == 3
