"""Lab kv_quant: an fp8 KV cache stores fp8(x / scale), saturated, and attention reads fp8 * scale."""

import torch

from engine.model_executor.attention import paged_attention_reference, write_kv_cache
from engine.model_executor.kv_quant import compute_kv_scales, dequantize_kv, quantize_kv

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def test_quantize_divides_by_the_scale_and_rounds_to_the_nearest_fp8_value():
    x = torch.tensor([0.5, 0.1, -0.3, 0.0])
    q = quantize_kv(x, 0.25, E4M3)
    assert q.dtype == E4M3, "the result is stored in the pool's fp8 dtype"
    assert q.float().tolist() == [2.0, 0.40625, -1.25, 0.0], "fp8(x / scale): 0.1 / 0.25 = 0.4 is 0.40625 in e4m3 (3 mantissa bits)"


def test_quantize_saturates_instead_of_overflowing():
    big = torch.tensor([1000.0, -1e6])
    assert quantize_kv(big, 1.0, E4M3).float().tolist() == [448.0, -448.0], "e4m3's largest value is 448: clamp, never NaN"
    assert quantize_kv(big * 100, 1.0, E5M2).float().tolist() == [57344.0, -57344.0], "e5m2's largest value is 57344: never inf"


def test_dequantize_multiplies_by_the_scale():
    q = quantize_kv(torch.tensor([1.0, -2.0, 3.0]), 0.5, E5M2)
    out = dequantize_kv(q, 0.5)
    assert out.dtype == torch.float32 and out.tolist() == [1.0, -2.0, 3.0], "fp8 * scale, in fp32 by default"
    assert dequantize_kv(q, 0.5, torch.bfloat16).dtype == torch.bfloat16


def test_a_round_trip_is_within_half_a_step():
    x = torch.randn(4096) * 3
    for dtype, bits in ((E4M3, 3), (E5M2, 2)):
        scale = float(x.abs().max()) / 200
        back = dequantize_kv(quantize_kv(x, scale, dtype), scale)
        normal = x.abs() / scale >= torch.finfo(dtype).tiny  # below it fp8's steps stop shrinking (subnormals)
        assert ((back - x).abs() <= x.abs() * 2.0 ** -(bits + 1))[normal].all(), f"{dtype}: more than half a step off"


def test_calculated_scales_are_vllms():
    key = torch.tensor([[[1.0, -8.0]], [[2.0, 0.5]]])
    value = torch.tensor([[[0.25, 3.0]], [[-4.0, 1.0]]])
    assert compute_kv_scales(key, value) == (8.0 / 200, 4.0 / 100), "max|K| / 200 and max|V| / 100"
    assert compute_kv_scales(torch.zeros(2, 1, 2), value)[0] == 1.0, "all zeros: keep the scale 1.0 (never divide by 0)"


def test_the_engines_attention_reads_what_your_functions_write():
    torch.manual_seed(0)
    k, v = torch.randn(2, 8, 1, 8).unbind(0)
    caches = [torch.zeros(2, 4, 1, 8, dtype=E4M3) for _ in range(2)]
    write_kv_cache(k, v, *caches, torch.arange(8), k_scale=0.02, v_scale=0.03)
    q = torch.randn(1, 2, 8)
    tables, lens = torch.tensor([[0, 1]], dtype=torch.int32), torch.tensor([8], dtype=torch.int32)
    out = paged_attention_reference(q, *caches, tables, lens, 8 ** -0.5, k_scale=0.02, v_scale=0.03)
    exact = paged_attention_reference(q, k.view(2, 4, 1, 8), v.view(2, 4, 1, 8), tables, lens, 8 ** -0.5)
    assert (out - exact).abs().max() < 0.1, "attention over your fp8 pool must stay close to attention over the exact K and V"
