"""``python -m engine serve-disagg``: prefill and decode on two engine processes, behind one
OpenAI-compatible proxy (vLLM's ``disagg_proxy`` / ``toy_proxy_server.py``; DistServe, Splitwise).

The command starts a prefill instance (``serve`` with ``kv_role=kv_producer``) and a decode instance
(``kv_consumer``) on private loopback ports, waits until both answer, and serves the proxy on ``--port``
as ``serve`` does. Each completion is two calls, as vLLM's proxy makes them:

1. to the prefill instance, the request with ``max_tokens=1``, no stream, and
   ``kv_transfer_params={"do_remote_decode": true}``: it computes the prompt's KV, lends the blocks
   under a lease and answers where they are (``kv_transfer_params``);
2. to the decode instance, the client's request with those parameters: it reads the blocks
   (``engine/kv_transfer/shared_memory_connector.py``), computes the last prompt token, and generates;
   its answer (a stream or not) goes back to the client as it comes.

With ``--kv-handover push`` (SGLang's order) the proxy makes both calls at once, with one random
``bootstrap_room``: the decode instance reserves the prompt's blocks and tells the prefill instance
where (its side channel's ``/kv_transfer/bootstrap``); the prefill instance, which waited for that,
prefills and writes the KV into them; the decode instance then generates
(``engine/kv_transfer/bootstrap.py``). A prefill instance that is down refuses the reservation at
once and the decode instance computes the prompt itself (its answer's ``kv_transfer_params`` say
so; there is no ``x-disagg`` header, the proxy not having waited for the prefill call).

A client's own ``kv_transfer_params`` are dropped: only the proxy makes them. A prefill instance that
is down or fails (5xx, a transport error) is bypassed: the decode instance computes the prompt itself,
and the answer carries the header ``x-disagg: prefill-unavailable``. Requests with ``n > 1`` go to the
decode instance alone (a handover is one sequence's). Stopping the command stops both instances.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import time

import httpx
import uvicorn
from fastapi import FastAPI
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.background import BackgroundTask
from starlette.responses import JSONResponse, Response, StreamingResponse

from engine.config import KV_CONNECTORS, KV_HANDOVERS
from engine.entrypoints.openai.api_server import LOOPBACK_HOST_HEADERS, LOOPBACK_HOSTS, bind_warning, server_config
from engine.entrypoints.openai.cli_args import add_engine_args
from engine.entrypoints.openai.protocol import APIError, read_json_body
from engine.kv_transfer.shared_memory_connector import MAX_BOOTSTRAP_ROOM

logger = logging.getLogger("engine.serve")

FORWARDED_HEADERS = ("authorization",)  # what the proxy passes on to both instances
DISAGG_HEADER = "x-disagg"  # "prefill-unavailable" when the decode instance computed the prompt itself


def register_cli(sub) -> None:
    """Add ``serve-disagg`` to ``python -m engine``'s sub-commands."""
    p = sub.add_parser("serve-disagg", help="prefill and decode on two engine processes behind one OpenAI-compatible proxy")
    p.add_argument("model_tag", nargs="?", default=None, help="the model (as --model)")
    add_engine_args(p)
    g = p.add_argument_group("disaggregation")
    g.add_argument("--host", default="127.0.0.1", help="address the proxy binds (default: 127.0.0.1, this machine only)")
    g.add_argument("--port", type=int, default=8000, help="the proxy's port, where clients connect (default: 8000)")
    g.add_argument("--prefill-port", type=int, default=0, help="the prefill instance's port on 127.0.0.1 (default: 0, a free one)")
    g.add_argument("--decode-port", type=int, default=0, help="the decode instance's port on 127.0.0.1 (default: 0, a free one)")
    g.add_argument("--kv-handover", "--handover", dest="kv_handover", choices=KV_HANDOVERS, default="pull",
                   help="pull (default, vLLM's order): the prefill instance holds its blocks under a lease and the decode instance "
                        "reads them; push (SGLang's): the decode instance reserves blocks first and the prefill instance writes into them")
    g.add_argument("--kv-connector", choices=KV_CONNECTORS, default="SharedMemoryConnector",
                   help="both instances' transport: SharedMemoryConnector (default) or NixlConnector (NIXL READ; pip install -e '.[disagg]'; "
                        "the push order writes through shared memory)")
    g.add_argument("--split-cores", action="store_true",
                   help="give each instance its own half of this process's CPU cores (its OpenMP threads too), as two GPUs "
                        "would be: a prefill never takes a core from the decode instance's steps (Linux)")
    g.add_argument("--kv-lease-duration", type=float, default=30.0,
                   help="seconds the prefill instance holds a request's blocks for the decode instance (pull), or a prefill request "
                        "and a reservation wait for each other (push) (default: 30)")
    g.add_argument("--startup-timeout", type=float, default=300.0, help="seconds both instances get to start")
    g.add_argument("--request-timeout", type=float, default=600.0, help="seconds the proxy waits for an instance's answer")
    p.set_defaults(func=lambda args: serve_disagg(args, p))


def instance_argv(parser_args: argparse.Namespace, parser: argparse.ArgumentParser) -> list[str]:
    """The engine flags the user gave serve-disagg, as a ``serve`` command line for each instance
    (only those that differ from their defaults)."""
    group = next(g for g in parser._action_groups if g.title == "engine (vLLM's names)")
    argv = []
    for action in group._group_actions:
        value = getattr(parser_args, action.dest)
        if value == action.default or action.dest == "kv_transfer_config":
            continue
        flag = action.option_strings[0]
        if isinstance(action, argparse.BooleanOptionalAction):
            argv.append(flag if value else "--no-" + flag.removeprefix("--"))
        elif isinstance(action, argparse._StoreTrueAction):
            argv.append(flag)
        else:
            argv += [flag, str(value)]
    if parser_args.model_tag and not parser_args.model:
        argv += ["--model", parser_args.model_tag]
    return argv


def create_proxy_app(prefill_url: str, decode_url: str, host: str = "127.0.0.1", timeout_s: float = 600.0,
                     max_request_body_bytes: int = 1 << 20, kv_handover: str = "pull") -> FastAPI:
    """The proxy: ``POST /v1/completions`` and ``/v1/chat/completions`` as two calls (module docstring),
    one after the other (``kv_handover="pull"``) or both at once with one bootstrap room ("push");
    ``GET /v1/models`` and ``/health`` from the decode instance; ``GET /kv_transfer/status`` both
    instances' pools and connector counters, side by side; ``GET /kv_transfer/trace`` both instances'
    steps as one Perfetto trace (open it at ui.perfetto.dev)."""
    client = httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=5.0))
    prefill_calls: set[asyncio.Task] = set()  # push: the prefill calls still running beside their decode call

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        await client.aclose()

    app = FastAPI(title="PagedAttention Lab disaggregated prefill/decode proxy", lifespan=lifespan)
    if host in LOOPBACK_HOSTS:
        app.add_middleware(TrustedHostMiddleware, allowed_hosts=list(LOOPBACK_HOST_HEADERS), www_redirect=False)
    app.state.prefill_url, app.state.decode_url = prefill_url, decode_url

    @app.exception_handler(APIError)
    async def api_error(raw: Request, error: APIError):
        return JSONResponse(error.body(), error.status_code, headers=error.headers)

    @app.get("/health")
    async def health() -> Response:
        try:
            return Response(status_code=(await client.get(f"{decode_url}/health")).status_code)
        except httpx.TransportError:
            return Response(status_code=503)

    @app.get("/v1/models")
    async def models(raw: Request) -> Response:
        answer = await client.get(f"{decode_url}/v1/models", headers=_forwarded(raw))
        return Response(answer.content, answer.status_code, media_type="application/json")

    @app.get("/kv_transfer/status")
    async def status() -> JSONResponse:
        both = {}
        for name, url in (("prefill", prefill_url), ("decode", decode_url)):
            try:
                both[name] = (await client.get(f"{url}/kv_transfer/status")).json()
            except httpx.TransportError as error:
                both[name] = {"error": f"{type(error).__name__}: {error}"}
        return JSONResponse(both)

    @app.get("/kv_transfer/trace")
    async def trace(raw: Request) -> Response:
        """Both instances' recent steps as one Perfetto / Chrome trace: a process track per instance on
        the wall clock, each handover a ``kv_transfer`` slice on both (``engine.timeline.disagg_chrome_trace``,
        from each instance's ``GET /lab/session``)."""
        from engine.runfile import RunFileError, load_run
        from engine.timeline import disagg_chrome_trace

        instances = []
        for name, url in (("prefill", prefill_url), ("decode", decode_url)):
            try:
                answer = await client.get(f"{url}/lab/session", headers=_forwarded(raw))
            except httpx.TransportError as error:
                raise APIError(503, f"the {name} instance is unavailable: {type(error).__name__}") from None
            if answer.status_code == 409:  # it has not stepped yet: an empty track
                steps = []
            elif answer.status_code != 200:
                return Response(answer.content, answer.status_code, media_type="application/json")
            else:
                try:
                    steps = load_run(answer.content, f"the {name} instance's steps").steps
                except RunFileError as error:
                    raise APIError(502, str(error)) from None
            instances.append((f"{name} instance ({url})", steps))
        body = json.dumps(disagg_chrome_trace(instances), allow_nan=False)
        return Response(body, media_type="application/json",
                        headers={"Content-Disposition": 'attachment; filename="disagg_trace.json"'})

    @app.post("/v1/completions")
    async def completions(raw: Request):
        return await handover(raw, "/v1/completions")

    @app.post("/v1/chat/completions")
    async def chat_completions(raw: Request):
        return await handover(raw, "/v1/chat/completions")

    async def handover(raw: Request, path: str):
        body = await read_json_body(raw, max_request_body_bytes)
        if not isinstance(body, dict):
            raise APIError(400, "the request body must be a JSON object")
        body.pop("kv_transfer_params", None)  # a client's are never passed on: only the proxy makes them
        headers = _forwarded(raw)
        params, fallback = None, False
        if body.get("n") in (None, 1) and kv_handover == "push":
            params = _start_push(client, prefill_url, path, body, headers, prefill_calls)
        elif body.get("n") in (None, 1):
            answer, fallback = await _prefill(client, f"{prefill_url}{path}", body, headers)
            if answer is not None and answer.status_code != 200:
                return Response(answer.content, answer.status_code, media_type="application/json")  # the client's mistake
            params = answer.json().get("kv_transfer_params") if answer is not None else None
        extra = {DISAGG_HEADER: "prefill-unavailable"} if fallback else {}
        decode_body = {**body, "kv_transfer_params": params} if params else body
        try:
            upstream = await client.send(client.build_request("POST", f"{decode_url}{path}", json=decode_body, headers=headers), stream=True)
        except httpx.TransportError as error:  # the prefill instance's lease, if any, ends on its own
            raise APIError(503, f"the decode instance is unavailable: {type(error).__name__}") from None
        if body.get("stream") and upstream.status_code == 200:
            # the background task closes the decode instance's stream even when the client left before it began
            return StreamingResponse(_relay(upstream), media_type=upstream.headers.get("content-type"), headers=extra,
                                     background=BackgroundTask(upstream.aclose))
        try:
            content = await upstream.aread()
        finally:
            await upstream.aclose()
        return Response(content, upstream.status_code, media_type="application/json", headers=extra)

    return app


def _start_push(client: httpx.AsyncClient, prefill_url: str, path: str, body: dict, headers: dict, calls: set) -> dict:
    """Push: the prefill call starts now, in the background, with a new bootstrap room (SGLang's mini
    load balancer's random room id); returns the decode call's ``kv_transfer_params`` for the same
    room. The prefill instance waits for the decode instance's reservation, then writes the KV; a
    prefill that fails ends its room, and the decode instance computes the prompt itself."""
    room = secrets.randbelow(MAX_BOOTSTRAP_ROOM)
    task = asyncio.create_task(_prefill(client, f"{prefill_url}{path}", body, headers, {"bootstrap_room": room}))
    calls.add(task)
    task.add_done_callback(calls.discard)
    url = httpx.URL(prefill_url)
    return {"do_remote_prefill": True, "bootstrap_room": room, "remote_host": url.host, "remote_port": url.port}


async def _prefill(client: httpx.AsyncClient, url: str, body: dict, headers: dict,
                   push: dict | None = None) -> tuple[httpx.Response | None, bool]:
    """The prefill call: (its answer, False), or (None, True) when the prefill instance is down or failed."""
    prefill_body = {**body, "stream": False, "kv_transfer_params": {"do_remote_decode": True, **(push or {})}}
    prefill_body.pop("stream_options", None)
    prefill_body["max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"] = 1
    try:
        answer = await client.post(url, json=prefill_body, headers=headers)
    except httpx.TransportError as error:
        logger.warning("the prefill instance is unavailable (%s): the decode instance computes the prompt", type(error).__name__)
        return None, True
    if answer.status_code >= 500:
        logger.warning("the prefill instance failed (%d): the decode instance computes the prompt", answer.status_code)
        return None, True
    return answer, False


async def _relay(upstream: httpx.Response):
    """The decode instance's stream, chunk by chunk; a client that leaves closes it (the decode
    instance then aborts the request and frees its blocks)."""
    try:
        async for chunk in upstream.aiter_raw():
            yield chunk
    finally:
        await upstream.aclose()


def _forwarded(raw: Request) -> dict:
    return {k: v for k, v in raw.headers.items() if k.lower() in FORWARDED_HEADERS}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """In the child, before exec: Linux sends it SIGTERM when serve-disagg dies, however it dies."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def instance_kv_transfer_config(role: str, lease_s: float, kv_handover: str = "pull", kv_connector: str = "SharedMemoryConnector") -> dict:
    """The ``--kv-transfer-config`` of the instance in ``role`` ("kv_producer" or "kv_consumer")."""
    return {"kv_connector": kv_connector, "kv_role": role, "engine_id": "prefill" if role == "kv_producer" else "decode",
            "kv_lease_duration": lease_s, "kv_handover": kv_handover}


def start_instance(role: str, port: int, engine_argv: list[str], lease_s: float, kv_handover: str = "pull",
                   kv_connector: str = "SharedMemoryConnector", cores: list[int] | None = None) -> subprocess.Popen:
    """One ``python -m engine serve`` instance in ``role`` ("kv_producer" or "kv_consumer") on 127.0.0.1:port;
    with ``cores``, bound to those CPU cores with as many OpenMP threads (:func:`split_cores`)."""
    config = instance_kv_transfer_config(role, lease_s, kv_handover, kv_connector)
    argv = [sys.executable, "-m", "engine", "serve", *engine_argv, "--host", "127.0.0.1", "--port", str(port),
            "--kv-transfer-config", json.dumps(config), "--uvicorn-log-level", "warning"]
    env = {**os.environ, "OMP_NUM_THREADS": str(len(cores))} if cores else None

    def before_exec() -> None:
        _die_with_parent()
        if cores:
            os.sched_setaffinity(0, cores)

    return subprocess.Popen(argv, env=env, preexec_fn=before_exec if sys.platform == "linux" else None)


def split_cores() -> tuple[list[int], list[int]]:
    """This process's CPU cores in two halves, (prefill's, decode's): each instance a device of its own, as
    two GPUs are (on one core, both get it).

    Raises:
        ValueError: not on Linux (no ``os.sched_getaffinity``).
    """
    if not hasattr(os, "sched_getaffinity"):
        raise ValueError("--split-cores binds each instance to its own cores, which needs Linux (os.sched_setaffinity)")
    cores = sorted(os.sched_getaffinity(0))
    half = max(1, len(cores) // 2)
    return cores[:half], cores[half:] or cores[:half]


def wait_healthy(processes: dict[str, tuple[subprocess.Popen, str]], timeout_s: float) -> None:
    """Until every instance answers /health.

    Raises:
        RuntimeError: one exited, or did not answer within ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    pending = dict(processes)
    while pending:
        for name, (process, url) in list(pending.items()):
            if process.poll() is not None:
                raise RuntimeError(f"the {name} instance exited ({process.returncode}) while starting")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    del pending[name]
            except httpx.TransportError:
                pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"the {', '.join(pending)} instance did not start within {timeout_s:g} s")
        time.sleep(0.2)


def stop_instances(processes: list[subprocess.Popen], timeout_s: float = 40.0) -> None:
    """SIGTERM (each drains its requests), then SIGKILL what is left after ``timeout_s``."""
    for process in processes:
        if process.poll() is None:
            process.terminate()
    deadline = time.monotonic() + timeout_s
    for process in processes:
        try:
            process.wait(max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def _exit_on_signal(signum, frame) -> None:
    raise SystemExit(128 + signum)


def serve_disagg(args, parser: argparse.ArgumentParser) -> None:
    """Start both instances, serve the proxy until SIGINT or SIGTERM, then stop both.

    Raises:
        ValueError: ``--kv-transfer-config`` given (serve-disagg makes each instance's own).
    """
    if args.kv_transfer_config is not None:
        raise ValueError("serve-disagg makes each instance's --kv-transfer-config itself (a producer and a consumer); "
                         "use --kv-lease-duration for the lease")
    engine_argv = instance_argv(args, parser)
    ports = {"prefill": args.prefill_port or free_port(), "decode": args.decode_port or free_port()}
    urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    warning = bind_warning(args.host, False)
    if warning:
        print(warning, file=sys.stderr, flush=True)
    prefill_cores, decode_cores = split_cores() if args.split_cores else (None, None)
    processes = {
        "prefill": (start_instance("kv_producer", ports["prefill"], engine_argv, args.kv_lease_duration, args.kv_handover,
                                   args.kv_connector, prefill_cores), urls["prefill"]),
        "decode": (start_instance("kv_consumer", ports["decode"], engine_argv, args.kv_lease_duration, args.kv_handover,
                                  args.kv_connector, decode_cores), urls["decode"]),
    }
    try:
        wait_healthy(processes, args.startup_timeout)
        app = create_proxy_app(urls["prefill"], urls["decode"], args.host, args.request_timeout, kv_handover=args.kv_handover)
        print(f"serving prefill/decode disaggregated on http://{args.host}:{args.port} (prefill instance {urls['prefill']}, "
              f"decode instance {urls['decode']}, {args.kv_handover} handover)", file=sys.stderr, flush=True)
        # uvicorn re-raises the stop signal once it has stopped: with this handler that ends run() with
        # an exception, so the instances are stopped below instead of outliving this process.
        signal.signal(signal.SIGTERM, _exit_on_signal)
        uvicorn.Server(server_config(app, host=args.host, port=args.port, log_level="warning")).run()
    finally:
        stop_instances([p for p, _ in processes.values()])
