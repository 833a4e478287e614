"""Two engines stepped by hand with the shared-memory KV connector between them (engine/disagg_pair.py),
on a tiny model: what the pair reports of each handover is what the engines did."""

from __future__ import annotations

import dataclasses
import time

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.disagg_pair import DisaggPair
from visualize.handover import handover_rows, story

BLOCK = 4
PROMPT = list(range(5, 23))  # 18 tokens: 5 blocks of 4


def pair(tiny_llama_dir, lease_s: float = 30, order: str = "pull") -> DisaggPair:
    engines = [LLMEngine(EngineConfig(model=str(tiny_llama_dir), num_gpu_blocks=32, block_size=BLOCK, cpu_kernels=False,
                                      kv_transfer_config={"kv_role": role, "kv_lease_duration": lease_s, "kv_handover": order}))
               for role in ("kv_producer", "kv_consumer")]
    return DisaggPair(*engines)


def test_each_handover_reports_the_blocks_the_decode_engine_holds_and_the_bytes_it_read(tiny_llama_dir):
    want = LLMEngine(EngineConfig(model=str(tiny_llama_dir), num_gpu_blocks=32, block_size=BLOCK, cpu_kernels=False))
    rid = want.add_request(PROMPT, SamplingParams(max_tokens=4, temperature=0))
    while want.has_unfinished_requests():
        want.step()
    p = pair(tiny_llama_dir)
    try:
        p.add_request(PROMPT, 4)
        first = p.step()
        (h,) = first.handovers
        assert h.lease == "lent" and first.prefill.block_tables == {0: (h.prefill_blocks, "lent")} and not first.decode.holders
        p.step()  # the decode instance runs: it allocates, reads, releases
        p.step()
        p.add_request(PROMPT[::-1], 4)  # a second request while the first decodes: its decode blocks are others
        loading = []
        while p.has_unfinished():
            state = p.step()
            loading += [state.step for rid, (blocks, why) in state.decode.block_tables.items()
                        if why == "loading" and blocks == state.handovers[-1].decode_blocks and rid == state.handovers[-1].decode_request_id]
        assert loading == [4], "the second request's decode blocks wait for its KV in the step that read it"
        a, b = state.handovers
        assert [x.lease for x in (a, b)] == ["released", "released"] and [x.load for x in (a, b)] == ["loaded", "loaded"]
        assert a.moves == list(zip(a.prefill_blocks, a.decode_blocks)) and len(a.moves) == 5
        assert b.moves == list(zip(b.prefill_blocks, b.decode_blocks)) and not set(b.decode_blocks) & set(a.decode_blocks), \
            "the decode instance's own free blocks: it still held the first request's"
        k = p.decode.runner.kv_caches[0][0]
        assert a.num_bytes == 2 * 2 * 5 * k[0].numel() * k.element_size(), "two layers' K and V of 5 blocks"
        assert 0 < a.copy_ms <= a.read_ms
        assert state.texts[a.decode_request_id] == want.get_output(rid).text, "the handed-over prompt decodes as a colocated engine"
        assert not state.prefill.holders and not state.decode.holders, "every block free on both instances"
    finally:
        p.close()


def test_a_lease_nobody_reads_in_time_expires_and_the_decode_engine_recomputes(tiny_llama_dir):
    p = pair(tiny_llama_dir, lease_s=0.2)
    try:
        p.add_request(PROMPT, 2)
        p.step()
        time.sleep(0.3)  # the class waited before the next click
        while p.has_unfinished():
            state = p.step()
        (h,) = state.handovers
        assert (h.lease, h.load, h.num_bytes, h.moves) == ("expired", "recomputed", 0, []), "nothing was read"
        assert story(state, "en") == [] and "recompute" in story(dataclasses.replace(state, step=h.ended_at_step), "en")[0]
        assert not state.prefill.holders and not state.decode.holders
    finally:
        p.close()


def test_a_prompt_the_decode_instance_has_cached_reads_only_the_blocks_it_lacks(tiny_llama_dir):
    p = pair(tiny_llama_dir)
    try:
        for _ in range(2):  # the same prompt twice, one after the other
            p.add_request(PROMPT, 2)
            while p.has_unfinished():
                state = p.step()
        first, again = state.handovers
        assert (first.first_block, len(first.moves)) == (0, 5)
        assert again.first_block == 4 and again.moves == [(again.prefill_blocks[4], again.decode_blocks[4])], \
            "4 full blocks hit the decode instance's prefix cache; only the last, partial one is read"
        assert again.decode_blocks[:4] == first.decode_blocks[:4] and again.lease == "released"
        assert handover_rows(state, "en")[1]["Hits on decode"] == 4
    finally:
        p.close()


def test_in_the_push_order_the_decode_instance_reserves_first_the_prefill_instance_holds_nothing_while_it_waits_then_writes(tiny_llama_dir):
    want = LLMEngine(EngineConfig(model=str(tiny_llama_dir), num_gpu_blocks=32, block_size=BLOCK, cpu_kernels=False))
    rid = want.add_request(PROMPT, SamplingParams(max_tokens=4, temperature=0))
    while want.has_unfinished_requests():
        want.step()
    p = pair(tiny_llama_dir, order="push")
    try:
        p.add_request(PROMPT, 4)
        reserved = p.step()
        (h,) = reserved.handovers
        assert h.poll == "WaitingForInput" and not reserved.prefill.holders, "the prefill request waits for the reservation, holding no block"
        assert reserved.decode.block_tables == {h.decode_request_id: (h.decode_blocks, "reserved")} and len(h.decode_blocks) == 5
        assert story(reserved, "en")[0].startswith("Request 0: the decode instance reserved 5 blocks")
        written = p.step()
        assert h.moves == list(zip(h.prefill_blocks, h.decode_blocks)) and h.poll == "Success" and h.load == "loaded"
        assert not written.prefill.holders and written.decode.block_tables[h.decode_request_id] == (h.decode_blocks, "loaded")
        wrote, landed = story(written, "en")
        assert wrote.startswith("Request 0: the prefill instance computed its prompt and wrote 5 blocks") and "Success" in wrote
        assert landed.startswith("Request 0: its KV is in the decode instance's blocks")
        row = handover_rows(written, "zh")[0]
        assert row["状态（KVPoll）"] == "Success" and row["块数"] == 5 and "租约" not in row
        while p.has_unfinished():
            state = p.step()
        assert state.texts[h.decode_request_id] == want.get_output(rid).text, "the pushed prompt decodes as a colocated engine"
        assert not state.prefill.holders and not state.decode.holders
    finally:
        p.close()
