"""``python -m engine serve``: an OpenAI-compatible HTTP server over one engine (vLLM's ``api_server.py``).

Endpoints: ``POST /v1/completions``, ``POST /v1/chat/completions``, ``GET /v1/models``, ``GET /health``,
``GET /metrics`` (Prometheus). FastAPI on uvicorn, one :class:`~engine.entrypoints.async_llm.AsyncLLM`
loop in the server's process.

Safe by default: it binds 127.0.0.1 and, bound there, answers only requests addressed to a loopback
name (``Host``: a DNS-rebinding page is refused); every body must be JSON sent as JSON (415
otherwise: no cross-site "simple" POST) and at most ``--max-request-body-bytes`` (413), and no text in
it may be unencodable. With API keys every /v1 route, /metrics and the lab's read endpoints need
``Authorization: Bearer KEY`` (401 otherwise), the key's name is the request's client, and the
interactive API docs are off; keys and the teacher token are compared in constant time, and an
address that sends too many wrong ones gets 429 (engine/entrypoints/auth.py). Each client (the key's
name, or without keys the request's ``user``) has a cap on requests in flight and on the tokens they
may generate (429 with ``Retry-After``). Without keys a name is free to choose, so each address has a
cap too; and the whole server holds at most ``--max-waiting-requests`` requests waiting for the
engine (429 beyond: a flood under many names cannot queue without end).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import sys
import time
from collections import Counter
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import uvicorn
from fastapi import FastAPI
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from engine.entrypoints.async_llm import PACE_MODES, AsyncLLM, check_steps_per_s
from engine.entrypoints.auth import AuthFailures, bearer, client_address, key_name, same_secret
from engine.entrypoints.kv_transfer import add_kv_transfer_routes, lease_sweeper
from engine.entrypoints.lab import (DEFAULT_VIEWER_BUFFER, StepHub, add_lab_routes, engine_info, new_teacher_token, prompt_text,
                                    run_settings)
from engine.entrypoints.openai.metrics import ServerMetrics
from engine.entrypoints.openai.protocol import APIError, error_body, parse_chat, parse_completion, read_json_body
from engine.entrypoints.openai.serving import OpenAIServing
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine

logger = logging.getLogger("engine.serve")

ANONYMOUS = "anonymous"  # the client of a request on a server without API keys that gives no `user`
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
LOOPBACK_HOST_HEADERS = ("127.0.0.1", "localhost", "[::1]")  # the Host names a loopback-bound server answers


@dataclass
class ServerSettings:
    """How the server faces its clients.

    Attributes:
        served_model_name: the ``model`` clients ask for; None = the engine's model name.
        api_keys: key -> client name; empty = no authentication (a request's client is its ``user``,
            "anonymous" without one).
        max_concurrent_requests_per_client: requests one client may have in flight (429 beyond).
        max_concurrent_requests_per_address: without API keys, requests one address may have in
            flight whatever names they carry (429 beyond). The app relays its students' requests
            from 127.0.0.1 naming each student's address in ``X-Forwarded-For``, which uvicorn
            believes from 127.0.0.1 only.
        max_waiting_requests: requests the whole server may hold that are not running yet
            (waiting or swapped out; 429 beyond).
        max_tokens_per_client: tokens (``max_tokens`` x ``n``) one client's requests in flight may
            ask for together (429 beyond; 400 for one request that asks for more on its own);
            None = no cap.
        max_request_body_bytes: largest request body, bytes (413 beyond).
        retry_after_s: the ``Retry-After`` of a 429, s.
        teacher_token: what the lab's control endpoint asks for (engine/entrypoints/lab.py); None =
            a random one, made at start (``app.state.teacher_token``, printed by ``serve``).
        lab_mode: "run" (the engine steps while there is work) or "step" (only on the teacher's Step).
        lab_max_steps_per_s: run mode's speed cap, steps a second; None = full speed.
        lab_viewer_buffer: events a step-stream viewer may be behind before it is cut off.
        default_temperature: the room's sampling: the temperature of a request that sets none
            (0 = greedy, the default, so that a class's answers repeat; OpenAI's own default is 1.0).
    """

    served_model_name: str | None = None
    api_keys: dict[str, str] = field(default_factory=dict)
    max_concurrent_requests_per_client: int = 64
    max_concurrent_requests_per_address: int = 64
    max_waiting_requests: int = 256
    max_tokens_per_client: int | None = None
    max_request_body_bytes: int = 1 << 20
    retry_after_s: int = 1
    teacher_token: str | None = None
    lab_mode: str = "run"
    lab_max_steps_per_s: float | None = None
    lab_viewer_buffer: int = DEFAULT_VIEWER_BUFFER
    default_temperature: float = 0.0

    def __post_init__(self) -> None:
        if self.teacher_token is not None and (not isinstance(self.teacher_token, str) or len(self.teacher_token.strip()) < 8
                                               or self.teacher_token != self.teacher_token.strip()):
            raise ValueError("teacher_token must be a string of at least 8 characters, no surrounding spaces")
        if self.lab_mode not in PACE_MODES:
            raise ValueError(f"lab_mode must be one of {', '.join(PACE_MODES)}, got {self.lab_mode!r}")
        for name in ("max_concurrent_requests_per_client", "max_concurrent_requests_per_address", "max_waiting_requests",
                     "max_request_body_bytes", "retry_after_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.max_tokens_per_client is not None and (isinstance(self.max_tokens_per_client, bool) or not isinstance(self.max_tokens_per_client, int) or self.max_tokens_per_client < 1):
            raise ValueError(f"max_tokens_per_client must be a positive integer or None, got {self.max_tokens_per_client!r}")
        if self.lab_max_steps_per_s is not None:
            check_steps_per_s(self.lab_max_steps_per_s, "lab_max_steps_per_s")
        t = self.default_temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t < math.inf:
            raise ValueError(f"default_temperature must be a number >= 0 (0 = greedy), got {t!r}")


class ClientLimits:
    """Caps on requests in flight: per client, on requested tokens per client, per address (without
    API keys) and, server-wide, on the requests not yet running (429 with ``Retry-After`` beyond).
    Used from the event loop only."""

    def __init__(self, settings: ServerSettings):
        self.settings = settings
        self.requests: Counter[str] = Counter()
        self.tokens: Counter[str] = Counter()
        self.addresses: Counter[str] = Counter()

    @property
    def in_flight(self) -> int:
        return sum(self.requests.values())

    def acquire(self, client: str, num_tokens: int, field_name: str, address: str | None = None, num_running: int = 0) -> None:
        """Count a request of ``num_tokens`` (max_tokens x n) against ``client`` and, when given,
        ``address`` (a server without keys). ``num_running``: the engine's running requests now; the
        others in flight are waiting.

        Raises:
            APIError: 429 over a cap while others run; 400 when this request alone asks for more
                tokens than the cap (``field_name``, it can never be served).
        """
        s = self.settings
        retry = {"Retry-After": str(s.retry_after_s)}
        waiting = self.in_flight - num_running
        if waiting >= s.max_waiting_requests:
            raise APIError(429, f"the server already holds {waiting} requests waiting for the engine, its limit "
                           "(--max-waiting-requests); retry when some have run", None, retry)
        if self.requests[client] >= s.max_concurrent_requests_per_client:
            raise APIError(429, f"client '{client}' already has {self.requests[client]} requests in flight, its limit "
                           f"(--max-concurrent-requests-per-client); retry when one ends", None, retry)
        if address is not None and self.addresses[address] >= s.max_concurrent_requests_per_address:
            raise APIError(429, f"this address already has {self.addresses[address]} requests in flight, whatever their "
                           "'user', its limit (--max-concurrent-requests-per-address); retry when one ends", None, retry)
        cap = s.max_tokens_per_client
        if cap is not None and num_tokens > cap:
            raise APIError(400, f"'{field_name}' x n = {num_tokens} tokens exceeds the per-client limit of {cap} tokens "
                           "(--max-tokens-per-client)", field_name)
        if cap is not None and self.tokens[client] + num_tokens > cap:
            raise APIError(429, f"client '{client}' has requests in flight for {self.tokens[client]} tokens; {field_name} "
                           f"x n = {num_tokens} more would exceed its limit of {cap} (--max-tokens-per-client); retry when one ends",
                           field_name, retry)
        self.requests[client] += 1
        self.tokens[client] += num_tokens
        if address is not None:
            self.addresses[address] += 1

    def release(self, client: str, num_tokens: int, address: str | None = None) -> None:
        self.requests[client] -= 1
        self.tokens[client] -= num_tokens
        if not self.requests[client]:  # every `user` is a client: forget the ones with nothing in flight
            del self.requests[client], self.tokens[client]
        if address is not None:
            self.addresses[address] -= 1
            if not self.addresses[address]:
                del self.addresses[address]


def create_app(engine: LLMEngine | EngineConfig, settings: ServerSettings | None = None, host: str = "127.0.0.1") -> FastAPI:
    """The FastAPI app serving ``engine``. The engine loop starts with the app's lifespan and stops
    with it (aborting what still runs and printing a summary to stderr).

    ``host`` is the address the server binds: bound to loopback, the app answers only requests
    whose ``Host`` is a loopback name (400 otherwise; DNS rebinding).

    Given an :class:`~engine.EngineConfig`, the engine is built on the worker thread that steps it
    (:meth:`AsyncLLM.from_config`; faster steps on CPU, see engine/entrypoints/async_llm.py).

    The app's ``state`` holds ``llm`` (the :class:`AsyncLLM`), ``metrics`` (:class:`ServerMetrics`),
    ``settings``, ``limits``, ``hub`` (the lab's :class:`~engine.entrypoints.lab.StepHub`),
    ``teacher_token`` and, after shutdown, ``shutdown_summary``. The lab endpoints
    (engine/entrypoints/lab.py) sit beside the OpenAI ones under /lab.
    """
    settings = settings or ServerSettings()
    llm = AsyncLLM.from_config(engine) if isinstance(engine, EngineConfig) else AsyncLLM(engine)
    engine = llm.engine
    model_name = settings.served_model_name or engine.model_name
    metrics = llm.stat_logger = ServerMetrics(model_name)
    limits = ClientLimits(settings)
    teacher_token = settings.teacher_token or new_teacher_token()
    hub = StepHub(engine_info(engine), run_settings(engine), settings.lab_viewer_buffer,
                  sampling={"temperature": float(settings.default_temperature)})
    llm.step_callbacks.append(hub.publish_step)
    auth_failures = AuthFailures()

    kv_transfer = engine.kv_connector is not None

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await llm.start()
        llm.set_pace(settings.lab_mode, settings.lab_max_steps_per_s)
        hub.mode = {"mode": llm.pace_mode, "max_steps_per_s": llm.max_steps_per_s}
        app.state.serving = OpenAIServing(llm, model_name)
        async with (lease_sweeper(llm) if kv_transfer else contextlib.nullcontext()):
            yield
        hub.close()
        summary = await llm.shutdown()
        app.state.shutdown_summary = summary
        late = f" ({summary['aborted_at_shutdown']} of them as the engine stopped)" if summary["aborted_at_shutdown"] else ""
        print(f"engine stopped: {summary['finished']} requests completed, {summary['aborted']} aborted{late}; KV pool: "
              f"{summary['num_free_blocks']} of {summary['num_blocks']} blocks free", file=sys.stderr, flush=True)

    keyed = bool(settings.api_keys)
    # With keys, the interactive docs (which also load their scripts from a CDN) are off.
    app = FastAPI(title="PagedAttention Lab engine", lifespan=lifespan, **(
        {"docs_url": None, "redoc_url": None, "openapi_url": None} if keyed else {}))
    if host in LOOPBACK_HOSTS:
        app.add_middleware(TrustedHostMiddleware, allowed_hosts=list(LOOPBACK_HOST_HEADERS), www_redirect=False)
    app.state.llm, app.state.metrics, app.state.settings, app.state.limits = llm, metrics, settings, limits
    app.state.shutdown_summary = None
    app.state.model_name = model_name
    app.state.hub, app.state.teacher_token = hub, teacher_token
    app.state.auth_failures = auth_failures
    created = int(time.time())
    add_lab_routes(app, llm, hub, teacher_token, settings.api_keys, auth_failures, settings.max_request_body_bytes)
    if kv_transfer:  # prefill/decode disaggregation: the side channel a decode instance reads through
        add_kv_transfer_routes(app, llm, settings.max_request_body_bytes)

    def authenticate(raw: Request) -> str | None:
        """The name of the request's API key; None on a server without keys.

        Raises:
            APIError: 401 without a known ``Authorization: Bearer KEY``; 429 from an address with
                too many wrong ones.
        """
        if not keyed:
            raw.state.client = ANONYMOUS
            return None
        raw.state.client = "unauthenticated"
        key = bearer(raw)
        if key is None:
            raise APIError(401, "missing API key: send 'Authorization: Bearer <key>'", "authorization", {"WWW-Authenticate": "Bearer"})
        auth_failures.check(raw)
        name = key_name(key, settings.api_keys)
        if name is None:
            auth_failures.failed(raw)
            raise APIError(401, "invalid API key", "authorization", {"WWW-Authenticate": "Bearer"})
        raw.state.client = name
        return name

    @app.exception_handler(APIError)
    async def api_error(raw: Request, error: APIError):
        metrics.record_rejected(getattr(raw.state, "client", "unknown"), error.status_code)
        return JSONResponse(error.body(), error.status_code, headers=error.headers)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(raw: Request, error: StarletteHTTPException):
        return JSONResponse(error_body(str(error.detail), "invalid_request_error", None, error.status_code), error.status_code)

    @app.get("/health")
    async def health() -> Response:
        """200 while the server serves. (A stop signal closes the listening socket at once, so a
        probe then finds no server; a request already on its way while the engine drains gets 503.)"""
        return Response(status_code=503 if llm.stopping else 200)

    @app.get("/metrics")
    async def prometheus(raw: Request) -> Response:
        """Prometheus' text format. With API keys it needs one (or the teacher token): it names every key's client."""
        if keyed:
            key = bearer(raw)
            if key is None:
                raise APIError(401, "missing API key: send 'Authorization: Bearer <key>'", "authorization", {"WWW-Authenticate": "Bearer"})
            auth_failures.check(raw)
            if key_name(key, settings.api_keys) is None and not same_secret(key, teacher_token):
                auth_failures.failed(raw)
                raise APIError(401, "invalid API key", "authorization", {"WWW-Authenticate": "Bearer"})
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models")
    async def models(raw: Request) -> JSONResponse:
        authenticate(raw)
        return JSONResponse({"object": "list", "data": [{
            "id": model_name, "object": "model", "created": created, "owned_by": "pagedattention-lab",
            "root": engine.model_name, "max_model_len": engine.max_model_len}]})

    @app.post("/v1/completions")
    async def completions(raw: Request):
        return await _generate(raw, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(raw: Request):
        return await _generate(raw, chat=True)

    async def _generate(raw: Request, chat: bool):
        key_holder = authenticate(raw)
        body = await read_json_body(raw, settings.max_request_body_bytes)
        parse = parse_chat if chat else parse_completion
        request = parse(body, default_temperature=settings.default_temperature)
        # The request's client: its API key's name (a student cannot post as another), else its `user`.
        client = key_holder if key_holder is not None else request.user or ANONYMOUS
        if request.model is not None and request.model != model_name:
            raise APIError(404, f"the model '{request.model}' does not exist; this server serves '{model_name}'", "model")
        serving: OpenAIServing = raw.app.state.serving
        ids = serving.prompt_token_ids(request, chat)
        max_tokens = serving.max_tokens(request, len(ids), chat)
        reserved = max_tokens * request.n
        # Without keys a name is free to choose: the address is capped too (the app forwards its students').
        address = None if keyed else client_address(raw)
        limits.acquire(client, reserved, request.max_tokens_name, address, len(engine.scheduler.running))
        streaming = False
        try:
            # Metrics count by key (a bounded set of names), not by `user`.
            request_id = await serving.add(ids, request, max_tokens, key_holder or ANONYMOUS)
            hub.note_request(request_id, client, prompt_text(request.prompt, serving.tokenizer), max_tokens)
            if request.stream:
                response = serving.stream(request_id, len(ids), request.n, chat, request.include_usage,
                                          on_close=lambda: limits.release(client, reserved, address), return_token_ids=request.return_token_ids)
                streaming = True  # the stream releases the client's share when it closes
                return response
            return await serving.complete(raw, request_id, len(ids), request.n, chat, request.return_token_ids)
        finally:
            if not streaming:
                limits.release(client, reserved, address)

    return app


def bind_warning(host: str, has_api_keys: bool) -> str | None:
    """The warning printed when ``host`` exposes the server beyond this machine (None for loopback)."""
    if host in LOOPBACK_HOSTS:
        return None
    return (f"warning: binding {host} exposes the server beyond this machine"
            + ("" if has_api_keys else " with no API key: anyone who can reach it can use it (see --api-key)"))


SECURITY_HEADERS = [("X-Content-Type-Options", "nosniff")]  # on every response: a browser never guesses a type


def server_config(app: FastAPI, **options) -> uvicorn.Config:
    """uvicorn's configuration for ``app`` (``options``: uvicorn.Config's, e.g. host, port, log_level).

    HTTP/1.1 is parsed by httptools (llhttp), which refuses a request carrying both ``Content-Length``
    and ``Transfer-Encoding`` with a 400 and closes the connection (RFC 9112 section 6.1: such a
    message is a request-smuggling attempt; h11, uvicorn's other parser, answers it and keeps the
    connection open). Every response has ``X-Content-Type-Options: nosniff``, so a browser never runs
    a JSON or text answer as a script or page.
    """
    return uvicorn.Config(app, http="httptools", headers=SECURITY_HEADERS, **options)


def run_server(engine: LLMEngine | EngineConfig, settings: ServerSettings, host: str = "127.0.0.1", port: int = 8000,
               shutdown_timeout_s: float = 30.0, log_level: str = "info") -> None:
    """Serve until SIGINT or SIGTERM. Then the server stops listening (a new connection is refused,
    as uvicorn closes its socket and its idle connections at once), the requests that run get
    ``shutdown_timeout_s`` seconds to finish, those still running are aborted (their streams end
    with an error event, their blocks are freed), and the engine's summary is printed."""
    warning = bind_warning(host, bool(settings.api_keys))
    if warning:
        print(warning, file=sys.stderr, flush=True)
    app = create_app(engine, settings, host)
    connector = app.state.llm.engine.kv_connector
    if connector is not None and connector.side_channel[1] is None:  # a prefill instance's side channel is this server
        connector.side_channel = (connector.side_channel[0] if connector.config.kv_ip else host, port)
    # uvicorn's own grace period is a backstop: the drain below ends every request before it.
    config = server_config(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=shutdown_timeout_s + 10)
    server = _Server(config, app.state.llm, shutdown_timeout_s)
    server.hub = app.state.hub
    print(f"serving '{app.state.model_name}' on http://{host}:{port} "
          f"(OpenAI API at /v1, metrics at /metrics, classroom lab at /lab, {settings.lab_mode} mode, "
          f"{'greedy' if not settings.default_temperature else f'temperature {settings.default_temperature:g}'} by default)", file=sys.stderr, flush=True)
    if settings.teacher_token is None:
        print(f"teacher token (for POST /lab/control and the app's Step / Run controls): {app.state.teacher_token}",
              file=sys.stderr, flush=True)
    server.run()


class _Server(uvicorn.Server):
    """uvicorn's server; on a stop signal it drains the engine: running requests get the shutdown
    timeout to finish, then are aborted, and it says so."""

    def __init__(self, config, llm: AsyncLLM, shutdown_timeout_s: float):
        super().__init__(config)
        self.llm, self.shutdown_timeout_s = llm, shutdown_timeout_s
        self._loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets=None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig, frame) -> None:
        if not self.should_exit and self._loop is not None:
            print(f"stopping: no new requests; {self.llm.num_requests} running requests get up to "
                  f"{self.shutdown_timeout_s:g} s to finish, then the rest are aborted", file=sys.stderr, flush=True)
            self._loop.call_soon_threadsafe(lambda: asyncio.ensure_future(self._drain()))
        super().handle_exit(sig, frame)

    async def _drain(self) -> None:
        aborted = await self.llm.drain(self.shutdown_timeout_s)
        self.hub.close()  # the lab's step streams end, so that they do not hold the shutdown up
        print(f"stopping: {'every running request finished' if not aborted else f'{aborted} requests still running were aborted'}",
              file=sys.stderr, flush=True)
