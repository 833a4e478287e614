"""A KV connector over NIXL (vLLM's ``NixlConnector`` with ``kv_buffer_device: "cpu"``): the decode
instance reads the lent blocks straight out of the prefill instance's KV pool with a NIXL READ
(UCX: shared memory on one machine, RDMA between machines), instead of the prefill instance copying
them into a shared-memory segment. The optional extra ``pip install -e '.[disagg]'`` installs NIXL.

Only the worker side differs from ``shared_memory_connector.py``; the scheduler side, the leases and
the side channel are the same:

1. each instance registers its whole pool, every layer's K and V tensor, with its NIXL agent as
   ``DRAM`` (vLLM registers its KV cache the same way, once, at start);
2. the decode instance's ``POST /kv_transfer/read`` names ``"transport": "nixl"``: the prefill
   instance claims the lease as before and answers its agent's metadata and each layer's K and V
   addresses instead of a segment;
3. the decode instance adds that agent (once per prefill instance), READs every layer's K and V of
   the lent blocks into a registered buffer of its own, waits for the transfer, and releases the
   lease (``POST /kv_transfer/release``; vLLM's decode notifies its producer through NIXL instead).
   The buffer is copied into the request's blocks on the engine's thread, as the shared-memory
   transport does, so a request aborted while loading never has bytes land in blocks it gave back.

A prefill instance without NIXL answers a segment as before, and a NIXL reader takes it: the two
transports read each other. Where NIXL is not installed or its agent does not start,
:func:`make_worker` says so in one line and the shared-memory transport carries the KV.
"""

from __future__ import annotations

import base64
import logging
import secrets
import threading
import time

import torch

from engine.config import KVTransferConfig
from engine.kv_transfer.base import KVLoadSpec
from engine.kv_transfer.lease import Lease, LeaseTable, TransferRefused
from engine.kv_transfer.shared_memory_connector import SharedMemoryConnectorWorker, _post

logger = logging.getLogger("engine.kv_transfer")

NIXL_BACKENDS = ["UCX"]
POLL_S = 0.0005


class NixlConnectorWorker(SharedMemoryConnectorWorker):
    """The worker side over NIXL: the pool registered as DRAM, loads read with NIXL READ.

    Args: as :class:`~engine.kv_transfer.shared_memory_connector.SharedMemoryConnectorWorker`.

    Raises:
        ImportError: NIXL is not installed (``pip install -e '.[disagg]'``).
        RuntimeError: the pool is not contiguous (NIXL's own errors when its agent or UCX backend
            does not start).
    """

    kv_connector = "NixlConnector"

    def __init__(self, config: KVTransferConfig, kv_caches: list[tuple[torch.Tensor, torch.Tensor]], leases: LeaseTable | None,
                 bootstrap=None, attention: list | None = None):
        from nixl._api import nixl_agent, nixl_agent_config

        if not all(t.is_contiguous() and t.device.type == "cpu" for pair in kv_caches for t in pair):
            raise RuntimeError("NIXL reads whole blocks of a contiguous CPU pool")
        self.agent_name = f"{config.engine_id or 'engine'}-{secrets.token_hex(6)}"
        self.agent = nixl_agent(self.agent_name, nixl_agent_config(backends=NIXL_BACKENDS))
        super().__init__(config, kv_caches, leases, bootstrap, attention)
        self._pool = self.agent.register_memory([t for pair in kv_caches for t in pair])
        self._remote_agents: dict[bytes, str] = {}  # an agent's metadata -> its name, once added
        self._agents_lock = threading.Lock()

    @property
    def block_bytes(self) -> int:
        """One layer's K (or V) of one block, in bytes."""
        k = self.kv_caches[0][0]
        return k[0].numel() * k.element_size()

    # ---- producer ------------------------------------------------------------------------------

    def serve_read(self, lease: Lease, transport: str = "shm") -> dict:
        """``transport="nixl"``: where the lease's blocks are, for the reader's NIXL READ (nothing is
        copied): ``{"nixl_agent_metadata" (base64), "kv_addrs": [[K address, V address] per layer],
        "block_bytes", "block_ids", "dtype"}``; else the shared-memory segment.

        Raises:
            TransferRefused: the lease ended between its claim and now.
        """
        if transport != "nixl":
            return super().serve_read(lease)
        if lease.transfer_id not in self.leases.live_ids():
            raise TransferRefused("the lease ended before its blocks could be read")
        return {"nixl_agent_metadata": base64.b64encode(self.agent.get_agent_metadata()).decode(),
                "kv_addrs": [[k.data_ptr(), v.data_ptr()] for k, v in self.kv_caches], "block_bytes": self.block_bytes,
                "block_ids": list(lease.block_ids), "dtype": str(self.kv_caches[0][0].dtype).removeprefix("torch."),
                "kv_scales": self.kv_scales()}

    # ---- consumer ------------------------------------------------------------------------------

    def _fetch(self, spec: KVLoadSpec) -> tuple[torch.Tensor, list | None]:
        """Ask for the lent blocks' addresses and READ them (or take the segment a prefill instance
        without NIXL answers); with the lender's fp8 scales."""
        reply = _post(spec.remote_host, spec.remote_port, "/kv_transfer/read", {
            "transfer_id": spec.transfer_id, "block_ids": list(spec.remote_block_ids), "prompt_hash": spec.prompt_hash,
            "transport": "nixl"}, self.timeout_s)
        if "shm_name" in reply:
            return self._from_segment(reply, spec)
        if reply["block_bytes"] != self.block_bytes or reply["dtype"] != str(self.kv_caches[0][0].dtype).removeprefix("torch.") \
                or len(reply["kv_addrs"]) != len(self.kv_caches) or reply["block_ids"] != list(spec.remote_block_ids):
            raise ValueError("the prefill instance's blocks are not this pool's shape")
        return self._nixl_read(reply, (len(self.kv_caches), 2, len(spec.remote_block_ids), *self.block_shape)), reply.get("kv_scales")

    def _nixl_read(self, reply: dict, shape: tuple[int, ...]) -> torch.Tensor:
        """Every layer's K and V of the lent blocks, READ into a new buffer registered for it."""
        remote = self._remote_agent(base64.b64decode(reply["nixl_agent_metadata"]))
        size = self.block_bytes
        remote_descs = [(addr + block * size, size, 0) for pair in reply["kv_addrs"] for addr in pair for block in reply["block_ids"]]
        buffer = torch.empty(shape, dtype=self.kv_caches[0][0].dtype)  # [layer, K/V, block]: the order of remote_descs
        base = buffer.data_ptr()
        local_descs = [(base + i * size, size, 0) for i in range(len(remote_descs))]
        registered = self.agent.register_memory([buffer])
        try:
            handle = self.agent.initialize_xfer("READ", self.agent.get_xfer_descs(local_descs, "DRAM"),
                                                self.agent.get_xfer_descs(remote_descs, "DRAM"), remote)
            try:
                state = self.agent.transfer(handle)
                while state == "PROC":
                    time.sleep(POLL_S)
                    state = self.agent.check_xfer_state(handle)
                if state != "DONE":
                    raise RuntimeError(f"the NIXL READ ended in state {state}")
            finally:
                self.agent.release_xfer_handle(handle)
        finally:
            self.agent.deregister_memory(registered)
        return buffer

    def _remote_agent(self, metadata: bytes) -> str:
        with self._agents_lock:
            if metadata not in self._remote_agents:
                self._remote_agents[metadata] = self.agent.add_remote_agent(metadata)
            return self._remote_agents[metadata]

    def shutdown(self) -> None:
        super().shutdown()
        try:
            self.agent.deregister_memory(self._pool)
        except Exception:  # noqa: BLE001 - an agent shutting down with its process
            pass


def make_worker(config: KVTransferConfig, kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
                leases: LeaseTable | None, bootstrap=None, attention: list | None = None) -> SharedMemoryConnectorWorker:
    """The worker side ``config.kv_connector`` names: NIXL where it starts, else (one warning line)
    the shared-memory transport, which every instance can read from."""
    if config.kv_connector == "NixlConnector":
        try:
            return NixlConnectorWorker(config, kv_caches, leases, bootstrap, attention)
        except Exception as error:  # noqa: BLE001 - not installed, or NIXL's own errors while starting: all fall back
            logger.warning("kv_connector NixlConnector: NIXL cannot start here (%s: %s; pip install -e '.[disagg]'): "
                           "the shared-memory transport carries the KV", type(error).__name__, error)
    return SharedMemoryConnectorWorker(config, kv_caches, leases, bootstrap, attention)
