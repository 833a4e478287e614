"""A KV connector over shared memory, in vLLM's pull order (NixlConnector's, with POSIX shared memory
for RDMA and the prefill instance's HTTP server as its side channel; no dependency beyond the
standard library and torch) or, with ``kv_handover="push"``, in SGLang's push order (the decode
instance reserves blocks and the prefill instance writes into them: ``engine/kv_transfer/bootstrap.py``
and ``docs/disaggregation.md``).

The handover of one request, prefill instance P (``kv_producer``) to decode instance D (``kv_consumer``):

1. P runs the prompt with ``max_tokens=1`` and ``kv_transfer_params={"do_remote_decode": true}``. When
   it finishes, :meth:`SharedMemoryConnectorScheduler.request_finished` keeps its blocks (``delay_free``)
   under a lease (``engine/kv_transfer/lease.py``) and returns ``do_remote_prefill``, ``remote_block_ids``,
   ``remote_engine_id``, ``remote_host``, ``remote_port`` and an unguessable ``transfer_id``.
2. D gets the same prompt with those parameters. At admission the connector says all but the last
   prompt token come from P (``get_num_new_matched_tokens`` -> ``(P - 1 - cached, True)``); D allocates
   the blocks and the request waits in ``WAITING_FOR_REMOTE_KVS``.
3. D's worker side reads in a background thread: ``POST /kv_transfer/read`` to P (transfer id, the
   blocks, its prompt's hash). P checks the lease, copies the blocks of every layer into a new
   shared-memory segment and names it; D copies the segment into a private buffer and tells P
   ``POST /kv_transfer/release``: P unlinks the segment and frees the blocks.
4. On D's engine thread, if the request still waits, the buffer is copied into its blocks and the
   scheduler admits it with one prompt token to compute (the last: its logits choose the first token).

Any failure at 3 (P dead, a timeout, a refused lease, a shape that does not match) makes D prefill the
prompt itself (``kv_load_failure_policy="recompute"``), log it, and say so in the request's
``kv_transfer_params`` (``{"kv_load": "recomputed", "kv_load_error": ...}``).

In vLLM the scheduler side and the worker side live in different processes and talk only through
the step's metadata and the workers' output; here both live in the engine's process, and the
producer's lease table is the one object they share (thread-safe).
"""

from __future__ import annotations

import _posixshmem
import json
import logging
import math
import mmap
import os
import secrets
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from dataclasses import dataclass
from multiprocessing import shared_memory

import numpy
import torch

from engine.config import KVTransferConfig
from engine.core.lab_impl import plug_lab_parts
from engine.core.sequence import SequenceGroup
from engine.kv_transfer.base import (KVConnectorMetadata, KVConnectorOutput, KVConnectorScheduler, KVConnectorWorker,
                                     KVLoadSpec, KVSendSpec)
from engine.kv_transfer.bootstrap import BootstrapTable, KVPoll, Reservation
from engine.kv_transfer.lease import TRANSFER_ID_BYTES, Lease, LeaseTable, TransferRefused, prompt_hash

logger = logging.getLogger("engine.kv_transfer")

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
DEFAULT_TIMEOUT_S = 10.0
SEGMENT_PREFIX = "pal-kv-"  # /dev/shm/pal-kv-<random>: one segment per read, unlinked at release
PUSH_SEGMENT_PREFIX = "pal-kv-push-"  # /dev/shm/pal-kv-push-<24 hex>: one per push reservation, the decode instance's
MAX_BOOTSTRAP_ROOM = 2**63  # SGLang's rooms are random 63-bit integers
MAX_PUSH_LOADS = 1024  # a decode instance's push loads in flight at once, each a thread waiting in its poll


class SharedMemoryConnectorScheduler(KVConnectorScheduler):
    """The scheduler side: which prompts come from elsewhere, and which blocks are lent.

    Args:
        config: the engine's :class:`~engine.config.KVTransferConfig`.
        block_size: tokens per block (the same on both instances, checked at the read).
        clock: the lease table's clock (tests pass their own).
    """

    def __init__(self, config: KVTransferConfig, block_size: int, clock=None):
        self.config = config
        self.block_size = block_size
        self.engine_id = config.engine_id or f"engine-{secrets.token_hex(4)}"
        push = config.kv_handover == "push"
        self.leases = LeaseTable(config.kv_lease_duration, *([clock] if clock else [])) if config.is_kv_producer and not push else None
        self.bootstrap = BootstrapTable(config.kv_lease_duration, *([clock] if clock else [])) if config.is_kv_producer and push else None
        self._pushing: dict[int, SequenceGroup] = {}  # producer, push: request id -> request whose room is live
        self._bootstrapping: set[int] = set()  # producer, push: those still waiting for their reservation
        extra = config.kv_connector_extra_config
        self.allowed_remote_hosts = tuple(extra.get("allowed_remote_hosts", LOOPBACK_HOSTS))
        self.side_channel: tuple[str, int | None] = (config.kv_ip or "127.0.0.1", config.kv_port)
        self._to_recv: list[KVLoadSpec] = []
        self._to_discard: list[int] = []
        self._pending: dict[int, KVLoadSpec] = {}  # request id -> its load, until it ends
        self.num_loaded = 0
        self.num_recomputed = 0

    # ---- consumer ------------------------------------------------------------------------------

    def get_num_new_matched_tokens(self, request: SequenceGroup, num_computed_tokens: int) -> tuple[int | None, bool]:
        """At admission of a request whose ``kv_transfer_params`` say ``do_remote_prefill``: how many of
        its prompt tokens the prefill instance supplies, beyond the ``num_computed_tokens`` (a multiple
        of ``block_size``) that this engine's own prefix cache holds already.

        Returns ``(num_external_tokens, load_async)``: all prompt tokens but the last
        (``request.num_prompt_tokens - 1``; the decode instance computes the last itself, its logits
        choose the first output token), less the local hit, never below 0; ``load_async`` True (the
        request waits in ``WAITING_FOR_REMOTE_KVS`` while the others run: vLLM's NixlConnector). The
        parameters are untrusted: ones that cannot be served (a host not allowed, malformed fields)
        are refused first, and the request prefills its whole prompt itself, ``(0, False)``."""
        why = self._check_params(request)
        if why is not None:
            self.request_load_failed(request, why)
            return 0, False
        # BEGIN SOLUTION kv_connector
        return max(request.num_prompt_tokens - 1 - num_computed_tokens, 0), True
        # END SOLUTION

    def update_state_after_alloc(self, request: SequenceGroup, block_ids: list[int], num_external_tokens: int) -> None:
        """The scheduler allocated the request's blocks (``block_ids``: every block of its prompt, in
        logical order): remember the load, to be handed to the worker side at this step's
        :meth:`build_connector_meta`.

        Records one :class:`KVLoadSpec` in ``self._to_recv`` (this step's loads) and in
        ``self._pending`` (request id -> its load, until it ends): the request id; the
        ``transfer_id``, ``remote_host``, ``remote_port`` (an int) and ``remote_block_ids`` (a tuple)
        of its ``kv_transfer_params``; ``block_ids`` as a tuple; the first logical block to load
        (the blocks before it hit this engine's prefix cache: the prompt's tokens not supplied
        remotely, ``num_prompt_tokens - 1 - num_external_tokens``, in whole blocks); and the prompt's
        :func:`prompt_hash` (its first ``num_prompt_tokens`` token ids), which the prefill instance
        checks. The request's ``kv_transfer_params`` become ``{"kv_load": "loading",
        "remote_engine_id": <the one it was given>}``: the transfer id is not kept where a client
        would see it.

        In the push order (``kv_handover="push"``) the blocks are this request's reservation instead
        (:meth:`_reserve`, given code)."""
        if self.config.kv_handover == "push":
            self._reserve(request, block_ids, num_external_tokens)
            return
        # BEGIN SOLUTION kv_connector
        params = request.kv_transfer_params
        first = (request.num_prompt_tokens - 1 - num_external_tokens) // self.block_size
        hash_ = prompt_hash(request.seqs[0].token_ids[: request.num_prompt_tokens])
        spec = KVLoadSpec(request.request_id, params["transfer_id"], params["remote_host"], int(params["remote_port"]),
                          tuple(params["remote_block_ids"]), tuple(block_ids), first, hash_)
        request.kv_transfer_params = {"kv_load": "loading", "remote_engine_id": params.get("remote_engine_id")}
        self._to_recv.append(spec)
        self._pending[request.request_id] = spec
        # END SOLUTION

    def _reserve(self, request: SequenceGroup, block_ids: list[int], num_external_tokens: int) -> None:
        """Push: the allocated blocks are this request's reservation, named by a new unguessable transfer
        id (the prefill instance writes into them, never into blocks a message names)."""
        params = request.kv_transfer_params
        first = (request.num_prompt_tokens - 1 - num_external_tokens) // self.block_size
        hash_ = prompt_hash(request.seqs[0].token_ids[: request.num_prompt_tokens])
        spec = KVLoadSpec(request.request_id, secrets.token_urlsafe(TRANSFER_ID_BYTES), params["remote_host"], int(params["remote_port"]),
                          (), tuple(block_ids), first, hash_, params["bootstrap_room"])
        request.kv_transfer_params = {"kv_load": "loading", "kv_poll": KVPoll.Bootstrapping.value, "bootstrap_room": spec.bootstrap_room}
        self._to_recv.append(spec)
        self._pending[request.request_id] = spec

    def pending_load(self, request_id: int) -> KVLoadSpec | None:
        """A consumer's load (or push reservation) under way, or None."""
        return self._pending.get(request_id)

    def build_connector_meta(self, scheduler_output) -> KVConnectorMetadata:
        """The step's loads and discards; for a pushing producer, the pushes of the requests whose
        prompt this step's forward pass completes (their room bootstrapped)."""
        sends = []
        for seq in scheduler_output.prefill_seqs if self._pushing else ():
            group = self._pushing.get(seq.request_id)
            if group is not None and seq.num_computed_tokens + scheduler_output.num_tokens_of(seq) >= group.num_prompt_tokens:
                sends.append(KVSendSpec(seq.request_id, tuple(seq.block_table)))
        meta = KVConnectorMetadata(self._to_recv, self._to_discard, sends)
        self._to_recv, self._to_discard = [], []
        return meta

    def request_load_failed(self, request: SequenceGroup, why: str) -> None:
        self._pending.pop(request.request_id, None)
        self.num_recomputed += 1
        logger.warning("request %d: its KV could not be read from the prefill instance (%s): it prefills its prompt "
                       "itself (kv_load_failure_policy=recompute)", request.request_id, why)
        request.kv_transfer_params = {"kv_load": "recomputed", "kv_load_error": why,
                                      **({"kv_poll": KVPoll.Failed.value} if self.config.kv_handover == "push" else {})}

    def request_loaded(self, request: SequenceGroup) -> None:
        spec = self._pending.pop(request.request_id, None)
        self.num_loaded += 1
        if spec is not None and request.kv_transfer_params:
            num_blocks = max(len(spec.local_block_ids) - spec.first_block, 0)
            push = {"kv_poll": KVPoll.Success.value} if spec.bootstrap_room is not None else {}
            request.kv_transfer_params = {**request.kv_transfer_params, "kv_load": "loaded", "num_loaded_blocks": num_blocks, **push}

    def request_aborted_while_loading(self, request_id: int) -> None:
        if self._pending.pop(request_id, None) is not None:
            self._to_discard.append(request_id)

    def _check_params(self, request: SequenceGroup) -> str | None:
        """Why a consumer's ``kv_transfer_params`` cannot be served, or None. Untrusted input."""
        if not request.is_single:
            return "only one-sequence requests (n=1, no beam search) are handed over"
        p = request.kv_transfer_params
        tid, host, port, blocks = p.get("transfer_id"), p.get("remote_host"), p.get("remote_port"), p.get("remote_block_ids")
        if host not in self.allowed_remote_hosts:
            return f"remote_host {host!r} is not one this engine reads from (allowed_remote_hosts)"
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            return "remote_port must be a TCP port"
        if self.config.kv_handover == "push":
            room = p.get("bootstrap_room")
            if isinstance(room, bool) or not isinstance(room, int) or not 0 <= room < MAX_BOOTSTRAP_ROOM:
                return "bootstrap_room must be the router's room id, an integer in [0, 2**63)"
            return None  # this engine reserves its own blocks: a block list in the parameters is ignored
        if not isinstance(tid, str) or not 16 <= len(tid) <= 128:
            return "transfer_id must be the string the prefill instance returned"
        need = math.ceil((request.num_prompt_tokens - 1) / self.block_size)
        if (not isinstance(blocks, list) or not all(isinstance(b, int) and not isinstance(b, bool) and b >= 0 for b in blocks)
                or not need <= len(blocks) <= need + 1):
            return f"remote_block_ids must be the {need} or {need + 1} block ids holding the prompt"
        return None

    # ---- producer ------------------------------------------------------------------------------

    def request_finished(self, request: SequenceGroup, block_ids: list[int]) -> tuple[bool, dict | None]:
        """A request finished (its ``finish_reason`` set; ``block_ids``: its blocks, logical order).
        Returns ``(delay_free, kv_transfer_params)`` (vLLM's ``request_finished``).

        A decode request that finished before its load began (aborted while queued) gives its
        prefill instance's lease back: a load of no block, which only releases (vLLM's consumer side
        notifies its producer the same way); ``(False, None)``.

        On a prefill instance (``self.leases`` is its :class:`LeaseTable`), a request whose
        ``kv_transfer_params`` say ``do_remote_decode`` and that completed (``finish_reason`` "stop"
        or "length", not an abort) lends its blocks: ``self.leases.grant(request id, block_ids,
        prompt_hash of its prompt's token ids)``, and returns ``(True, params)``, ``delay_free`` True
        (the scheduler keeps the blocks until the lease is released or expires), with
        ``params = {"do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": the
        blocks as a list, "remote_engine_id": self.engine_id, "remote_host", "remote_port": from
        self.side_channel, "transfer_id": the lease's}``: what the decode instance needs to read
        them. Every other request lends nothing: ``(False, None)``."""
        params = request.kv_transfer_params
        if self.bootstrap is not None and request.request_id in self._pushing:
            return self._push_finished(request)
        if self.config.kv_handover == "push":
            return False, None  # a decode request that never reserved: its prefill instance's room fails on its own
        if params and params.get("do_remote_prefill") and self.config.is_kv_consumer and self._check_params(request) is None:
            request.kv_transfer_params = None
            self._to_recv.append(KVLoadSpec(request.request_id, params["transfer_id"], params["remote_host"], params["remote_port"],
                                            tuple(params["remote_block_ids"]), (), 0,
                                            prompt_hash(request.seqs[0].token_ids[: request.num_prompt_tokens])))
            return False, None
        # BEGIN SOLUTION kv_connector
        if self.leases is None or not params or not params.get("do_remote_decode") or request.finish_reason not in ("stop", "length"):
            return False, None
        seq = request.seqs[0]
        lease = self.leases.grant(request.request_id, block_ids, prompt_hash(seq.token_ids[: seq.num_prompt_tokens]))
        host, port = self.side_channel
        return True, {"do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": list(block_ids),
                      "remote_engine_id": self.engine_id, "remote_host": host, "remote_port": port,
                      "transfer_id": lease.transfer_id}
        # END SOLUTION

    def take_freeable(self, now: float | None = None) -> list[int]:
        if self.bootstrap is not None:
            self.bootstrap.expire()
        return self.leases.take_freeable() if self.leases is not None else []

    # ---- producer, push order (SGLang's) -------------------------------------------------------

    def request_bootstrapping(self, request: SequenceGroup) -> bool:
        """A pushing prefill instance's request (``do_remote_decode`` with a ``bootstrap_room``) waits
        for its decode instance's reservation: True until the room is bootstrapped."""
        params = request.kv_transfer_params
        if self.bootstrap is None or not params or not params.get("do_remote_decode"):
            return False
        room = params.get("bootstrap_room")
        self._pushing[request.request_id] = request
        seq = request.seqs[0]
        self.bootstrap.add_request(request.request_id, room, prompt_hash(seq.token_ids[: seq.num_prompt_tokens]))
        if self.bootstrap.waiting_for_input(request.request_id):
            return False
        self._bootstrapping.add(request.request_id)
        return True

    def take_bootstrapped(self) -> list[int]:
        if self.bootstrap is None:
            return []
        self.bootstrap.expire()
        self.bootstrap.changed.clear()
        ready = [rid for rid in self._bootstrapping if self.bootstrap.waiting_for_input(rid)]
        self._bootstrapping.difference_update(ready)
        return ready

    def _push_finished(self, request: SequenceGroup) -> tuple[bool, dict]:
        """A pushing prefill request ended: its KV was written in the step that completed its prompt
        (Success), or its room fails now. Its blocks are freed at once: nothing waits on them."""
        del self._pushing[request.request_id]
        self._bootstrapping.discard(request.request_id)
        state = self.bootstrap.forget(request.request_id) or KVPoll.Failed
        room = (request.kv_transfer_params or {}).get("bootstrap_room")
        return False, {"do_remote_decode": True, "bootstrap_room": room, "kv_poll": state.value}


@dataclass(frozen=True)
class Pushed:
    """One push a prefill instance made: its request and blocks, the decode instance's reserved blocks
    they went to (logical order), the bytes (every layer's K and V) and the write's time (ms)."""

    request_id: int
    bootstrap_room: int
    block_ids: tuple[int, ...]
    decode_block_ids: tuple[int, ...]
    num_bytes: int
    write_ms: float


class SharedMemoryConnectorWorker(KVConnectorWorker):
    """The worker side: reads lent blocks in (consumer), serves them out (producer).

    Args:
        config: the engine's :class:`~engine.config.KVTransferConfig`.
        kv_caches: the engine's pool, one ``(K, V)`` pair per layer, each
            ``[num_blocks, block_size, num_kv_heads, head_dim]`` of the cache dtype.
        leases: the scheduler side's lease table (a pulling producer), or None.
        bootstrap: the scheduler side's bootstrap table (a pushing producer), or None.
        attention: each layer's attention module, whose ``k_scale``, ``v_scale`` (floats) and
            ``calculate_kv_scales`` an fp8 pool is read with: they travel with the pages.
    """

    kv_connector = "SharedMemoryConnector"  # the transport, as kv_transfer_config names it

    def __init__(self, config: KVTransferConfig, kv_caches: list[tuple[torch.Tensor, torch.Tensor]], leases: LeaseTable | None,
                 bootstrap: BootstrapTable | None = None, attention: list | None = None):
        self.kv_caches = kv_caches
        self.leases = leases
        self.bootstrap = bootstrap
        self.attention = attention or []
        self.push_timeout_s = float(config.kv_lease_duration)
        self.poll_states: dict[int, KVPoll] = {}  # consumer, push: request id -> its reservation's state, until it lands
        self._sends: list[KVSendSpec] = []
        self.pushed: list[Pushed] = []  # producer, push: the writes made, for whoever watches (engine/disagg_pair.py drains it)
        self.timeout_s = float(config.kv_connector_extra_config.get("timeout_s", DEFAULT_TIMEOUT_S))
        # A push load waits in its poll until its prompt is prefilled: a load must not wait for a thread
        # while others hold them (its reservation would never reach the prefill instance). Threads are
        # started as loads need them; at most one per reserved request.
        workers = MAX_PUSH_LOADS if config.kv_handover == "push" else 2
        self._threads = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kv-load") if config.is_kv_consumer else None
        self._loads: dict[int, tuple[KVLoadSpec, Future]] = {}
        self._landed = threading.Event()
        self._segments: dict[str, shared_memory.SharedMemory] = {}  # producer: transfer id -> the segment it was read into
        self._lock = threading.Lock()
        self.num_loaded_blocks = 0  # consumer: blocks read from prefill instances (every layer's K and V)
        self.num_loaded_bytes = 0  # ... and their bytes (vLLM's NixlConnector: vllm:nixl_bytes_transferred)
        self.num_poll_ended = {KVPoll.Success.value: 0, KVPoll.Failed.value: 0}

    @property
    def block_shape(self) -> tuple[int, ...]:
        """One layer's K (or V) of one block: ``(block_size, num_kv_heads, head_dim)``."""
        return tuple(self.kv_caches[0][0].shape[1:])

    # ---- consumer ------------------------------------------------------------------------------

    def start_load_kv(self, metadata: KVConnectorMetadata | None) -> None:
        if metadata is None:
            return
        for request_id in metadata.reqs_to_discard:
            self._loads.pop(request_id, None)  # the read still ends, and releases the lease (push: unlinks the segment)
            self.poll_states.pop(request_id, None)
        for spec in metadata.reqs_to_recv:
            if spec.bootstrap_room is not None:
                self.poll_states[spec.request_id] = KVPoll.Bootstrapping
            self._loads[spec.request_id] = (spec, self._threads.submit(self._receive if spec.bootstrap_room is not None else self._read, spec))
        self._sends = list(metadata.reqs_to_send)

    def get_finished(self) -> KVConnectorOutput:
        """Loads whose bytes arrived: copied into the request's blocks here, on the engine's thread
        (the request still owns them: an aborted one was discarded first)."""
        out = KVConnectorOutput()
        for request_id, (spec, future) in list(self._loads.items()):
            if not future.done():
                continue
            del self._loads[request_id]
            try:
                data, scales = future.result()
                self._copy_in(spec, data, scales)
            except Exception as error:  # noqa: BLE001 - any failure of a load means recompute
                out.failed_recving[request_id] = f"{type(error).__name__}: {error}"
                self._poll(spec, KVPoll.Failed)
                continue
            out.finished_recving.add(request_id)
            if data is not None:
                self.num_loaded_blocks += data.shape[2]
                self.num_loaded_bytes += data.nbytes
            self._poll(spec, KVPoll.Success)
        self._landed.clear()
        return out

    def wait_for_any(self, timeout_s: float) -> None:
        if self._loads:
            self._landed.wait(timeout_s)

    def load_in_flight(self, request_id: int) -> bool:
        """Whether the load of ``request_id`` is still under way (its bytes, or its failure, not yet in)."""
        entry = self._loads.get(request_id)
        return entry is not None and not entry[1].done()

    def wait_for_load(self, request_id: int, timeout_s: float) -> None:
        """Block until the load of ``request_id`` (if any) has its bytes or failed, at most ``timeout_s``."""
        entry = self._loads.get(request_id)
        if entry is not None:
            futures_wait([entry[1]], timeout_s)

    def _read(self, spec: KVLoadSpec) -> tuple[torch.Tensor | None, list | None]:
        """Pull, in a background thread: the lent blocks ``[num_layers, 2, num_blocks, *block_shape]`` in a
        private buffer (None when no block is needed) and the lender's fp8 scales, and the lease released."""
        try:
            if spec.first_block >= min(len(spec.local_block_ids), len(spec.remote_block_ids)):
                return None, None
            return self._fetch(spec)
        finally:
            self._release_remote(spec)
            self._landed.set()

    def _fetch(self, spec: KVLoadSpec) -> tuple[torch.Tensor, list | None]:
        """The transport's part of a read: ask the side channel, then take the bytes (here: from the
        shared-memory segment it names) and the lender's fp8 scales."""
        reply = _post(spec.remote_host, spec.remote_port, "/kv_transfer/read", {
            "transfer_id": spec.transfer_id, "block_ids": list(spec.remote_block_ids), "prompt_hash": spec.prompt_hash}, self.timeout_s)
        return self._from_segment(reply, spec)

    def _from_segment(self, reply: dict, spec: KVLoadSpec) -> tuple[torch.Tensor, list | None]:
        shape, dtype = tuple(reply["shape"]), getattr(torch, str(reply["dtype"]).removeprefix("torch."))
        expected = (len(self.kv_caches), 2, len(spec.remote_block_ids), *self.block_shape)
        if shape != expected or dtype != self.kv_caches[0][0].dtype:
            raise ValueError(f"the prefill instance's blocks are {shape} {dtype}, this pool's {expected} {self.kv_caches[0][0].dtype}")
        return read_segment(str(reply["shm_name"]), shape, dtype), reply.get("kv_scales")

    def _receive(self, spec: KVLoadSpec) -> tuple[torch.Tensor, list | None]:
        """Push, in a background thread: create a segment for the reserved blocks, bootstrap the room on
        the prefill instance (its side channel's ``/kv_transfer/bootstrap``), wait until it wrote the KV
        (``/kv_transfer/poll``, at most ``kv_lease_duration``), and return a private copy of the segment
        ``[num_layers, 2, num_blocks, *block_shape]`` and the writer's fp8 scales. The segment is unlinked
        in any case (a late writer writes into memory nobody reads).

        Raises:
            RuntimeError: the prefill instance refused the reservation, or reported Failed (its reason).
            OSError: unreachable, or no answer in time.
        """
        k0 = self.kv_caches[0][0]
        shape = (len(self.kv_caches), 2, len(spec.local_block_ids), *self.block_shape)
        segment = shared_memory.SharedMemory(create=True, size=max(math.prod(shape) * k0.element_size(), 1),
                                             name=PUSH_SEGMENT_PREFIX + secrets.token_hex(12))
        try:
            _post(spec.remote_host, spec.remote_port, "/kv_transfer/bootstrap", {
                "bootstrap_room": spec.bootstrap_room, "transfer_id": spec.transfer_id, "prompt_hash": spec.prompt_hash,
                "block_ids": list(spec.local_block_ids), "shm_name": segment.name, "shape": list(shape),
                "dtype": str(k0.dtype).removeprefix("torch.")}, self.timeout_s)
            self._poll(spec, KVPoll.WaitingForInput)
            reply = _post(spec.remote_host, spec.remote_port, "/kv_transfer/poll",
                          {"bootstrap_room": spec.bootstrap_room, "transfer_id": spec.transfer_id}, self.push_timeout_s + self.timeout_s)
            if reply.get("state") != KVPoll.Success.value:
                raise RuntimeError(f"the prefill instance reported {reply.get('state')}: {reply.get('why')}")
            self._poll(spec, KVPoll.Transferring)
            data = torch.frombuffer(segment.buf, dtype=k0.dtype, count=math.prod(shape)).view(shape).clone()
            return data, reply.get("kv_scales")
        finally:
            segment.close()
            segment.unlink()
            self._landed.set()

    def _poll(self, spec: KVLoadSpec, state: KVPoll) -> None:
        """A push reservation's new state, logged (SGLang's ``KVPoll``); Success and Failed end it."""
        if spec.bootstrap_room is None or self.poll_states.get(spec.request_id) in (None, KVPoll.Success, KVPoll.Failed):
            return
        logger.info("request %d: KV push room %d %s", spec.request_id, spec.bootstrap_room, state.value)
        if state in (KVPoll.Success, KVPoll.Failed):
            self.poll_states.pop(spec.request_id, None)
            self.num_poll_ended[state.value] += 1
        else:
            self.poll_states[spec.request_id] = state

    def _release_remote(self, spec: KVLoadSpec) -> None:
        try:
            _post(spec.remote_host, spec.remote_port, "/kv_transfer/release",
                  {"transfer_id": spec.transfer_id, "prompt_hash": spec.prompt_hash}, self.timeout_s)
        except Exception as error:  # noqa: BLE001 - the lease then expires on its own
            logger.warning("request %d: could not release the prefill instance's lease (%s): it expires on its own", spec.request_id, error)

    def _copy_in(self, spec: KVLoadSpec, data: torch.Tensor | None, kv_scales: list | None) -> None:
        if data is None:
            return
        self._take_kv_scales(kv_scales)
        end = len(spec.local_block_ids) if spec.bootstrap_room is not None else min(len(spec.local_block_ids), len(spec.remote_block_ids))
        local = torch.tensor(spec.local_block_ids[spec.first_block : end], dtype=torch.int64)
        rows = data[:, :, spec.first_block : end]
        for layer, (k, v) in enumerate(self.kv_caches):
            k[local] = rows[layer, 0].to(k.device)
            v[local] = rows[layer, 1].to(v.device)

    def kv_scales(self) -> list[list[float]] | None:
        """Each layer's ``[k_scale, v_scale]`` of an fp8 pool (None: not fp8): fp8 pages mean
        nothing without them (``fp8 * k_scale`` is the key)."""
        if not self.kv_caches or self.kv_caches[0][0].element_size() != 1:
            return None
        return [[float(a.k_scale), float(a.v_scale)] for a in self.attention]

    def _take_kv_scales(self, kv_scales: list | None) -> None:
        """An fp8 pool takes the writer's scales with its pages: a layer whose scales are still to be
        computed (``calculate_kv_scales``) adopts them; one whose scales are set must have the same.

        Raises:
            ValueError: fp8 pages without scales, or scales other than this pool's (the request is
                recomputed; start both instances with the same scales: both without
                ``calculate_kv_scales``, or the decode instance serving handed-over requests only).
        """
        mine = self.kv_scales()
        if mine is None:
            return
        if not isinstance(kv_scales, list) or len(kv_scales) != len(mine):
            raise ValueError("fp8 KV pages came without their k_scale and v_scale")
        for attention, own, theirs in zip(self.attention, mine, kv_scales):
            if attention.calculate_kv_scales:
                attention.k_scale, attention.v_scale = float(theirs[0]), float(theirs[1])
                attention.calculate_kv_scales = False
            elif own != [float(x) for x in theirs]:
                raise ValueError(f"the prefill instance's fp8 scales (k_scale, v_scale) {theirs} are not this pool's {own}: its "
                                 "pages would read as other values here; give both instances the same scales (calculate_kv_scales "
                                 "off on both, or a decode instance that computes no prompt before its first handover)")

    # ---- producer ------------------------------------------------------------------------------

    def wait_for_save(self) -> None:
        """Push: after the forward pass that completed their prompts, write each request's blocks into
        its decode instance's segment and end its room (Success with the fp8 scales, or Failed)."""
        sends, self._sends = self._sends, []
        for send in sends:
            reservation = self.bootstrap.reservation(send.request_id)
            if reservation is None or not self.bootstrap.set_transferring(send.request_id):
                continue  # the room ended while the prompt ran: nothing to write
            started = time.perf_counter()
            try:
                num_bytes = self._write(send, reservation)
            except Exception as error:  # noqa: BLE001 - the decode instance recomputes
                logger.warning("request %d: could not write its KV into room %d (%s)", send.request_id, reservation.bootstrap_room, error)
                self.bootstrap.end(send.request_id, KVPoll.Failed, f"{type(error).__name__}: {error}")
                continue
            self.bootstrap.end(send.request_id, KVPoll.Success, detail={"kv_scales": self.kv_scales()})
            self.pushed.append(Pushed(send.request_id, reservation.bootstrap_room, send.block_ids, reservation.block_ids, num_bytes,
                                      (time.perf_counter() - started) * 1e3))

    def _write(self, send: KVSendSpec, reservation: Reservation) -> int:
        """Copy the request's blocks, every layer, into the reservation's segment; returns the bytes written.

        Raises:
            ValueError: the reservation is for another shape or dtype than this pool's blocks.
        """
        k0 = self.kv_caches[0][0]
        shape = (len(self.kv_caches), 2, len(send.block_ids), *self.block_shape)
        dtype = str(k0.dtype).removeprefix("torch.")
        if tuple(reservation.shape) != shape or reservation.dtype != dtype:
            raise ValueError(f"the decode instance reserved {tuple(reservation.shape)} {reservation.dtype}, this prompt's blocks are {shape} {dtype}")
        index = torch.tensor(send.block_ids, dtype=torch.int64)
        nbytes = math.prod(shape) * k0.element_size()
        fd = _posixshmem.shm_open("/" + reservation.shm_name, os.O_RDWR, mode=0o600)
        try:
            if os.fstat(fd).st_size < nbytes:
                raise ValueError("the decode instance's segment is smaller than the blocks")
            with mmap.mmap(fd, nbytes) as mapped:
                out = torch.frombuffer(mapped, dtype=k0.dtype, count=math.prod(shape)).view(shape)
                for layer, (k, v) in enumerate(self.kv_caches):
                    out[layer, 0] = k[index].cpu()
                    out[layer, 1] = v[index].cpu()
                del out
        finally:
            os.close(fd)
        return nbytes

    def claim(self, transfer_id, block_ids, prompt_hash_, peer: str = "unknown") -> Lease:
        """A decode instance asks to read lent blocks: only those of a live lease, named by its
        transfer id, for the same prompt (``LeaseTable.claim``; thread-safe: the side channel claims
        as the request arrives, not when the engine's thread is free).

        Raises:
            TransferRefused: the lease table refused the read (logged there).
        """
        if self.leases is None:
            raise TransferRefused("this engine lends no blocks (kv_role is kv_consumer)")
        return self.leases.claim(transfer_id, block_ids, prompt_hash_, peer)

    def serve_read(self, lease: Lease, transport: str = "shm") -> dict:
        """Copy a claimed lease's blocks, every layer, into a new shared-memory segment (whatever
        ``transport`` the reader asks for: a NIXL reader takes a segment too). Call it on the
        engine's thread (the pool's owner): there the lease is checked to be still held (not
        expired since its claim), so its blocks are still its own.

        Returns:
            ``{"shm_name", "shape": [num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim], "dtype"}``.

        Raises:
            TransferRefused: the lease ended between its claim and the copy.
        """
        if lease.transfer_id not in self.leases.live_ids():
            raise TransferRefused("the lease ended before its blocks could be copied")
        index = torch.tensor(lease.block_ids, dtype=torch.int64)
        k0 = self.kv_caches[0][0]
        shape = (len(self.kv_caches), 2, len(lease.block_ids), *self.block_shape)
        segment = shared_memory.SharedMemory(create=True, size=max(math.prod(shape) * k0.element_size(), 1),
                                             name=SEGMENT_PREFIX + secrets.token_hex(12))
        with self._lock:
            self._segments[lease.transfer_id] = segment
        out = torch.frombuffer(segment.buf, dtype=k0.dtype, count=math.prod(shape)).view(shape)
        for layer, (k, v) in enumerate(self.kv_caches):
            out[layer, 0] = k[index].cpu()
            out[layer, 1] = v[index].cpu()
        del out
        return {"shm_name": segment.name, "shape": list(shape), "dtype": str(k0.dtype).removeprefix("torch."), "kv_scales": self.kv_scales()}

    def release(self, transfer_id, prompt_hash_) -> bool:
        """The reader is done (or gives up): end the lease (``LeaseTable.release``: only for its own
        prompt) and unlink the segment it was read into; the scheduler frees the blocks at its next
        :meth:`~engine.core.scheduler.Scheduler.free_lent_blocks`."""
        if self.leases is None or not self.leases.release(transfer_id, prompt_hash_):
            return False
        with self._lock:
            segment = self._segments.pop(transfer_id, None)
        if segment is not None:
            segment.close()
            segment.unlink()
        return True

    def drop_segments(self, keep: set[str] = frozenset()) -> None:
        """Unlink the segments of leases that ended without a release (expired), all but ``keep``'s
        transfer ids; with no ``keep`` (an engine shutting down), every one. A reader that still maps
        one keeps its pages until it closes it (POSIX)."""
        with self._lock:
            ended = [tid for tid in self._segments if tid not in keep]
            segments = [self._segments.pop(tid) for tid in ended]
        for segment in segments:
            segment.close()
            segment.unlink()

    def shutdown(self) -> None:
        if self._threads is not None:
            self._threads.shutdown(wait=False, cancel_futures=True)
        self.drop_segments()


def _post(host: str, port: int, path: str, body: dict, timeout_s: float) -> dict:
    """POST JSON to a prefill instance's side channel; its JSON answer.

    Raises:
        RuntimeError: a refusal (its message); OSError: unreachable, timed out.
    """
    name = f"[{host}]" if ":" in host else host
    request = urllib.request.Request(f"http://{name}:{port}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as error:
        detail = error.read().decode(errors="replace")[:300]
        raise RuntimeError(f"the prefill instance refused {path} ({error.code}): {detail}") from None


def read_segment(name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A copy of the shared-memory segment ``name`` as a ``shape`` tensor of ``dtype``. The segment
    is the producer's to unlink: it is mapped here without ``SharedMemory``, whose resource tracker
    would otherwise claim it (Python < 3.13 tracks every segment a process attaches)."""
    fd = _posixshmem.shm_open("/" + name, os.O_RDONLY, mode=0o600)
    try:
        nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        with mmap.mmap(fd, nbytes, access=mmap.ACCESS_READ) as mapped:
            raw = numpy.frombuffer(mapped, dtype=numpy.uint8, count=nbytes).copy()
    finally:
        os.close(fd)
    return torch.from_numpy(raw).view(dtype).view(shape)


plug_lab_parts(globals())  # labs: a student's part in place of the engine's (engine/core/lab_impl.py)
