"""A prefill instance and a decode instance in one process, stepped by hand: a handover to watch.

``serve-disagg`` runs the two instances as processes whose engine threads step on their own; a class
that wants to see a request's KV blocks move needs both engines to stand still between clicks.
:class:`DisaggPair` holds two :class:`~engine.llm_engine.LLMEngine` objects with the shared-memory KV
connector between them (``kv_producer`` and ``kv_consumer``, ``engine/kv_transfer/``) and the prefill
instance's real side channel (``engine/entrypoints/kv_transfer.py``'s routes, served by uvicorn on a
loopback port). Every call the side channel makes into the prefill engine waits in a queue until
:meth:`DisaggPair.step` runs it on the caller's thread, between the engines' steps, as a server's
engine thread does. The pair plays the proxy's part too. In the pull order (vLLM's ``toy_proxy_server.py``)
each prompt goes to the prefill instance with ``max_tokens=1`` and ``do_remote_decode``, and, once it
finished, to the decode instance with the ``kv_transfer_params`` it answered. In the push order
(SGLang's, ``kv_handover="push"`` on both engines) it goes to both at once with one bootstrap room; each
step runs the prefill engine (which prefills the prompts whose room is bootstrapped and writes their KV
into the decode instance's reserved blocks), then the decode engine (which reserves blocks for new
prompts and bootstraps their rooms, and takes in the KV written for it).

:meth:`DisaggPair.state` returns plain data: each instance's pool (who holds each block, and why)
and every handover (which prefill block went to which decode block, the bytes, the milliseconds,
the lease's state).
"""

from __future__ import annotations

import asyncio
import math
import queue
import secrets
import socket
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch
import uvicorn
from fastapi import FastAPI

from engine.entrypoints.kv_transfer import add_kv_transfer_routes
from engine.kv_transfer.bootstrap import KVPoll
from engine.kv_transfer.shared_memory_connector import MAX_BOOTSTRAP_ROOM
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams

SERVE_TIMEOUT_S = 10.0  # the longest a step waits for the decode instance's read and release
LEASE_STATES = ("lent", "read", "released", "expired")


@dataclass
class Handover:
    """One request's KV handed from the prefill instance to the decode instance.

    Attributes:
        prefill_request_id, decode_request_id: the request on each instance (None before it reached it).
        transfer_id: the lease's unguessable name (``secrets.token_urlsafe``, 32 characters); in the push
            order the decode instance's reservation's ("" before it reserved).
        prefill_blocks: the prefill instance's blocks holding the prompt, logical order.
        decode_blocks: the decode instance's blocks, logical order (empty before it allocated them).
        first_block: the first logical block read (those before it hit the decode instance's prefix cache).
        lease: "lent", "read" (copied into shared memory), "released" (the reader is done: the
            prefill blocks are free) or "expired" (nobody read it in time: freed unread).
        load: the decode instance's side: "waiting" (not admitted yet), "loading", "loaded",
            "recomputed" (the read failed: it prefilled the prompt itself).
        num_bytes: bytes read, every layer's K and V of the blocks read (0 before the read).
        copy_ms: the prefill engine's copy of the blocks into a shared-memory segment, ms.
        read_ms: from that copy's start to the decode instance's release (the copy, the segment's
            copy out on the decode side, the release), ms.
        lent_at_step, read_at_step, ended_at_step: the pair's step that lent it, read it (push: wrote
            it), and ended its load (loaded or recomputed) (None: not yet).
        bootstrap_room: the push order's room id (None: the pull order).
        poll: push: the transfer's state as the decode instance sees it, SGLang's ``KVPoll`` name
            ("Bootstrapping", "WaitingForInput", "Transferring", "Success", "Failed").
        reserved_at_step: push: the pair's step in which the decode instance reserved its blocks.
    """

    prefill_request_id: int
    transfer_id: str
    prefill_blocks: list[int]
    decode_request_id: int | None = None
    decode_blocks: list[int] = field(default_factory=list)
    first_block: int = 0
    lease: str = "lent"
    load: str = "waiting"
    num_bytes: int = 0
    copy_ms: float | None = None
    read_ms: float | None = None
    lent_at_step: int | None = None
    read_at_step: int | None = None
    ended_at_step: int | None = None
    bootstrap_room: int | None = None
    poll: str | None = None
    reserved_at_step: int | None = None

    @property
    def moves(self) -> list[tuple[int, int]]:
        """``(prefill block, decode block)`` for each block read, logical order (none before the read)."""
        if self.read_at_step is None:
            return []
        end = min(len(self.prefill_blocks), len(self.decode_blocks))
        return list(zip(self.prefill_blocks[self.first_block : end], self.decode_blocks[self.first_block : end]))


@dataclass
class PoolState:
    """One instance's pool after a step.

    Attributes:
        role: "prefill" or "decode".
        num_blocks: physical blocks in the pool (the null block 0 included when the pool keeps one).
        holders: block id -> ``(request id, why)``; why is "running" (in the batch), "lent" (a finished
            prefill's blocks under a lease), "loading" (allocated, its KV being read in), "reserved"
            (push: allocated, waiting for the prefill instance to write its KV) or "loaded" (its KV in,
            its last prompt token not yet computed). A free block is absent.
        block_tables: request id -> ``(its blocks in logical order, why)``.
    """

    role: str
    num_blocks: int
    holders: dict[int, tuple[int, str]]
    block_tables: dict[int, tuple[list[int], str]]


@dataclass
class PairState:
    """The pair after :meth:`DisaggPair.step` number ``step`` (-1: before the first)."""

    step: int
    prefill: PoolState
    decode: PoolState
    handovers: list[Handover]
    texts: dict[int, str]  # decode request id -> its text so far


class _SteppedEngineThread:
    """What the side-channel routes need of an ``AsyncLLM``: the engine, and ``run_on_engine``, whose
    calls wait in a queue until the pair runs them on its own thread between steps."""

    def __init__(self, engine: LLMEngine):
        self.engine = engine
        self.calls: queue.Queue = queue.Queue()

    async def run_on_engine(self, fn, *args):
        done: Future = Future()
        self.calls.put((fn, args, done))
        return await asyncio.wrap_future(done)


class DisaggPair:
    """A prefill engine and a decode engine, their KV handed over through shared memory, stepped by hand.

    Args:
        prefill, decode: engines built with ``kv_transfer_config`` ``{"kv_role": "kv_producer"}`` and
            ``{"kv_role": "kv_consumer"}`` (the same model, block size and cache dtype, and ``kv_handover``).

    Raises:
        ValueError: an engine without the role it needs, or the two in different orders.
    """

    def __init__(self, prefill: LLMEngine, decode: LLMEngine):
        if prefill.kv_connector is None or not prefill.config.kv_transfer_config.is_kv_producer:
            raise ValueError("the prefill engine needs kv_transfer_config with kv_role kv_producer")
        if decode.kv_connector is None or not decode.config.kv_transfer_config.is_kv_consumer:
            raise ValueError("the decode engine needs kv_transfer_config with kv_role kv_consumer")
        self.order = prefill.config.kv_transfer_config.kv_handover
        if decode.config.kv_transfer_config.kv_handover != self.order:
            raise ValueError("the prefill and decode engines need the same kv_handover (pull or push)")
        self.prefill, self.decode = prefill, decode
        self.step_index = 0
        self.handovers: list[Handover] = []
        self._queued: list[tuple[int, list[int], int, float]] = []  # prefill request id, prompt ids, max_tokens, temperature
        self._to_send: list[tuple[Handover, list[int], SamplingParams, dict]] = []
        self._read_started: dict[str, float] = {}  # transfer id -> when its copy began (perf_counter, s)
        self._released: set[str] = set()  # transfer ids whose reader's release arrived (a refused read releases too)
        self._thread = _SteppedEngineThread(prefill)
        app = FastAPI()
        add_kv_transfer_routes(app, self._thread, 1 << 20)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        prefill.kv_connector.side_channel = ("127.0.0.1", sock.getsockname()[1])
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        self._server_thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, daemon=True,
                                               name="kv-side-channel")
        self._server_thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if not self._server_thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the prefill instance's side channel did not start")
            time.sleep(0.01)

    def add_request(self, prompt: str | list[int], max_tokens: int, temperature: float = 0.0) -> int:
        """The proxy's first call: ``prompt`` to the prefill instance with ``max_tokens=1`` and
        ``do_remote_decode``. Returns its request id on the prefill instance.

        Raises:
            ValueError: the prefill engine refused the request.
        """
        if self.order == "push":
            return self._add_push(prompt, max_tokens, temperature)
        rid = self.prefill.add_request(prompt, SamplingParams(max_tokens=1, temperature=temperature),
                                       kv_transfer_params={"do_remote_decode": True})
        self._queued.append((rid, list(self.prefill.get_output(rid).prompt_token_ids), max_tokens, temperature))
        return rid

    def _add_push(self, prompt: str | list[int], max_tokens: int, temperature: float) -> int:
        """The push order's router: the prompt to both instances at once, one new bootstrap room."""
        room = secrets.randbelow(MAX_BOOTSTRAP_ROOM)
        rid = self.prefill.add_request(prompt, SamplingParams(max_tokens=1, temperature=temperature),
                                       kv_transfer_params={"do_remote_decode": True, "bootstrap_room": room})
        prompt_ids = list(self.prefill.get_output(rid).prompt_token_ids)
        host, port = self.prefill.kv_connector.side_channel
        drid = self.decode.add_request(prompt_ids, SamplingParams(max_tokens=max_tokens, temperature=temperature), kv_transfer_params={
            "do_remote_prefill": True, "bootstrap_room": room, "remote_host": host, "remote_port": port})
        self.handovers.append(Handover(rid, "", [], drid, lease="", bootstrap_room=room, poll=KVPoll.Bootstrapping.value))
        return rid

    def has_unfinished(self) -> bool:
        return (self.prefill.has_unfinished_requests() or self.decode.has_unfinished_requests() or bool(self._queued)
                or bool(self._to_send))

    def step(self) -> PairState:
        """One step of each engine that has work, the proxy's second call for every prefill that
        finished, and the side channel's reads and releases of the loads the decode step began (push:
        see the module's docstring)."""
        if self.order == "push":
            return self._step_push()
        self._serve(block=False)
        self.prefill.free_lent_blocks()
        self._send_to_decode()  # the prefills lent last step: a step shows their blocks lent before they move
        if self.prefill.has_unfinished_requests():
            self.prefill.step()
        self._note_finished_prefills()
        if self.decode.has_unfinished_requests():
            self.decode.step()
        self._note_loads()
        self._serve(block=True)
        self._note_leases()
        self.step_index += 1
        return self.state()

    def _step_push(self) -> PairState:
        if self.prefill.has_unfinished_requests():
            self.prefill.step()
        self._note_pushes()
        if self.decode.has_unfinished_requests():
            self.decode.step()
        self._note_reservations()
        self._note_loads()
        self.step_index += 1
        return self.state()

    def close(self) -> None:
        """Stop the side channel and the decode instance's reads; unlink every segment."""
        self._server.should_exit = True
        self._serve(block=False)
        self._server_thread.join(5)
        self.decode.shutdown_kv_connector()
        self.prefill.shutdown_kv_connector()

    # ---- the proxy -------------------------------------------------------------------------

    def _note_finished_prefills(self) -> None:
        """Prefills that finished this step: their blocks are lent (a handover begins) or, aborted or
        refused, their prompt goes to the decode instance alone, which prefills it."""
        for entry in list(self._queued):
            rid, prompt_ids, max_tokens, temperature = entry
            out = self.prefill.get_output(rid)
            if not out.finished:
                continue
            self._queued.remove(entry)
            params = out.kv_transfer_params
            if not params or not params.get("do_remote_prefill"):
                self.decode.add_request(prompt_ids, SamplingParams(max_tokens=max_tokens, temperature=temperature))
                continue
            self.handovers.append(Handover(rid, params["transfer_id"], list(params["remote_block_ids"]), lent_at_step=self.step_index))
            self._to_send.append((self.handovers[-1], prompt_ids, SamplingParams(max_tokens=max_tokens, temperature=temperature), params))

    def _send_to_decode(self) -> None:
        """The proxy's second call: the prompt, with the ``kv_transfer_params`` the prefill answered."""
        for handover, prompt_ids, params, kv_transfer_params in self._to_send:
            handover.decode_request_id = self.decode.add_request(prompt_ids, params, kv_transfer_params=kv_transfer_params)
        self._to_send = []

    # ---- the push order ------------------------------------------------------------------------

    def _note_pushes(self) -> None:
        """The writes the prefill step made; each waits (at most :data:`SERVE_TIMEOUT_S`) until the
        decode instance's poll has its answer, so that its next step takes the KV in."""
        worker = self.prefill.kv_connector_worker
        by_room = {h.bootstrap_room: h for h in self.handovers}
        pushed, worker.pushed = worker.pushed, []
        for p in pushed:
            h = by_room.get(p.bootstrap_room)
            if h is None:
                continue
            h.prefill_blocks, h.num_bytes, h.copy_ms, h.read_at_step = list(p.block_ids), p.num_bytes, p.write_ms, self.step_index
            self.decode.kv_connector_worker.wait_for_load(h.decode_request_id, SERVE_TIMEOUT_S)

    def _note_reservations(self) -> None:
        """Reservations the decode step made: their blocks and id; each waits (at most
        :data:`SERVE_TIMEOUT_S`) until the prefill instance has its room bootstrapped (or refused)."""
        waiting = self.decode.scheduler.waiting_for_remote_kvs
        for h in self.handovers:
            spec = self.decode.kv_connector.pending_load(h.decode_request_id)
            if h.reserved_at_step is None and spec is not None and h.decode_request_id in waiting:
                h.transfer_id, h.decode_blocks, h.first_block = spec.transfer_id, list(spec.local_block_ids), spec.first_block
                h.reserved_at_step, h.load = self.step_index, "loading"
                deadline, worker = time.monotonic() + SERVE_TIMEOUT_S, self.decode.kv_connector_worker
                while (worker.poll_states.get(h.decode_request_id) is KVPoll.Bootstrapping and worker.load_in_flight(h.decode_request_id)
                       and time.monotonic() < deadline):
                    time.sleep(0.005)  # the prefill instance answers the bootstrap (or refuses it)
            if h.poll not in (KVPoll.Success.value, KVPoll.Failed.value):
                h.poll = self.decode.kv_connector_worker.poll_states.get(h.decode_request_id, KVPoll(h.poll)).value

    # ---- the decode instance's loads and the prefill instance's side channel -------------------

    def _note_loads(self) -> None:
        waiting = self.decode.scheduler.waiting_for_remote_kvs
        for h in self.handovers:
            if h.load == "waiting" and h.decode_request_id in waiting:
                seq = waiting[h.decode_request_id].seqs[0]
                h.decode_blocks, h.first_block = list(seq.block_table), seq.num_computed_tokens // self.decode.config.block_size
                h.load = "loading"
            if h.load in ("waiting", "loading") and h.decode_request_id is not None:
                params = self.decode.get_output(h.decode_request_id).kv_transfer_params or {}
                if params.get("kv_load") in ("loaded", "recomputed"):
                    h.load, h.ended_at_step = params["kv_load"], self.step_index
                    if h.bootstrap_room is not None:
                        h.poll = (KVPoll.Success if params["kv_load"] == "loaded" else KVPoll.Failed).value

    def _serve(self, block: bool) -> None:
        """Run the side channel's calls into the prefill engine. ``block``: until every load begun
        has been read and released (at most :data:`SERVE_TIMEOUT_S`), then until its bytes arrived."""
        deadline = time.monotonic() + SERVE_TIMEOUT_S
        while True:
            pending = [h for h in self.handovers if h.load == "loading" and h.transfer_id not in self._released
                       and h.decode_request_id in self.decode.scheduler.waiting_for_remote_kvs]
            if block and not pending:
                break
            try:
                fn, args, done = self._thread.calls.get(timeout=0.05 if block else 0)
            except queue.Empty:
                if not block or time.monotonic() > deadline:
                    break
                continue
            self._run(fn, args, done)
        if block:
            self.decode.kv_connector_worker.wait_for_any(SERVE_TIMEOUT_S)

    def _run(self, fn, args, done: Future) -> None:
        by_id = {h.transfer_id: h for h in self.handovers}
        started = time.perf_counter()
        try:
            result = fn(*args)
        except Exception as error:  # noqa: BLE001 - the side channel answers it (a refusal is a 403)
            done.set_exception(error)
            return
        name = getattr(fn, "__name__", "")
        if name == "serve_kv_read" and args[0].transfer_id in by_id:
            h = by_id[args[0].transfer_id]
            h.lease, h.read_at_step, self._read_started[h.transfer_id] = "read", self.step_index, started
            h.copy_ms = (time.perf_counter() - started) * 1e3
            element = torch.empty((), dtype=getattr(torch, result["dtype"])).element_size()
            h.num_bytes = math.prod(result["shape"]) * element
        elif name == "release_kv_transfer" and args[0] in by_id:
            h = by_id[args[0]]
            self._released.add(h.transfer_id)
            if result:
                h.lease = "released"
            if result and h.transfer_id in self._read_started:
                h.read_ms = (time.perf_counter() - self._read_started[h.transfer_id]) * 1e3
        done.set_result(result)

    def _note_leases(self) -> None:
        live = self.prefill.kv_connector.leases.live_ids()
        for h in self.handovers:
            if h.lease in ("lent", "read") and h.transfer_id not in live:
                h.lease = "expired"
        self._note_loads()

    # ---- plain data ---------------------------------------------------------------------------

    def state(self) -> PairState:
        """Both pools and every handover now (see :class:`PairState`)."""
        leases = self.prefill.kv_connector.leases
        live = leases.live_ids() if leases is not None else set()
        lent = {h.prefill_request_id: (h.prefill_blocks, "lent") for h in self.handovers if h.transfer_id in live}
        prefill = _pool("prefill", self.prefill, lent)
        texts = {h.decode_request_id: self.decode.get_output(h.decode_request_id).text for h in self.handovers
                 if h.decode_request_id is not None}
        decode = _pool("decode", self.decode, {}, "reserved" if self.order == "push" else "loading")
        return PairState(self.step_index - 1, prefill, decode, list(self.handovers), texts)


def _pool(role: str, engine: LLMEngine, extra: dict[int, tuple[list[int], str]], loading: str = "loading") -> PoolState:
    """An engine's pool: its running requests' blocks, those waiting for their KV (as ``loading``: the
    pull order's "loading", the push order's "reserved") or loaded (a decode instance) and ``extra``
    (request id -> (blocks, why): a prefill instance's lent blocks)."""
    s, kv = engine.scheduler, engine.kv
    tables: dict[int, tuple[list[int], str]] = {}
    for why, groups in (("running", s.running), (loading, list(s.waiting_for_remote_kvs.values())), ("loaded", list(s.remote_kv_ready))):
        for snap in kv.snapshot(list(groups)):
            tables.setdefault(snap.request_id, (snap.block_table, why))
    tables.update(extra)
    holders = {b: (rid, why) for rid, (blocks, why) in tables.items() for b in blocks}
    return PoolState(role, len(kv.allocator.ref_counts), holders, tables)
