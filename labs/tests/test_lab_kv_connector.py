"""Lab kv_connector: the KV connector's scheduler side (vLLM v1's pull order), between a prefill scheduler
and a decode scheduler of the engine, no model: which prompt tokens come from the prefill instance, the
load recorded once the decode blocks are allocated, and the prefill side's blocks kept under a lease."""

from engine.config import KVTransferConfig
from engine.core.block_manager import PagedBlockManager
from engine.core.scheduler import Scheduler
from engine.core.sequence import Sequence, SequenceGroup, SequenceStatus
from engine.kv_transfer.base import KVConnectorOutput
from engine.kv_transfer.lease import prompt_hash
from engine.kv_transfer.shared_memory_connector import SharedMemoryConnectorScheduler

from labkit import step

BLOCK = 4
PORT = 8123  # the prefill instance's side channel, as its connector announces it


def instance(role: str, num_blocks: int = 16, enable_caching: bool = False) -> Scheduler:
    """A prefill ("kv_producer") or decode ("kv_consumer") instance's scheduler with the shared-memory connector."""
    config = KVTransferConfig(kv_role=role, kv_port=PORT, engine_id=role, kv_lease_duration=30)
    kv = PagedBlockManager(num_blocks, BLOCK, watermark=0.0, enable_caching=enable_caching)
    return Scheduler(kv, max_num_seqs=8, max_num_batched_tokens=64, connector=SharedMemoryConnectorScheduler(config, BLOCK))


def request(request_id: int, token_ids: list[int], params: dict | None = None, max_tokens: int = 4) -> SequenceGroup:
    seq = Sequence(request_id, len(token_ids), len(token_ids) + max_tokens, token_ids=list(token_ids))
    return SequenceGroup(request_id, [seq], kv_transfer_params=params)


def remote(num_prompt_tokens: int, blocks: list[int] | None = None) -> dict:
    """Parameters a prefill instance answers with (the proxy passes them on to the decode instance)."""
    return {"do_remote_prefill": True, "do_remote_decode": False, "transfer_id": "T" * 32, "remote_host": "127.0.0.1",
            "remote_port": PORT, "remote_engine_id": "kv_producer",
            "remote_block_ids": blocks if blocks is not None else list(range(-(-num_prompt_tokens // BLOCK)))}


PROMPT = list(range(500, 510))  # 10 tokens: 3 blocks of 4


def test_every_prompt_token_but_the_last_comes_from_the_prefill_instance_asynchronously():
    connector = instance("kv_consumer").connector
    group = request(0, PROMPT, remote(10))
    assert connector.get_num_new_matched_tokens(group, 0) == (9, True), \
        "10 prompt tokens, none cached here: 9 come from the prefill instance (the last is computed here), load_async True"
    assert connector.get_num_new_matched_tokens(group, 8) == (1, True), "8 tokens hit this engine's own prefix cache: 1 is left to load"
    short = request(1, PROMPT[:9], remote(9))
    assert connector.get_num_new_matched_tokens(short, 8) == (0, True), "9 tokens, 8 cached here: nothing to load, never below 0"
    forged = request(2, PROMPT, {**remote(10), "remote_host": "169.254.169.254"})
    assert connector.get_num_new_matched_tokens(forged, 0) == (0, False) and forged.kv_transfer_params["kv_load"] == "recomputed", \
        "parameters that cannot be served are refused before anything is loaded (the given check)"


def test_the_load_is_recorded_with_the_decode_blocks_the_scheduler_allocated():
    decode = instance("kv_consumer")
    decode.add(request(0, list(range(10, 18))))  # a local request takes the first two blocks
    step(decode)
    group = request(1, PROMPT, remote(10, [7, 3, 9]))
    decode.add(group)
    out = decode.schedule()
    assert group.status is SequenceStatus.WAITING_FOR_REMOTE_KVS, "the request waits for its KV outside the batch"
    table = list(group.seqs[0].block_table)
    assert len(table) == 3 and not {0, 1} & set(table), "its three blocks are allocated before the load, beside the local ones"
    loads = out.kv_connector_metadata.reqs_to_recv
    assert len(loads) == 1, "this step's metadata carries one load: update_state_after_alloc records it in self._to_recv"
    spec = loads[0]
    assert (spec.request_id, spec.local_block_ids, spec.remote_block_ids, spec.first_block) == (1, tuple(table), (7, 3, 9), 0), \
        f"remote blocks (7, 3, 9) land in the decode blocks {tuple(table)} from logical block 0; got {spec}"
    assert (spec.transfer_id, spec.remote_host, spec.remote_port) == ("T" * 32, "127.0.0.1", PORT), "the load names the lease and the side channel"
    assert spec.prompt_hash == prompt_hash(PROMPT), "the prompt's hash, which the prefill instance checks before it serves a read"
    assert group.kv_transfer_params == {"kv_load": "loading", "remote_engine_id": "kv_producer"}, \
        "while loading, the request's kv_transfer_params keep no transfer id: {'kv_load': 'loading', 'remote_engine_id': ...}"
    assert decode.schedule().kv_connector_metadata.is_empty, "a load is handed to the workers once"
    decode.update_from_kv_xfer_finished(KVConnectorOutput(finished_recving={1}))
    assert group.kv_transfer_params["kv_load"] == "loaded", "the load ended: the connector finds it in self._pending"


def test_blocks_that_hit_the_decode_instances_own_prefix_cache_are_not_loaded_again():
    decode = instance("kv_consumer", enable_caching=True)
    local = request(0, PROMPT[:8] + [900, 901])  # the same first 8 tokens: two full blocks cached here
    decode.add(local)
    while decode.has_unfinished():
        step(decode)
        if local.seqs[0].num_tokens > 11:
            decode.finish(local, "length")
    group = request(1, PROMPT, remote(10))
    decode.add(group)
    (spec,) = decode.schedule().kv_connector_metadata.reqs_to_recv
    assert group.seqs[0].num_computed_tokens == 8, "the scheduler found 8 prompt tokens in this engine's own cache"
    assert spec.first_block == 2 and spec.local_block_ids == tuple(group.seqs[0].block_table), \
        f"only logical blocks 2 on are loaded (blocks 0 and 1 hit the local cache): first_block 2, got {spec.first_block}"


def test_a_finished_prefill_lends_its_blocks_under_a_lease_and_names_them():
    prefill = instance("kv_producer")
    group = request(0, PROMPT, {"do_remote_decode": True}, max_tokens=1)
    prefill.add(group)
    step(prefill)
    blocks = list(group.seqs[0].block_table)
    prefill.finish(group, "length")
    params = group.kv_transfer_params
    assert params is not None and params.get("do_remote_prefill") is True and params.get("do_remote_decode") is False, \
        f"the finished prefill answers do_remote_prefill True, do_remote_decode False; got {params}"
    assert params["remote_block_ids"] == blocks and params["remote_engine_id"] == "kv_producer", "the lent blocks, in logical order, and this engine"
    assert (params["remote_host"], params["remote_port"]) == ("127.0.0.1", PORT), "where the side channel answers (self.side_channel)"
    assert params["transfer_id"] in prefill.connector.leases.live_ids(), "the transfer id is a lease granted in the lease table"
    assert 0 in prefill.lent and prefill.kv.num_free_blocks == 16 - 3, "delay_free: its 3 blocks stay held while the lease lives"
    lease = prefill.connector.leases.claim(params["transfer_id"], blocks, prompt_hash(PROMPT))
    assert lease.block_ids == tuple(blocks), "the lease serves exactly these blocks for this prompt"
    prefill.connector.leases.release(params["transfer_id"], prompt_hash(PROMPT))
    assert prefill.free_lent_blocks() == [0] and prefill.kv.num_free_blocks == 16, "released: the blocks are freed"


def test_only_a_completed_prefill_with_do_remote_decode_lends():
    prefill = instance("kv_producer")
    aborted = request(0, PROMPT, {"do_remote_decode": True})
    plain = request(1, list(range(600, 606)))
    for group in (aborted, plain):
        prefill.add(group)
    step(prefill)
    prefill.finish(aborted, "abort")
    prefill.finish(plain, "stop")
    assert not prefill.lent and prefill.kv.num_free_blocks == 16, "an aborted request and a plain one lend nothing: every block is free"
    assert aborted.kv_transfer_params == {"do_remote_decode": True} and plain.kv_transfer_params is None, "and get no parameters"
    decode = instance("kv_consumer")
    asked = request(2, PROMPT, {"do_remote_decode": True})
    decode.add(asked)
    step(decode)
    decode.finish(asked, "length")
    assert not decode.lent and decode.kv.num_free_blocks == 16, "a decode instance (no lease table) lends nothing"


def test_a_handover_from_the_prefill_scheduler_to_the_decode_scheduler():
    prefill, decode = instance("kv_producer"), instance("kv_consumer")
    decode.add(request(9, list(range(40, 48))))  # the decode instance is busy: its blocks differ from the prefill's
    step(decode)
    first = request(0, PROMPT, {"do_remote_decode": True}, max_tokens=1)
    prefill.add(first)
    step(prefill)
    prefill.finish(first, "length")
    lent = first.kv_transfer_params
    second = request(0, PROMPT, dict(lent))  # the proxy's second call: the same prompt, the prefill's answer
    decode.add(second)
    out = decode.schedule()
    (spec,) = out.kv_connector_metadata.reqs_to_recv
    assert spec.remote_block_ids == tuple(lent["remote_block_ids"]) and spec.local_block_ids == tuple(second.seqs[0].block_table)
    lease = prefill.connector.leases.claim(spec.transfer_id, list(spec.remote_block_ids), spec.prompt_hash)
    assert lease.request_id == 0, "the prefill instance serves the read your load asks for (its transfer id, blocks and prompt)"
    prefill.connector.leases.release(spec.transfer_id, spec.prompt_hash)
    assert prefill.free_lent_blocks() == [0], "once the decode instance released the lease, the prefill's blocks are free"
    decode.update_from_output(out)
    decode.update_from_kv_xfer_finished(KVConnectorOutput(finished_recving={0}))
    out = decode.schedule()
    assert [(seq.seq_id, out.num_tokens_of(seq)) for seq in out.prefill_seqs] == [(0, 1)], \
        "the KV arrived: the decode instance computes only the last prompt token"
