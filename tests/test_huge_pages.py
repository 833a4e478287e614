"""Packed weights and KV pools in 2 MiB pages (engine/cpu/huge_pages.py): the tensors are what torch would give,
and on a Linux machine with transparent huge pages they really are backed by huge pages."""

from __future__ import annotations

import pytest
import torch

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.cpu import huge_pages

THP = pytest.mark.skipif(huge_pages.why_not_available() is not None, reason=f"no huge pages here: {huge_pages.why_not_available()}")


def test_arena_gives_zeroed_aligned_tensors_of_each_shape_and_dtype():
    specs = [((1000, 576), torch.float32), ((3,), torch.int32), ((0, 4), torch.float32), ((7, 5), torch.bfloat16), ((1,), torch.float64)]
    tensors = huge_pages.arena(specs)
    for t, (shape, dtype) in zip(tensors, specs):
        assert t.shape == shape and t.dtype == dtype and t.device.type == "cpu"
        assert t.is_contiguous() and not t.any()  # zero-filled, as torch.zeros
        if t.numel():
            assert t.data_ptr() % huge_pages.ALIGN == 0
    for i, t in enumerate(tensors):  # each tensor its own memory: writing one leaves the others zero
        t.fill_(i + 1)
    assert [t.unique().tolist() for t in tensors if t.numel()] == [[1.0], [2], [4.0], [5.0]]


def test_place_keeps_names_values_and_ties():
    shared = torch.randn(64, 32)
    tensors = {"embed": shared, "lm_head": shared, "norm": torch.randn(32), "ids": torch.arange(5)}
    placed = huge_pages.place(tensors)
    assert placed.keys() == tensors.keys()
    for name in tensors:
        assert torch.equal(placed[name], tensors[name]) and placed[name].dtype == tensors[name].dtype
    assert placed["embed"] is placed["lm_head"]  # tied weights stay one tensor
    if huge_pages.why_not_available() is None:
        assert placed["norm"].data_ptr() != tensors["norm"].data_ptr()  # copied into the arena


@THP
def test_an_arena_is_backed_by_huge_pages_once_written():
    (t,) = huge_pages.arena([((4 << 20,), torch.float32)])  # 16 MiB
    t.fill_(1.0)
    assert huge_pages.huge_page_share(t) > 0.5
    assert huge_pages.huge_page_share(torch.ones(4 << 20)) < 0.5  # torch's own allocation: 4 KiB pages here


@THP
def test_a_populated_arena_has_its_memory_before_any_write(tiny_llama_dir):
    # A page's memory found at its first write can take a compaction of memory (up to 0.4 s here):
    # the KV pool is given its memory when the engine is built, not in the decode step that first
    # writes a block in that page.
    lazy, (populated,) = huge_pages.arena([((4 << 20,), torch.float32)]), huge_pages.arena([((4 << 20,), torch.float32)], populate=True)
    assert huge_pages.huge_page_share(lazy[0]) < 0.5 < huge_pages.huge_page_share(populated)
    assert not populated.any()  # still zero-filled
    engine = LLMEngine(EngineConfig(model=str(tiny_llama_dir), num_gpu_blocks=64))
    assert all(huge_pages.huge_page_share(t) > 0.5 for pair in engine.runner.kv_caches for t in pair)  # before any step


def test_without_huge_pages_everything_is_plain_torch(monkeypatch):
    monkeypatch.setattr(huge_pages, "why_not_available", lambda: "switched off for this test")
    tensors = {"w": torch.randn(8, 8)}
    assert huge_pages.place(tensors) is tensors  # nothing copied
    (z,) = huge_pages.arena([((3, 4), torch.float32)])
    assert torch.equal(z, torch.zeros(3, 4))
    assert huge_pages.status().startswith("4 KiB pages (switched off")


@THP
def test_the_engine_keeps_packed_weights_and_kv_cache_in_huge_pages_and_its_tokens(tiny_llama_dir, monkeypatch):
    # What a decode step streams: the matmul kernel's packed weights and the KV pool. The weights as
    # loaded are ordinary tensors (read by prefill and the torch paths only).
    params = SamplingParams(max_tokens=10, ignore_eos=True)
    engine = LLMEngine(EngineConfig(model=str(tiny_llama_dir), num_gpu_blocks=64))
    model = engine.runner.model
    up = model.model.layers[0].mlp.up_proj
    engine.add_request("Paged attention", params)
    while engine.has_unfinished_requests():
        engine.step()
    assert huge_pages.huge_page_share(engine.runner.kv_caches[0][0]) > 0.5
    if up.cpu_kernel:  # AVX-512 or AVX2: the packed copies, one arena for the model
        assert huge_pages.huge_page_share(up.packed_weight) > 0.5
        assert engine.cpu_backend.endswith("; packed weights and KV cache in 2 MiB pages")
    else:
        assert engine.cpu_backend.endswith("; KV cache in 2 MiB pages")
    with_huge_pages = engine.get_output(0).token_ids
    monkeypatch.setattr(huge_pages, "why_not_available", lambda: "switched off for this test")
    plain = LLMEngine(EngineConfig(model=str(tiny_llama_dir), num_gpu_blocks=64))
    assert huge_pages.huge_page_share(plain.runner.kv_caches[0][0]) < 0.5
    if up.cpu_kernel:
        assert huge_pages.huge_page_share(plain.runner.model.model.layers[0].mlp.up_proj.packed_weight) < 0.5
    assert plain.cpu_backend.endswith("; 4 KiB pages (switched off for this test)")
    plain.add_request("Paged attention", params)
    while plain.has_unfinished_requests():
        plain.step()
    assert plain.get_output(0).token_ids == with_huge_pages
