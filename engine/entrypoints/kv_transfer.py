"""A prefill instance's side channel: where a decode instance reads the KV blocks lent to it
(``engine/kv_transfer/shared_memory_connector.py``; vLLM's NixlConnector has a ZMQ side channel for
the same handshake).

``POST /kv_transfer/read`` ``{"transfer_id", "block_ids", "prompt_hash"}``: the blocks of one live
lease, copied into a shared-memory segment (with ``"transport": "nixl"``, on an instance whose
connector is NIXL's: where they are, for the reader's NIXL READ); 403 when the lease table refuses
(an unknown or ended transfer id, other blocks, another prompt, a second read; logged). ``POST /kv_transfer/release``
``{"transfer_id", "prompt_hash"}``: the reader is done; the segment is unlinked and the blocks freed at once.
``GET /kv_transfer/status``: the pool and the connector's counters (either role). In the push order
(``kv_handover="push"``) a prefill instance answers ``POST /kv_transfer/bootstrap`` (a decode
instance's reservation for a room: ``engine/kv_transfer/bootstrap.py``) and ``POST /kv_transfer/poll``
(waits until the room's KV is written: ``{"state": "Success", "kv_scales"}`` or ``{"state": "Failed", "why"}``). Every call into the
engine runs on its thread, between steps; a task frees expired leases every second while idle.

The routes need no API key: a read is only as good as its transfer id, 192 random bits that only the
client of the prefill request ever saw (through the proxy: only the proxy).
"""

from __future__ import annotations

import asyncio
import contextlib

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import JSONResponse

from engine.entrypoints.async_llm import AsyncLLM
from engine.entrypoints.openai.protocol import APIError, read_json_body
from engine.kv_transfer.bootstrap import Reservation
from engine.kv_transfer.lease import TransferRefused

LEASE_SWEEP_S = 1.0  # how often an idle prefill instance frees expired leases


def add_kv_transfer_routes(app: FastAPI, llm: AsyncLLM, max_body_bytes: int) -> None:
    """The side-channel routes, on an engine with a KV connector (``kv_transfer_config``)."""
    engine = llm.engine
    producer = engine.config.kv_transfer_config.is_kv_producer

    @app.get("/kv_transfer/status")
    async def status() -> JSONResponse:
        return JSONResponse(await llm.run_on_engine(engine.kv_transfer_status))

    if not producer:
        return
    if engine.config.kv_transfer_config.kv_handover == "push":
        _add_push_routes(app, llm, max_body_bytes)
        return

    @app.post("/kv_transfer/read")
    async def read(raw: Request) -> JSONResponse:
        body = await read_json_body(raw, max_body_bytes)
        if not isinstance(body, dict):
            raise APIError(400, "the body must be an object")
        peer = raw.client.host if raw.client else "unknown"
        try:  # claimed now, copied when the engine's thread is free
            lease = engine.kv_connector_worker.claim(body.get("transfer_id"), body.get("block_ids"), body.get("prompt_hash"), peer)
            transport = body.get("transport") if body.get("transport") in ("shm", "nixl") else "shm"
            reply = await llm.run_on_engine(engine.serve_kv_read, lease, transport)
        except TransferRefused as error:
            raise APIError(403, f"KV read refused: {error}") from None
        return JSONResponse(reply)

    @app.post("/kv_transfer/release")
    async def release(raw: Request) -> JSONResponse:
        body = await read_json_body(raw, max_body_bytes)
        if not isinstance(body, dict):
            raise APIError(400, "the body must be an object")
        released = await llm.run_on_engine(engine.release_kv_transfer, body.get("transfer_id"), body.get("prompt_hash"))
        return JSONResponse({"released": released})


def _add_push_routes(app: FastAPI, llm: AsyncLLM, max_body_bytes: int) -> None:
    """The push order's side channel (SGLang's bootstrap server): a decode instance's reservation,
    then its poll until the KV is written."""
    table = llm.engine.kv_connector.bootstrap

    @app.post("/kv_transfer/bootstrap")
    async def bootstrap(raw: Request) -> JSONResponse:
        body = await read_json_body(raw, max_body_bytes)
        if not isinstance(body, dict):
            raise APIError(400, "the body must be an object")
        try:
            reservation = Reservation(str(body.get("transfer_id")), body.get("bootstrap_room"), str(body.get("prompt_hash")),
                                      tuple(body.get("block_ids") or ()), body.get("shm_name"), tuple(body.get("shape") or ()),
                                      str(body.get("dtype")))
            state = table.bootstrap(reservation, raw.client.host if raw.client else "unknown")
        except (TransferRefused, TypeError) as error:
            raise APIError(403, f"KV reservation refused: {error}") from None
        return JSONResponse({"state": state.value})

    @app.post("/kv_transfer/poll")
    async def poll(raw: Request) -> JSONResponse:
        body = await read_json_body(raw, max_body_bytes)
        if not isinstance(body, dict):
            raise APIError(400, "the body must be an object")
        try:
            done = table.wait(body.get("bootstrap_room"), body.get("transfer_id"))
        except TransferRefused as error:
            raise APIError(403, f"KV poll refused: {error}") from None
        try:  # the room fails on its own at its deadline (the sweeper); this bound only guards a lost one
            return JSONResponse(await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(done)), table.timeout_s + 2 * LEASE_SWEEP_S))
        except (asyncio.TimeoutError, asyncio.CancelledError):
            table.give_up(body.get("bootstrap_room"), body.get("transfer_id"), "the decode instance stopped waiting")
            raise


@contextlib.asynccontextmanager
async def lease_sweeper(llm: AsyncLLM):
    """While the server runs: free expired leases every :data:`LEASE_SWEEP_S` (a busy engine frees
    them at each step too)."""
    async def sweep() -> None:
        while True:
            await asyncio.sleep(LEASE_SWEEP_S)
            await llm.run_on_engine(llm.engine.free_lent_blocks)

    task = asyncio.create_task(sweep(), name="kv-lease-sweeper")
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
