"""A KV connector over shared memory, in vLLM's pull order (NixlConnector's, with POSIX shared memory
for RDMA and the prefill instance's HTTP server as its side channel; no dependency beyond the
standard library and torch).

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
import urllib.error
import urllib.request
from concurrent.futures import Future, ThreadPoolExecutor
from multiprocessing import shared_memory

import numpy
import torch

from engine.config import KVTransferConfig
from engine.core.lab_impl import plug_lab_parts
from engine.core.sequence import SequenceGroup
from engine.kv_transfer.base import (KVConnectorMetadata, KVConnectorOutput, KVConnectorScheduler, KVConnectorWorker,
                                     KVLoadSpec)
from engine.kv_transfer.lease import Lease, LeaseTable, TransferRefused, prompt_hash

logger = logging.getLogger("engine.kv_transfer")

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
DEFAULT_TIMEOUT_S = 10.0
SEGMENT_PREFIX = "pal-kv-"  # /dev/shm/pal-kv-<random>: one segment per read, unlinked at release


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
        self.leases = LeaseTable(config.kv_lease_duration, *([clock] if clock else [])) if config.is_kv_producer else None
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
        would see it."""
        # BEGIN SOLUTION kv_connector
        params = request.kv_transfer_params
        first = (request.num_prompt_tokens - 1 - num_external_tokens) // self.block_size
        spec = KVLoadSpec(request.request_id, params["transfer_id"], params["remote_host"], int(params["remote_port"]),
                          tuple(params["remote_block_ids"]), tuple(block_ids), first,
                          prompt_hash(request.seqs[0].token_ids[: request.num_prompt_tokens]))
        request.kv_transfer_params = {"kv_load": "loading", "remote_engine_id": params.get("remote_engine_id")}
        self._to_recv.append(spec)
        self._pending[request.request_id] = spec
        # END SOLUTION

    def build_connector_meta(self, scheduler_output) -> KVConnectorMetadata:
        meta = KVConnectorMetadata(self._to_recv, self._to_discard)
        self._to_recv, self._to_discard = [], []
        return meta

    def request_load_failed(self, request: SequenceGroup, why: str) -> None:
        self._pending.pop(request.request_id, None)
        self.num_recomputed += 1
        logger.warning("request %d: its KV could not be read from the prefill instance (%s): it prefills its prompt "
                       "itself (kv_load_failure_policy=recompute)", request.request_id, why)
        request.kv_transfer_params = {"kv_load": "recomputed", "kv_load_error": why}

    def request_loaded(self, request: SequenceGroup) -> None:
        spec = self._pending.pop(request.request_id, None)
        self.num_loaded += 1
        if spec is not None and request.kv_transfer_params:
            num_blocks = max(len(spec.local_block_ids) - spec.first_block, 0)
            request.kv_transfer_params = {**request.kv_transfer_params, "kv_load": "loaded", "num_loaded_blocks": num_blocks}

    def request_aborted_while_loading(self, request_id: int) -> None:
        if self._pending.pop(request_id, None) is not None:
            self._to_discard.append(request_id)

    def _check_params(self, request: SequenceGroup) -> str | None:
        """Why a consumer's ``kv_transfer_params`` cannot be served, or None. Untrusted input."""
        if not request.is_single:
            return "only one-sequence requests (n=1, no beam search) are handed over"
        p = request.kv_transfer_params
        tid, host, port, blocks = p.get("transfer_id"), p.get("remote_host"), p.get("remote_port"), p.get("remote_block_ids")
        if not isinstance(tid, str) or not 16 <= len(tid) <= 128:
            return "transfer_id must be the string the prefill instance returned"
        if host not in self.allowed_remote_hosts:
            return f"remote_host {host!r} is not one this engine reads from (allowed_remote_hosts)"
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            return "remote_port must be a TCP port"
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
        return self.leases.take_freeable() if self.leases is not None else []


class SharedMemoryConnectorWorker(KVConnectorWorker):
    """The worker side: reads lent blocks in (consumer), serves them out (producer).

    Args:
        config: the engine's :class:`~engine.config.KVTransferConfig`.
        kv_caches: the engine's pool, one ``(K, V)`` pair per layer, each
            ``[num_blocks, block_size, num_kv_heads, head_dim]`` of the cache dtype.
        leases: the scheduler side's lease table (a producer), or None.
    """

    kv_connector = "SharedMemoryConnector"  # the transport, as kv_transfer_config names it

    def __init__(self, config: KVTransferConfig, kv_caches: list[tuple[torch.Tensor, torch.Tensor]], leases: LeaseTable | None):
        self.kv_caches = kv_caches
        self.leases = leases
        self.timeout_s = float(config.kv_connector_extra_config.get("timeout_s", DEFAULT_TIMEOUT_S))
        self._threads = ThreadPoolExecutor(max_workers=2, thread_name_prefix="kv-load") if config.is_kv_consumer else None
        self._loads: dict[int, tuple[KVLoadSpec, Future]] = {}
        self._landed = threading.Event()
        self._segments: dict[str, shared_memory.SharedMemory] = {}  # producer: transfer id -> the segment it was read into
        self._lock = threading.Lock()
        self.num_loaded_blocks = 0  # consumer: blocks read from prefill instances (every layer's K and V)
        self.num_loaded_bytes = 0  # ... and their bytes (vLLM's NixlConnector: vllm:nixl_bytes_transferred)

    @property
    def block_shape(self) -> tuple[int, ...]:
        """One layer's K (or V) of one block: ``(block_size, num_kv_heads, head_dim)``."""
        return tuple(self.kv_caches[0][0].shape[1:])

    # ---- consumer ------------------------------------------------------------------------------

    def start_load_kv(self, metadata: KVConnectorMetadata | None) -> None:
        if metadata is None:
            return
        for request_id in metadata.reqs_to_discard:
            self._loads.pop(request_id, None)  # the read still ends, and releases the lease
        for spec in metadata.reqs_to_recv:
            self._loads[spec.request_id] = (spec, self._threads.submit(self._read, spec))

    def get_finished(self) -> KVConnectorOutput:
        """Loads whose bytes arrived: copied into the request's blocks here, on the engine's thread
        (the request still owns them: an aborted one was discarded first)."""
        out = KVConnectorOutput()
        for request_id, (spec, future) in list(self._loads.items()):
            if not future.done():
                continue
            del self._loads[request_id]
            try:
                data = future.result()
                self._copy_in(spec, data)
            except Exception as error:  # noqa: BLE001 - any failure of a load means recompute
                out.failed_recving[request_id] = f"{type(error).__name__}: {error}"
                continue
            out.finished_recving.add(request_id)
            if data is not None:
                self.num_loaded_blocks += data.shape[2]
                self.num_loaded_bytes += data.nbytes
        self._landed.clear()
        return out

    def wait_for_any(self, timeout_s: float) -> None:
        if self._loads:
            self._landed.wait(timeout_s)

    def _read(self, spec: KVLoadSpec) -> torch.Tensor | None:
        """In a background thread: the lent blocks ``[num_layers, 2, num_blocks, *block_shape]`` in a
        private buffer (None when no block is needed), and the lease released."""
        try:
            if spec.first_block >= min(len(spec.local_block_ids), len(spec.remote_block_ids)):
                return None
            return self._fetch(spec)
        finally:
            self._release_remote(spec)
            self._landed.set()

    def _fetch(self, spec: KVLoadSpec) -> torch.Tensor:
        """The transport's part of a read: ask the side channel, then take the bytes (here: from the
        shared-memory segment it names)."""
        reply = _post(spec.remote_host, spec.remote_port, "/kv_transfer/read", {
            "transfer_id": spec.transfer_id, "block_ids": list(spec.remote_block_ids), "prompt_hash": spec.prompt_hash}, self.timeout_s)
        return self._from_segment(reply, spec)

    def _from_segment(self, reply: dict, spec: KVLoadSpec) -> torch.Tensor:
        shape, dtype = tuple(reply["shape"]), getattr(torch, str(reply["dtype"]).removeprefix("torch."))
        expected = (len(self.kv_caches), 2, len(spec.remote_block_ids), *self.block_shape)
        if shape != expected or dtype != self.kv_caches[0][0].dtype:
            raise ValueError(f"the prefill instance's blocks are {shape} {dtype}, this pool's {expected} {self.kv_caches[0][0].dtype}")
        return read_segment(str(reply["shm_name"]), shape, dtype)

    def _release_remote(self, spec: KVLoadSpec) -> None:
        try:
            _post(spec.remote_host, spec.remote_port, "/kv_transfer/release",
                  {"transfer_id": spec.transfer_id, "prompt_hash": spec.prompt_hash}, self.timeout_s)
        except Exception as error:  # noqa: BLE001 - the lease then expires on its own
            logger.warning("request %d: could not release the prefill instance's lease (%s): it expires on its own", spec.request_id, error)

    def _copy_in(self, spec: KVLoadSpec, data: torch.Tensor | None) -> None:
        if data is None:
            return
        end = min(len(spec.local_block_ids), len(spec.remote_block_ids))
        local = torch.tensor(spec.local_block_ids[spec.first_block : end], dtype=torch.int64)
        rows = data[:, :, spec.first_block : end]
        for layer, (k, v) in enumerate(self.kv_caches):
            k[local] = rows[layer, 0].to(k.device)
            v[local] = rows[layer, 1].to(v.device)

    # ---- producer ------------------------------------------------------------------------------

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
        return {"shm_name": segment.name, "shape": list(shape), "dtype": str(k0.dtype).removeprefix("torch.")}

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
