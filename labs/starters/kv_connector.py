"""Lab kv_connector: The KV connector's scheduler side: prefill hands over to decode / KV 连接器的调度器侧：预填充交接给解码.

vLLM v1's KV connector between a prefill and a decode instance, its scheduler side: how many prompt
tokens the prefill instance supplies (all but the last, less the local prefix hit, loaded
asynchronously), the load recorded once the decode blocks are allocated (which remote blocks land in
which local ones, from which block on), and on the prefill side a finished request's blocks kept
under a lease and the kv_transfer_params that name them. serve-disagg runs your part in both of its
engines.

vLLM v1 在预填充实例与解码实例之间的 KV 连接器，它的调度器侧：预填充实例提供多少个提示词 token（除最后一个之外的全部，减去本地前缀缓存的命中，异步载入）；解码实例分配好块之后记下这次载入（哪些远端块落到哪些本地块，从第几个块开始）；以及在预填充一侧，把已完成请求的块在租约下保留，并给出指明这些块的 kv_transfer_params。你的代码在 serve-disagg 的两个引擎里运行。

Your part plugs into the engine in place of its own, in engine/kv_transfer/shared_memory_connector.py (the engine module's names are in
scope here). Grade it in your copy of the starters (labs/README.md), where the labs build on
each other:

    python -m lessons grade kv_connector --impl labs/mine

Cut by `python -m lessons labs build` from engine/kv_transfer/shared_memory_connector.py; work on a copy.

The module engine/kv_transfer/shared_memory_connector.py, for context:

A KV connector over shared memory, in vLLM's pull order (NixlConnector's, with POSIX shared memory
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
from engine.core.sequence import SequenceGroup
from engine.kv_transfer.base import (KVConnectorMetadata, KVConnectorOutput, KVConnectorScheduler, KVConnectorWorker,
                                     KVLoadSpec, KVSendSpec)
from engine.kv_transfer.bootstrap import BootstrapTable, KVPoll, Reservation
from engine.kv_transfer.lease import TRANSFER_ID_BYTES, Lease, LeaseTable, TransferRefused, prompt_hash

LAB = "kv_connector"  # the lab whose parts this file holds


class SharedMemoryConnectorScheduler:
    """The scheduler side: which prompts come from elsewhere, and which blocks are lent.

    Args:
        config: the engine's :class:`~engine.config.KVTransferConfig`.
        block_size: tokens per block (the same on both instances, checked at the read).
        clock: the lease table's clock (tests pass their own).
    """

    # Given (the engine's own, not swapped): the attributes and special methods the parts below use.
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
        # TODO(kv_connector): write this part (see the docstring and labs/README.md)
        raise NotImplementedError("lab kv_connector: SharedMemoryConnectorScheduler.get_num_new_matched_tokens")

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
        # TODO(kv_connector): write this part (see the docstring and labs/README.md)
        raise NotImplementedError("lab kv_connector: SharedMemoryConnectorScheduler.update_state_after_alloc")

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
        # TODO(kv_connector): write this part (see the docstring and labs/README.md)
        raise NotImplementedError("lab kv_connector: SharedMemoryConnectorScheduler.request_finished")
