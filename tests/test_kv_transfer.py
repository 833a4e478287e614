"""Prefill/decode disaggregation's KV connector (engine/kv_transfer/): the scheduler side and the
leases without a model, then one real handover between two engines on a tiny model, through the
prefill instance's side channel."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import sys
import threading
import time

import httpx
import pytest
import torch

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.config import KVTransferConfig
from engine.core.block_manager import PagedBlockManager
from engine.core.scheduler import Scheduler
from engine.core.sequence import Sequence, SequenceGroup, SequenceStatus
from engine.kv_transfer.base import KVConnectorOutput
from engine.kv_transfer.bootstrap import BootstrapTable, KVPoll, Reservation
from engine.kv_transfer.lease import LeaseTable, TransferRefused, prompt_hash
from engine.kv_transfer.nixl_connector import NixlConnectorWorker
from engine.kv_transfer.shared_memory_connector import SharedMemoryConnectorScheduler, SharedMemoryConnectorWorker, read_segment
from engine.timeline import disagg_chrome_trace
from engine.entrypoints.disagg import create_proxy_app
from serving import serving, serving_app, wait_until

BLOCK = 4
WORKERS = {"SharedMemoryConnector": SharedMemoryConnectorWorker, "NixlConnector": NixlConnectorWorker}


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def request(request_id: int, num_prompt_tokens: int, params: dict | None = None, max_tokens: int = 4) -> SequenceGroup:
    ids = list(range(100 + request_id, 100 + request_id + num_prompt_tokens))
    seq = Sequence(request_id, num_prompt_tokens, num_prompt_tokens + max_tokens, token_ids=ids)
    return SequenceGroup(request_id, [seq], kv_transfer_params=params)


def scheduler(role: str, clock=None, num_blocks: int = 16) -> Scheduler:
    connector = SharedMemoryConnectorScheduler(KVTransferConfig(kv_role=role, kv_port=9, kv_lease_duration=30), BLOCK, clock=clock)
    return Scheduler(PagedBlockManager(num_blocks, BLOCK), max_num_seqs=8, max_num_batched_tokens=64, connector=connector)


def remote_params(num_prompt_tokens: int, **overrides) -> dict:
    blocks = list(range(-(-num_prompt_tokens // BLOCK)))
    return {"do_remote_prefill": True, "transfer_id": "t" * 32, "remote_host": "127.0.0.1", "remote_port": 9,
            "remote_block_ids": blocks, **overrides}


# ---- the lease table: what a prefill instance serves --------------------------------------------

def test_a_lease_serves_one_read_of_exactly_its_blocks_for_its_prompt_and_refuses_the_rest_logged(caplog):
    clock = Clock()
    table = LeaseTable(30, clock)
    mine = table.grant(0, [3, 4, 5], prompt_hash([1, 2, 3]))
    other = table.grant(1, [6, 7], prompt_hash([9, 9]))
    assert mine.transfer_id != other.transfer_id and len(mine.transfer_id) >= 32  # 192 random bits
    forged = [("not-a-granted-id", [3, 4, 5], prompt_hash([1, 2, 3])),  # a guessed id
              (mine.transfer_id, [6, 7], prompt_hash([1, 2, 3])),  # another request's blocks under my id
              (mine.transfer_id, [3, 4, 5, 6], prompt_hash([1, 2, 3])),  # one block more
              (mine.transfer_id, [3, 4, 5], prompt_hash([9, 9])),  # my blocks for another prompt
              (None, [3, 4, 5], prompt_hash([1, 2, 3]))]
    with caplog.at_level(logging.WARNING, "engine.kv_transfer"):
        for transfer_id, blocks, prompt in forged:
            with pytest.raises(TransferRefused):
                table.claim(transfer_id, blocks, prompt, peer="10.0.0.9")
    assert table.num_refused == len(forged)
    assert sum("refused a KV read from 10.0.0.9" in r.getMessage() for r in caplog.records) == len(forged)
    assert mine.transfer_id not in caplog.text  # the log never shows a whole live id
    assert table.claim(mine.transfer_id, [3, 4, 5], prompt_hash([1, 2, 3])).request_id == 0
    with pytest.raises(TransferRefused, match="already read"):
        table.claim(mine.transfer_id, [3, 4, 5], prompt_hash([1, 2, 3]))


def test_leases_end_when_released_or_expired_and_an_ended_lease_serves_nothing():
    clock = Clock()
    table = LeaseTable(30, clock)
    read, unread = table.grant(0, [1], "h"), table.grant(1, [2], "h")
    assert table.take_freeable() == []
    assert not table.release(read.transfer_id, "another prompt") and not table.release("unknown", "h")
    assert table.release(read.transfer_id, "h")
    assert table.take_freeable() == [0]
    clock.now = 30.0
    with pytest.raises(TransferRefused, match="ended"):
        table.claim(unread.transfer_id, [2], "h")
    assert table.take_freeable() == [1] and table.num_expired == 1 and len(table) == 0


def test_a_claimed_lease_outlives_a_busy_lender_a_read_copies_exactly_its_blocks_and_an_ended_leases_segment_is_unlinked():
    clock = Clock()
    table = LeaseTable(30, clock)
    pool = [(torch.randn(8, BLOCK, 2, 3), torch.randn(8, BLOCK, 2, 3)) for _ in range(2)]  # 2 layers of 8 blocks
    worker = SharedMemoryConnectorWorker(KVTransferConfig(kv_role="kv_producer"), pool, table)
    lease = table.grant(0, [5, 2], prompt_hash([1, 2]))
    with pytest.raises(TransferRefused):
        worker.claim(lease.transfer_id, [5, 3], prompt_hash([1, 2]))  # one block not lent
    clock.now = 29.0
    claimed = worker.claim(lease.transfer_id, [5, 2], prompt_hash([1, 2]))
    clock.now = 58.0  # a claimed lease lives on: the lender's thread may serve the copy late
    assert table.take_freeable() == []
    reply = worker.serve_read(claimed)
    data = read_segment(reply["shm_name"], tuple(reply["shape"]), torch.float32)
    for layer, (k, v) in enumerate(pool):
        assert torch.equal(data[layer, 0], k[[5, 2]]) and torch.equal(data[layer, 1], v[[5, 2]])
    clock.now = 59.0
    assert table.take_freeable() == [0]
    with pytest.raises(TransferRefused, match="ended"):
        worker.serve_read(claimed)  # a copy after the end would read blocks that may be someone else's
    worker.drop_segments(keep=table.live_ids())
    with pytest.raises(FileNotFoundError):
        read_segment(reply["shm_name"], tuple(reply["shape"]), torch.float32)


# ---- the scheduler side -------------------------------------------------------------------------

def test_a_prefill_instance_lends_a_finished_requests_blocks_until_they_are_read_or_the_lease_expires():
    clock = Clock()
    s = scheduler("kv_producer", clock)
    kv = s.kv
    lent, plain = request(0, 10, {"do_remote_decode": True}), request(1, 6)
    for group in (lent, plain):
        s.add(group)
    s.schedule()
    s.finish(lent, "length")
    s.finish(plain, "length")
    params = lent.kv_transfer_params
    assert params["do_remote_prefill"] and params["remote_block_ids"] == [0, 1, 2] and params["remote_port"] == 9
    assert kv.num_free_blocks == 16 - 3, "the plain request's blocks are free, the lent ones held"
    assert s.free_lent_blocks() == [] and kv.num_free_blocks == 13
    s.connector.leases.release(params["transfer_id"], prompt_hash(lent.seqs[0].token_ids[:10]))
    assert s.free_lent_blocks() == [0] and kv.num_free_blocks == 16
    again = request(2, 10, {"do_remote_decode": True})
    s.add(again)
    s.schedule()
    s.finish(again, "length")
    clock.now = 29.9
    assert s.free_lent_blocks() == []
    clock.now = 30.0
    assert s.free_lent_blocks() == [2] and kv.num_free_blocks == 16


def test_an_aborted_prefill_lends_nothing():
    s = scheduler("kv_producer")
    group = request(0, 10, {"do_remote_decode": True})
    s.add(group)
    s.schedule()
    s.finish(group, "abort")
    assert s.kv.num_free_blocks == 16 and not s.lent and group.kv_transfer_params == {"do_remote_decode": True}


def test_a_decode_instance_waits_for_remote_kvs_outside_the_batch_then_computes_only_the_last_prompt_token():
    s = scheduler("kv_consumer")
    remote, local = request(0, 10, remote_params(10)), request(1, 5)
    s.add(remote)
    s.add(local)
    out = s.schedule()
    assert remote.status is SequenceStatus.WAITING_FOR_REMOTE_KVS and [q.request_id for q in out.prefill_seqs] == [1]
    assert len(remote.seqs[0].block_table) == 3, "its blocks are allocated before the load"
    (spec,) = out.kv_connector_metadata.reqs_to_recv
    assert spec.local_block_ids == tuple(remote.seqs[0].block_table) and spec.remote_block_ids == (0, 1, 2) and spec.first_block == 0
    assert s.has_unfinished()
    s.update_from_output(out)
    s.update_from_kv_xfer_finished(KVConnectorOutput(finished_recving={0}))
    out = s.schedule()
    assert [(q.request_id, out.num_tokens_of(q)) for q in out.prefill_seqs] == [(0, 1)], "only the last prompt token is computed"
    assert remote.kv_transfer_params["kv_load"] == "loaded"


def test_a_failed_load_frees_its_blocks_and_the_request_prefills_its_whole_prompt_itself_saying_why(caplog):
    s = scheduler("kv_consumer")
    group = request(0, 10, remote_params(10))
    s.add(group)
    s.schedule()
    with caplog.at_level(logging.WARNING, "engine.kv_transfer"):
        s.update_from_kv_xfer_finished(KVConnectorOutput(failed_recving={0: "ConnectionRefusedError: prefill is gone"}))
    assert s.kv.num_free_blocks == 16 and "prefills its prompt itself" in caplog.text
    assert group.kv_transfer_params == {"kv_load": "recomputed", "kv_load_error": "ConnectionRefusedError: prefill is gone"}
    out = s.schedule()
    assert [(q.request_id, out.num_tokens_of(q)) for q in out.prefill_seqs] == [(0, 10)]


@pytest.mark.parametrize("bad", [{"remote_host": "169.254.169.254"}, {"transfer_id": 7}, {"remote_block_ids": [0]},
                                 {"remote_block_ids": [0, 1, True]}, {"remote_port": "80"}])
def test_untrusted_params_that_cannot_be_served_are_refused_before_any_read(bad):
    s = scheduler("kv_consumer")
    group = request(0, 10, remote_params(10, **bad))
    s.add(group)
    out = s.schedule()
    assert not out.kv_connector_metadata.reqs_to_recv and out.num_tokens_of(out.prefill_seqs[0]) == 10
    assert group.kv_transfer_params["kv_load"] == "recomputed"


def test_a_request_aborted_while_loading_frees_its_blocks_and_its_load_is_discarded():
    s = scheduler("kv_consumer")
    group = request(0, 10, remote_params(10))
    s.add(group)
    s.schedule()
    s.finish(group, "abort")
    assert s.kv.num_free_blocks == 16 and not s.has_unfinished()
    assert s.schedule().kv_connector_metadata.reqs_to_discard == [0]
    s.update_from_kv_xfer_finished(KVConnectorOutput(finished_recving={0}))  # a late arrival changes nothing
    assert not s.remote_kv_ready


def test_a_decode_request_aborted_before_its_load_gives_the_prefill_instances_lease_back():
    s = scheduler("kv_consumer", num_blocks=3)
    running, queued = request(0, 10), request(1, 10, remote_params(10))
    s.add(running)
    s.add(queued)
    s.schedule()
    assert queued.status is SequenceStatus.WAITING, "no room: it waits in the queue, its load not begun"
    s.finish(queued, "abort")
    (spec,) = s.schedule().kv_connector_metadata.reqs_to_recv
    assert spec.transfer_id == "t" * 32 and spec.local_block_ids == (), "a load of no block: it only releases the lease"


def test_kv_transfer_config_is_vllms_dict_checked_field_by_field():
    assert EngineConfig(kv_transfer_config={"kv_connector": "SharedMemoryConnector", "kv_role": "kv_consumer"}).kv_transfer_config.is_kv_consumer
    with pytest.raises(ValueError, match="kv_role"):
        KVTransferConfig(kv_role="prefill")
    with pytest.raises(ValueError, match="no setting 'kv_rank'"):
        EngineConfig(kv_transfer_config={"kv_rank": 0})
    with pytest.raises(ValueError, match="allocator='paged'"):
        EngineConfig(allocator="contiguous", enable_prefix_caching=False, kv_transfer_config={})


# ---- one real handover, two engines, a tiny model -----------------------------------------------

def tiny_config(tiny_llama_dir) -> dict:
    return dict(model=str(tiny_llama_dir), num_gpu_blocks=32, block_size=BLOCK, cpu_kernels=False)


def run(engine: LLMEngine, prompt: list[int], params: SamplingParams, kv_transfer_params: dict | None = None):
    """One request through ``engine`` to its end (at most 30 s); its output."""
    rid = engine.add_request(prompt, params, kv_transfer_params=kv_transfer_params)
    started = time.monotonic()
    while engine.has_unfinished_requests():
        engine.step()
        assert time.monotonic() - started < 30, "the request did not finish"
    return engine.take_output(rid)


def run_all(engine: LLMEngine, prompts: list[list[int]], params: SamplingParams) -> list[list[int]]:
    """Every prompt through ``engine`` in one batch; their token ids, in order."""
    rids = [engine.add_request(p, params) for p in prompts]
    while engine.has_unfinished_requests():
        engine.step()
    return [engine.take_output(rid).token_ids for rid in rids]


@pytest.mark.parametrize("lender, reader", [("SharedMemoryConnector", "SharedMemoryConnector"), ("NixlConnector", "NixlConnector"),
                                            ("SharedMemoryConnector", "NixlConnector")])  # a NIXL reader takes a segment too
def test_a_decode_engine_reads_the_prefill_engines_blocks_byte_for_byte_and_decodes_as_a_colocated_engine(tiny_llama_dir, lender, reader):
    if "NixlConnector" in (lender, reader):
        pytest.importorskip("nixl._api", reason="NIXL is not installed (pip install -e '.[disagg]')")
    base = tiny_config(tiny_llama_dir)
    prompt, greedy = list(range(5, 23)), SamplingParams(max_tokens=6, temperature=0)
    want = run(LLMEngine(EngineConfig(**base)), prompt, greedy).token_ids
    with serving(EngineConfig(**base, kv_transfer_config={"kv_role": "kv_producer", "kv_connector": lender})) as (url, app):
        prefill, prefill_reports, decode_reports = app.state.llm.engine, [], []
        app.state.llm.step_callbacks.append(prefill_reports.append)
        prefill.kv_connector.side_channel = ("127.0.0.1", int(url.rsplit(":", 1)[1]))
        answer = httpx.post(f"{url}/v1/completions", json={"prompt": prompt, "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True}},
                            timeout=30).json()
        params = answer["kv_transfer_params"]
        lent = [torch.stack([prefill.runner.kv_caches[layer][i][params["remote_block_ids"]] for i in (0, 1)]) for layer in range(2)]
        decode = LLMEngine(EngineConfig(**base, kv_transfer_config={"kv_role": "kv_consumer", "kv_connector": reader}))
        try:
            assert (type(prefill.kv_connector_worker), type(decode.kv_connector_worker)) == (WORKERS[lender], WORKERS[reader]), "no fallback"
            rid = decode.add_request(prompt, greedy, kv_transfer_params=params)
            decode_reports.append(decode.step())
            wait_until(lambda: decode_reports.append(decode.step()) or decode.scheduler.running, timeout=60, what="the load")
            blocks = decode.requests[rid].seqs[0].block_table
            for layer in range(2):  # every layer's K and V of the prompt's blocks, as the prefill engine computed them
                mine = torch.stack([decode.runner.kv_caches[layer][i][blocks] for i in (0, 1)])
                assert torch.equal(mine[:, :-1], lent[layer][:, :-1]) and torch.equal(mine[:, -1, :1], lent[layer][:, -1, :1])
            while decode.has_unfinished_requests():
                decode_reports.append(decode.step())
            out = decode.take_output(rid)
            assert out.token_ids == want and out.kv_transfer_params["kv_load"] == "loaded"
            counted = decode.kv_transfer_status()  # what the comparison beside vLLM's NixlConnector reads
            assert counted["num_loaded_blocks"] == len(params["remote_block_ids"]) and counted["num_loaded_bytes"] == sum(t.nbytes for t in lent)
            trace = disagg_chrome_trace([("prefill instance", prefill_reports), ("decode instance", decode_reports)])
            slices = {(e["pid"], e["name"]): e for e in trace["traceEvents"] if e["ph"] == "X"}  # each (track, state)'s last slice
            names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
            assert names == {1: "prefill instance", 2: "decode instance"}
            prefilled, loading = slices[(1, "prefill")], slices[(2, "kv_transfer")]
            assert loading["args"]["reason"] == "loading" and loading["ts"] >= prefilled["ts"] + prefilled["dur"], \
                "on the wall clock the decode instance loads after the prefill instance computed the prompt"
            assert slices[(2, "prefill")]["args"]["num_tokens"] == 1, "then it computes the last prompt token alone"
            status = httpx.get(f"{url}/kv_transfer/status").json()
            assert status["num_free_blocks"] == status["num_blocks"] and status["num_leases"] == 0, "read, released, freed"
            out = run(decode, prompt, greedy, params)  # the same params again: the lease is spent
            assert out.token_ids == want and out.kv_transfer_params["kv_load"] == "recomputed" and "403" in out.kv_transfer_params["kv_load_error"]
            assert decode.kv.num_free_blocks == decode.kv.num_usable_blocks
        finally:
            decode.shutdown_kv_connector()


def test_nixl_connector_without_nixl_says_so_in_one_line_and_falls_back_to_shared_memory(tiny_llama_dir, monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "nixl._api", None)  # NIXL absent, whether or not .[disagg] is installed
    with caplog.at_level(logging.WARNING, "engine.kv_transfer"):
        engine = LLMEngine(EngineConfig(**tiny_config(tiny_llama_dir), kv_transfer_config={"kv_role": "kv_consumer", "kv_connector": "NixlConnector"}))
    assert type(engine.kv_connector_worker) is SharedMemoryConnectorWorker
    assert engine.kv_transfer_status()["kv_connector"] == "SharedMemoryConnector", "the status names the transport that runs"
    said = [r.getMessage() for r in caplog.records if "NIXL" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("kv_connector NixlConnector: NIXL cannot start here (ModuleNotFoundError: ") \
        and said[0].endswith("pip install -e '.[disagg]'): the shared-memory transport carries the KV"), said


def test_a_prefill_instance_that_never_answers_times_out_and_the_decode_engine_recomputes_saying_so(tiny_llama_dir):
    base = tiny_config(tiny_llama_dir)
    prompt, greedy = list(range(5, 23)), SamplingParams(max_tokens=4, temperature=0)
    want = run(LLMEngine(EngineConfig(**base)), prompt, greedy).token_ids
    silent = socket.socket()  # accepts connections (the kernel's backlog), never answers
    silent.bind(("127.0.0.1", 0))
    silent.listen(4)
    decode = LLMEngine(EngineConfig(**base, kv_transfer_config={"kv_role": "kv_consumer", "kv_connector_extra_config": {"timeout_s": 0.5}}))
    try:
        out = run(decode, prompt, greedy, remote_params(len(prompt), remote_port=silent.getsockname()[1]))
        assert out.token_ids == want and out.kv_transfer_params["kv_load"] == "recomputed" and "timed out" in out.kv_transfer_params["kv_load_error"]
        assert decode.kv.num_free_blocks == decode.kv.num_usable_blocks
    finally:
        decode.shutdown_kv_connector()
        silent.close()


def test_an_idle_prefill_server_frees_the_blocks_of_a_lease_nobody_reads_when_it_expires(tiny_llama_dir):
    config = EngineConfig(**tiny_config(tiny_llama_dir), kv_transfer_config={"kv_role": "kv_producer", "kv_lease_duration": 1})
    with serving(config) as (url, _):
        answer = httpx.post(f"{url}/v1/completions", json={"prompt": list(range(5, 23)), "max_tokens": 1,
                                                           "kv_transfer_params": {"do_remote_decode": True}}, timeout=30).json()
        assert answer["kv_transfer_params"]["transfer_id"]
        held = httpx.get(f"{url}/kv_transfer/status").json()
        assert held["num_lent_requests"] == 1 and held["num_free_blocks"] == held["num_blocks"] - 5
        wait_until(lambda: httpx.get(f"{url}/kv_transfer/status").json()["num_expired_leases"] == 1, timeout=10, what="the lease to expire")
        freed = httpx.get(f"{url}/kv_transfer/status").json()
        assert freed["num_free_blocks"] == freed["num_blocks"] and freed["num_lent_requests"] == 0


# ---- the push order (SGLang's): the decode instance reserves, the prefill instance writes ---------

def push_params(room: int, url: str) -> dict:
    return {"do_remote_prefill": True, "bootstrap_room": room, "remote_host": "127.0.0.1", "remote_port": int(url.rsplit(":", 1)[1])}


def prefill_call(url: str, prompt: list[int], params: dict) -> threading.Thread:
    """The router's call to the prefill instance, in the background (it answers once the KV is written)."""
    thread = threading.Thread(target=lambda: httpx.post(f"{url}/v1/completions", json={"prompt": prompt, "max_tokens": 1,
                                                                                      "kv_transfer_params": params}, timeout=60))
    thread.start()
    return thread


def handover(order: str, base: dict, prompt: list[int], greedy: SamplingParams):
    """One request handed over in ``order`` between a served prefill engine and a decode engine stepped
    here; (its decode output, the decode engine, the prefill server's status once its blocks are free)."""
    config = {"kv_handover": order}
    with serving(EngineConfig(**base, kv_transfer_config={"kv_role": "kv_producer", **config})) as (url, app):
        app.state.llm.engine.kv_connector.side_channel = ("127.0.0.1", int(url.rsplit(":", 1)[1]))
        decode = LLMEngine(EngineConfig(**base, kv_transfer_config={"kv_role": "kv_consumer", **config}))
        try:
            if order == "push":
                call = prefill_call(url, prompt, {"do_remote_decode": True, "bootstrap_room": 7})
                out = run(decode, prompt, greedy, push_params(7, url))
                call.join(30)
            else:
                params = httpx.post(f"{url}/v1/completions", json={"prompt": prompt, "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True}},
                                    timeout=30).json()["kv_transfer_params"]
                out = run(decode, prompt, greedy, params)
            status = lambda: httpx.get(f"{url}/kv_transfer/status").json()  # noqa: E731
            wait_until(lambda: status()["num_free_blocks"] == status()["num_blocks"], timeout=10, what="the prefill blocks freed")
            return out, decode, status()
        finally:
            decode.shutdown_kv_connector()


def test_in_the_push_order_the_decode_engine_reserves_the_prefill_engine_writes_and_greedy_tokens_equal_a_colocated_engine(tiny_llama_dir, caplog):
    base = tiny_config(tiny_llama_dir)
    prompt, greedy = list(range(5, 23)), SamplingParams(max_tokens=6, temperature=0)
    want = run(LLMEngine(EngineConfig(**base)), prompt, greedy).token_ids
    with caplog.at_level(logging.INFO, "engine.kv_transfer"):
        out, decode, prefill = handover("push", base, prompt, greedy)
    assert out.token_ids == want and out.kv_transfer_params["kv_load"] == "loaded" and out.kv_transfer_params["kv_poll"] == "Success"
    assert decode.kv.num_free_blocks == decode.kv.num_usable_blocks and prefill["num_free_blocks"] == prefill["num_blocks"] and prefill["kv_poll"]["Success"] == 1
    logged = [r.getMessage() for r in caplog.records if "KV push room 7 " in r.getMessage()]
    decode_side = [m.rsplit(" ", 1)[1] for m in logged if m.startswith("request ")]
    prefill_side = [m.split()[4].rstrip(":") for m in logged if m.startswith("KV push room")]
    assert decode_side == ["WaitingForInput", "Transferring", "Success"] == prefill_side, logged


@pytest.mark.parametrize("order", ["pull", "push"])
def test_an_fp8_kv_cache_is_handed_over_with_its_scales_and_decodes_as_a_colocated_fp8_engine(tiny_llama_dir, order):
    base = {**tiny_config(tiny_llama_dir), "kv_cache_dtype": "fp8", "calculate_kv_scales": True}
    prompt, greedy = list(range(5, 23)), SamplingParams(max_tokens=6, temperature=0)
    colocated = LLMEngine(EngineConfig(**base))
    want = run(colocated, prompt, greedy).token_ids
    out, decode, _ = handover(order, base, prompt, greedy)
    assert out.kv_transfer_params["kv_load"] == "loaded" and out.token_ids == want
    scales = [[(a.k_scale, a.v_scale) for a in (layer.self_attn for layer in e.runner.model.model.layers)] for e in (colocated, decode)]
    assert scales[1] == scales[0] and scales[0][0] != (1.0, 1.0), "the decode engine reads the pages with the scales they were written with"


class Attention:
    """What the connector reads of a layer's attention: its fp8 scales."""

    def __init__(self, k_scale=1.0, v_scale=1.0, calculate_kv_scales=False):
        self.k_scale, self.v_scale, self.calculate_kv_scales = k_scale, v_scale, calculate_kv_scales


def test_fp8_pages_take_their_writers_scales_once_and_scales_that_differ_are_refused_naming_what_works():
    pool = [(torch.zeros(4, BLOCK, 2, 3, dtype=torch.float8_e4m3fn),) * 2 for _ in range(2)]
    fresh, fixed = [Attention(calculate_kv_scales=True), Attention(calculate_kv_scales=True)], [Attention(0.5, 0.25), Attention(0.5, 0.25)]
    reader = SharedMemoryConnectorWorker(KVTransferConfig(kv_role="kv_producer"), pool, None, attention=fresh)
    reader._take_kv_scales([[0.5, 0.25], [0.125, 2.0]])
    assert reader.kv_scales() == [[0.5, 0.25], [0.125, 2.0]] and not any(a.calculate_kv_scales for a in fresh)
    settled = SharedMemoryConnectorWorker(KVTransferConfig(kv_role="kv_producer"), pool, None, attention=fixed)
    settled._take_kv_scales([[0.5, 0.25], [0.5, 0.25]])
    with pytest.raises(ValueError, match=r"are not this pool.s \[0.5, 0.25\].*calculate_kv_scales off on both"):
        settled._take_kv_scales([[0.5, 0.25], [1.0, 1.0]])
    with pytest.raises(ValueError, match="without their k_scale and v_scale"):
        settled._take_kv_scales(None)


def test_a_bootstrap_room_goes_bootstrapping_waiting_for_input_transferring_success_and_forged_reservations_are_refused_logged(caplog):
    clock = Clock()
    table = BootstrapTable(30, clock)

    def reservation(room, prompt, shm="pal-kv-push-" + "a" * 24, tid="T" * 32):
        return Reservation(tid, room, prompt_hash(prompt), (4, 5), shm, (2, 2, 2, BLOCK, 2, 3), "float32")

    assert table.add_request(0, 11, prompt_hash([1, 2])) is KVPoll.Bootstrapping and not table.waiting_for_input(0)
    with caplog.at_level(logging.WARNING, "engine.kv_transfer"):
        for forged in (reservation(11, [9, 9]),  # another prompt for my room
                       reservation(11, [1, 2], shm="psm_victim"),  # a segment not reserved for a push
                       reservation("11", [1, 2])):
            with pytest.raises(TransferRefused):
                table.bootstrap(forged, peer="10.0.0.9")
        assert table.bootstrap(reservation(11, [1, 2])) is KVPoll.WaitingForInput and table.waiting_for_input(0)
        with pytest.raises(TransferRefused, match="already has a reservation"):
            table.bootstrap(reservation(11, [1, 2], tid="U" * 32))
        with pytest.raises(TransferRefused):
            table.wait(11, "U" * 32)  # a poll of someone else's reservation
    assert table.num_refused == 5 and sum("refused a KV" in r.getMessage() for r in caplog.records) == 5
    done = table.wait(11, "T" * 32)
    assert table.set_transferring(0) and table.state(0) is KVPoll.Transferring
    table.end(0, KVPoll.Success, detail={"kv_scales": None})
    assert done.result(0) == {"state": "Success", "why": "", "kv_scales": None} and table.forget(0) is KVPoll.Success


def test_a_reservation_that_came_first_for_another_prompt_is_dropped_and_rooms_past_their_deadline_fail():
    clock = Clock()
    table = BootstrapTable(30, clock)
    early = Reservation("T" * 32, 3, prompt_hash([9]), (1,), "pal-kv-push-" + "b" * 24, (), "float32")
    table.bootstrap(early)  # the decode side reserved before the prefill request arrived
    assert table.add_request(0, 3, prompt_hash([1])) is KVPoll.Bootstrapping and table.num_refused == 1, "its prompt is not the room's"
    table.add_request(1, 4, prompt_hash([1]))
    table.bootstrap(Reservation("V" * 32, 4, prompt_hash([1]), (1,), "pal-kv-push-" + "c" * 24, (), "float32"))
    waited = table.wait(4, "V" * 32)
    clock.now = 30.0
    assert table.expire() == [0], "never bootstrapped: it runs alone"
    assert table.waiting_for_input(0) and table.forget(0) is KVPoll.Failed
    assert waited.result(0)["state"] == "Failed" and "did not write the KV within 30 s" in waited.result(0)["why"]


def test_in_the_push_order_a_prefill_that_never_writes_and_a_forged_room_leave_the_decode_engine_recomputing_saying_why(tiny_llama_dir, caplog):
    base = tiny_config(tiny_llama_dir)
    victim, forger, other = list(range(5, 23)), list(range(30, 48)), list(range(50, 68))
    greedy = SamplingParams(max_tokens=3, temperature=0)
    reference = LLMEngine(EngineConfig(**base))
    want = dict(zip(("victim", "forger", "other"), run_all(reference, [victim, forger, other], greedy)))
    push = {"kv_handover": "push", "kv_lease_duration": 2}
    with serving(EngineConfig(**base, kv_transfer_config={"kv_role": "kv_producer", **push})) as (url, app):
        decode = LLMEngine(EngineConfig(**base, kv_transfer_config={"kv_role": "kv_consumer", **push}))
        try:
            call = prefill_call(url, victim, {"do_remote_decode": True, "bootstrap_room": 2})
            wait_until(lambda: httpx.get(f"{url}/kv_transfer/status").json()["num_bootstrapping"] == 1, what="the victim's prefill request")
            # Rooms 1 and 3 never get a prefill request: their reservations wait in their polls meanwhile.
            rids = {name: decode.add_request(prompt, greedy, kv_transfer_params=push_params(room, url))
                    for name, prompt, room in (("lonely", other, 1), ("lonely too", other, 3), ("forger", forger, 2), ("victim", victim, 2))}
            with caplog.at_level(logging.WARNING, "engine.kv_transfer"):
                started = time.monotonic()
                while decode.has_unfinished_requests():
                    decode.step()
                    assert time.monotonic() - started < 30, "the requests did not finish"
            out = {name: decode.take_output(rid) for name, rid in rids.items()}
            call.join(30)
            for name in ("lonely", "lonely too"):
                assert out[name].token_ids == want["other"] and out[name].kv_transfer_params["kv_poll"] == "Failed"
                assert "did not write the KV within 2 s" in out[name].kv_transfer_params["kv_load_error"]
            assert out["forger"].token_ids == want["forger"] and "403" in out["forger"].kv_transfer_params["kv_load_error"]
            assert "refused a KV reservation" in caplog.text
            assert out["victim"].kv_transfer_params["kv_load"] == "loaded" and out["victim"].token_ids == want["victim"], \
                "the rightful reservation is served, however many others wait for their prefill"
            status = httpx.get(f"{url}/kv_transfer/status").json()
            assert status["num_refused_reservations"] == 1 and status["num_free_blocks"] == status["num_blocks"]
            assert decode.kv.num_free_blocks == decode.kv.num_usable_blocks
        finally:
            decode.shutdown_kv_connector()


def test_a_push_order_burst_through_the_proxy_some_streams_cancelled_leaves_every_block_free_on_both_sides(tiny_llama_dir):
    base, push = tiny_config(tiny_llama_dir), {"kv_handover": "push", "kv_lease_duration": 2}
    prompts = [list(range(5 + i, 23 + i)) for i in range(6)]
    greedy = SamplingParams(max_tokens=8, temperature=0)
    reference = LLMEngine(EngineConfig(**base))
    want = run_all(reference, prompts, greedy)
    with (serving(EngineConfig(**base, kv_transfer_config={"kv_role": "kv_producer", **push})) as (prefill, _),
          serving(EngineConfig(**base, kv_transfer_config={"kv_role": "kv_consumer", **push})) as (decode, _),
          serving_app(create_proxy_app(prefill, decode, kv_handover="push")) as proxy):

        async def stream(client: httpx.AsyncClient, prompt: list[int], max_tokens: int = 8, cancel_at_first: bool = False) -> list[int]:
            body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True, "return_token_ids": True}
            ids = []
            async with client.stream("POST", f"{proxy}/v1/completions", json=body) as answer:
                async for line in answer.aiter_lines():
                    if line.startswith("data: {"):
                        ids += json.loads(line[6:])["choices"][0].get("token_ids") or []
                        if cancel_at_first:
                            raise asyncio.CancelledError  # the client leaves at its first token
            return ids

        async def burst() -> list:
            async with httpx.AsyncClient(timeout=60) as client:
                early = asyncio.create_task(stream(client, prompts[0], max_tokens=40))
                tasks = [early, stream(client, prompts[1], max_tokens=40, cancel_at_first=True), *(stream(client, p) for p in prompts[2:])]
                await asyncio.sleep(0.02)  # the first leaves while its handover is under way
                early.cancel()
                return await asyncio.gather(*tasks, return_exceptions=True)

        results = asyncio.run(burst())
        assert all(isinstance(r, asyncio.CancelledError) for r in results[:2]), results
        assert results[2:] == want[2:], (results, want)

        def all_free() -> bool:
            sides = [httpx.get(f"{url}/kv_transfer/status").json() for url in (prefill, decode)]
            return all(s["num_free_blocks"] == s["num_blocks"] and s["num_bootstrapping"] == 0 and s["num_waiting_for_remote_kvs"] == 0
                       for s in sides)

        wait_until(all_free, timeout=10, what="every block free on both instances")
        assert httpx.get(f"{decode}/kv_transfer/status").json()["num_loaded"] >= 4, "the completed ones were pushed, not recomputed"


def test_a_sliding_window_model_is_refused_in_one_line_naming_what_is_handed_over(tiny_gemma_dir):
    with pytest.raises(ValueError) as refused:  # either order: the connector moves one block table per request
        LLMEngine(EngineConfig(model=str(tiny_gemma_dir), num_gpu_blocks=32, block_size=BLOCK, cpu_kernels=False,
                               kv_transfer_config={"kv_role": "kv_producer", "kv_handover": "push"}))
    why = str(refused.value)
    assert "\n" not in why and "sliding-window layers" in why and "one block table per request" in why and "full attention only" in why
