"""The classroom's lab endpoints, beside the OpenAI ones: every step of the shared engine, live.

- ``GET /lab/steps``: server-sent events, one ``step`` event per engine step, its data a step report
  exactly as a run file's ``steps`` entry (``dataclasses.asdict`` of :class:`~engine.report.StepReport`,
  engine/runfile.py). Any number of viewers follow it; each gets every step from when it joined.
- ``GET /lab/snapshot``: for a late joiner, the state now: the last step report (block tables, pool
  map data, memory, events), the scheduler's queues, every request's client and prompt, the mode.
- ``GET /lab/session``: the whole session so far (the last :data:`MAX_STEPS_KEPT` steps) as a run
  file, which the app replays like any saved run.
- ``GET /lab/control``: the mode; ``POST /lab/control`` (the teacher token): ``{"action": "step"}``
  runs exactly one engine step and answers with it, ``{"action": "pause"}`` is step mode,
  ``{"action": "run", "max_steps_per_s": 2}`` runs freely (null = full speed; otherwise
  :data:`~engine.entrypoints.async_llm.MIN_STEPS_PER_S` to ``MAX_STEPS_PER_S``), ``{"action": "status"}``
  changes nothing (it checks the token).

The stream's events (``event:`` line, then one ``data:`` line of JSON):

- ``hello`` (first): the run file's header, ``format``, ``version``, ``engine``, ``settings``, plus
  ``requests`` (request id -> ``{"client", "prompt", "max_tokens"}``), ``mode``, ``sampling`` (the
  room's: ``{"temperature"}`` of a request that sets none, 0 = greedy), ``next_step`` (the step
  number of the first ``step`` event this viewer will get) and ``server_id`` (random, new at each
  start: a viewer that reconnects to a restarted server on the same address drops the old one's
  requests and steps, whose request ids and step numbers the new one reuses);
- ``request``: a request accepted: ``{"request_id", "client", "prompt", "max_tokens"}``;
- ``step``: a step report;
- ``mode``: the teacher changed the mode: ``{"mode", "max_steps_per_s"}``;
- ``lagged`` (last): the viewer fell behind, see below.

A slow viewer cannot stall the engine: each viewer has a bounded buffer (``--lab-viewer-buffer``
events). The engine loop only puts events into buffers, never waits for one. A viewer whose buffer
is full is cut off: it still gets every event already in its buffer, then a ``lagged`` event
(``{"missed_from_step": n}``, the first step it did not get) and the stream ends; it reconnects and
catches up from ``/lab/snapshot`` or ``/lab/session``. A viewer that goes away is dropped when its
connection closes.

Each request is labelled by its client: with API keys the name of its key (a student cannot post
as another), without keys its OpenAI ``user`` field ("anonymous" without one). With API keys, the read
endpoints need a key too (or the teacher token): the step stream shows every student's prompt and
answer.

What the hub keeps from a request can never break what it serves to others: the server refuses
text that cannot be encoded as UTF-8 before the hub sees it, labels and prompts are cut to
:data:`MAX_CLIENT_CHARS` and :data:`MAX_PROMPT_CHARS`, and every event and response is encoded with
unencodable characters replaced.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import secrets
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from engine.entrypoints.async_llm import RUN_MODE, STEP_MODE, AsyncLLM, EngineStopping
from engine.entrypoints.auth import AuthFailures, bearer, key_name, same_secret
from engine.entrypoints.openai.protocol import MAX_USER_CHARS, APIError, read_json_body
from engine.report import StepReport
from engine.runfile import (DEFAULT_MODEL, RUN_FORMAT, SETTING_CHOICES, SETTING_LIMITS, SETTINGS_DEFAULTS, VERSION, Run, Workload,
                            WorkloadRequest, run_json)

LAB_PREFIX = "/lab"
DEFAULT_VIEWER_BUFFER = 256  # events a viewer may be behind before it is cut off
MAX_STEPS_KEPT = 2000  # steps kept for /lab/session (the app's Live page keeps as many)
MAX_REQUESTS_KEPT = 10_000  # request labels and prompts kept
KEEPALIVE_S = 15.0  # a comment line when nothing happened for this long (keeps proxies from closing the stream)
MAX_PROMPT_CHARS = 2000  # a prompt as the step stream and the run file show it
MAX_CLIENT_CHARS = MAX_USER_CHARS  # a client label as the step stream and the run file show it
CONTROL_ACTIONS = ("step", "pause", "run", "status")


def new_teacher_token() -> str:
    """A random teacher token (URL-safe, 16 characters)."""
    return secrets.token_urlsafe(12)


@dataclass(frozen=True)
class RequestInfo:
    """What the classroom shows of a request: its client's label, the prompt text, max_tokens."""

    client: str
    prompt: str
    max_tokens: int


class _Viewer:
    def __init__(self, size: int):
        self.queue: asyncio.Queue[str] = asyncio.Queue(maxsize=size)
        self.lagged_at: int | None = None  # the first step it missed, once cut off


def safe_json(data) -> str:
    """Compact JSON whose text always encodes as UTF-8: a character that cannot (a lone UTF-16
    surrogate) becomes U+FFFD."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = json.dumps(_clean(data), ensure_ascii=False, separators=(",", ":"))
    return text


def _clean(data):
    """``data`` with every string (keys too) made UTF-8-encodable (U+FFFD for what is not)."""
    if isinstance(data, str):
        return clean_text(data)
    if isinstance(data, dict):
        return {clean_text(str(k)): _clean(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [_clean(v) for v in data]
    return data


def clean_text(text: str) -> str:
    """``text`` with each character UTF-8 cannot encode (a lone surrogate) replaced by U+FFFD."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return "".join(c if not 0xD800 <= ord(c) <= 0xDFFF else "\ufffd" for c in text)


class SafeJSONResponse(JSONResponse):
    """A JSONResponse rendered by :func:`safe_json`: whatever the hub holds, the response is sent."""

    def render(self, content) -> bytes:
        return safe_json(content).encode("utf-8")


def sse(event: str, data) -> str:
    """One server-sent event: ``event:`` and one ``data:`` line of compact JSON (no newline inside;
    always encodable, :func:`safe_json`)."""
    return f"event: {event}\ndata: {safe_json(data)}\n\n"


class StepHub:
    """Fans each engine step out to every viewer, and keeps the session for late joiners and for saving.

    Args:
        engine_info: the run file's ``engine`` object (model_name, block_size, num_blocks, bytes_per_slot).
        settings: the run file's ``settings`` object.
        viewer_buffer: events each viewer may be behind before it is cut off (>= 1).

    Used from the event loop only: :meth:`publish_step` is one of the AsyncLLM's step callbacks.
    """

    def __init__(self, engine_info: dict, settings: dict, viewer_buffer: int = DEFAULT_VIEWER_BUFFER, sampling: dict | None = None):
        if isinstance(viewer_buffer, bool) or not isinstance(viewer_buffer, int) or viewer_buffer < 1:
            raise ValueError(f"viewer_buffer must be a positive integer, got {viewer_buffer!r}")
        self.engine_info, self.settings, self.viewer_buffer = engine_info, settings, viewer_buffer
        self.requests: OrderedDict[int, RequestInfo] = OrderedDict()
        self.steps: deque[StepReport] = deque(maxlen=MAX_STEPS_KEPT)
        self.viewers: set[_Viewer] = set()
        self.num_lagged = 0  # viewers cut off for falling behind, since the start
        self.mode = {"mode": RUN_MODE, "max_steps_per_s": None}
        self.sampling = dict(sampling or {"temperature": 1.0})  # the room's default sampling
        self.server_id = secrets.token_hex(8)  # this start of the server (module docstring: hello)
        self.closed = False

    @property
    def next_step(self) -> int:
        return self.steps[-1].step + 1 if self.steps else 0

    def header(self) -> dict:
        """The run file's header and what a joining viewer needs before its first step."""
        return {"format": RUN_FORMAT, "version": VERSION, "engine": self.engine_info, "settings": self.settings,
                "requests": {str(k): dataclasses.asdict(v) for k, v in self.requests.items()}, "mode": self.mode,
                "sampling": self.sampling, "next_step": self.next_step, "server_id": self.server_id}

    # ---- what happens ---------------------------------------------------------------------------

    def note_request(self, request_id: int, client: str, prompt: str, max_tokens: int) -> None:
        """Keep a request's label and prompt (cut to :data:`MAX_CLIENT_CHARS` and :data:`MAX_PROMPT_CHARS`,
        unencodable characters replaced) and tell every viewer."""
        info = RequestInfo(clean_text(client[:MAX_CLIENT_CHARS]), clean_text(prompt[:MAX_PROMPT_CHARS]), max_tokens)
        self.requests[request_id] = info
        while len(self.requests) > MAX_REQUESTS_KEPT:
            self.requests.popitem(last=False)
        self._publish(sse("request", {"request_id": request_id, **dataclasses.asdict(info)}))

    def publish_step(self, report: StepReport) -> None:
        self.steps.append(report)
        if self.viewers:  # serialized once, for every viewer
            self._publish(sse("step", dataclasses.asdict(report)), report.step)

    def publish_mode(self, mode: str, max_steps_per_s: float | None) -> None:
        self.mode = {"mode": mode, "max_steps_per_s": max_steps_per_s}
        self._publish(sse("mode", self.mode))

    def _publish(self, event: str, step: int | None = None) -> None:
        if self.closed:
            return
        for viewer in self.viewers:
            if viewer.lagged_at is not None:
                continue
            try:
                viewer.queue.put_nowait(event)
            except asyncio.QueueFull:  # never wait for a viewer: cut it off instead
                viewer.lagged_at = step if step is not None else self.next_step
                self.num_lagged += 1

    def close(self) -> None:
        """The server is stopping: every viewer's stream ends once it has what its buffer holds (so
        that open streams do not hold the server's shutdown up)."""
        self.closed = True
        for viewer in self.viewers:
            try:
                viewer.queue.put_nowait(None)
            except asyncio.QueueFull:
                pass  # it ends when its buffer is empty (follow checks closed)

    # ---- viewers --------------------------------------------------------------------------------

    async def follow(self) -> AsyncIterator[str]:
        """One viewer's events: ``hello``, then every event from now on, until it goes away or lags."""
        viewer = _Viewer(self.viewer_buffer)
        self.viewers.add(viewer)
        try:
            yield sse("hello", self.header())
            while not (self.closed and viewer.queue.empty()):
                if viewer.lagged_at is not None and viewer.queue.empty():
                    yield sse("lagged", {"missed_from_step": viewer.lagged_at, "buffer": self.viewer_buffer})
                    return
                try:
                    event = await asyncio.wait_for(viewer.queue.get(), KEEPALIVE_S)
                except asyncio.TimeoutError:
                    yield ": keepalive\n\n"
                    continue
                if event is None:  # closed
                    return
                yield event
        finally:
            self.viewers.discard(viewer)

    # ---- saving -----------------------------------------------------------------------------------

    def run_file(self) -> str | None:
        """The session as a run file's JSON text (engine/runfile.py), with one key more that older
        readers ignore: ``clients``, request id -> client label, and ``sampling``, the room's. None
        before the first step."""
        if not self.steps:
            return None
        ids = sorted(self.requests)
        requests = [WorkloadRequest(self.requests[i].prompt if self.requests[i].prompt.strip() else "(empty prompt)",
                                    max(1, self.requests[i].max_tokens)) for i in ids]
        if not requests:  # steps with no request known (all dropped from the kept labels): a placeholder
            requests = [WorkloadRequest("(no request kept)", 1)]
        run = Run(Workload(requests, dict(self.settings)), self.engine_info,
                  {i: self.requests[i].prompt for i in ids}, list(self.steps))
        text = run_json(run)
        clients = safe_json({str(i): self.requests[i].client for i in ids})
        return clean_text(text[:-1] + f',"clients":{clients},"sampling":{safe_json(self.sampling)}}}')


def engine_info(engine) -> dict:
    """A run file's ``engine`` object for ``engine`` (an :class:`~engine.LLMEngine`)."""
    return {"model_name": engine.model_name, "block_size": engine.config.block_size, "num_blocks": engine.num_blocks,
            "bytes_per_slot": engine.bytes_per_slot}


def run_settings(engine) -> dict:
    """A run file's ``settings`` for ``engine``'s config (values a run file cannot hold take the defaults)."""
    cfg = engine.config
    settings = dict(SETTINGS_DEFAULTS)
    settings.update(model=cfg.model or DEFAULT_MODEL, block_size=cfg.block_size, num_gpu_blocks=engine.num_blocks,
                    max_num_seqs=cfg.max_num_seqs, seed=cfg.seed, enable_chunked_prefill=bool(cfg.enable_chunked_prefill),
                    max_num_batched_tokens=cfg.max_num_batched_tokens, enable_prefix_caching=cfg.enable_prefix_caching)
    for key, choices in SETTING_CHOICES.items():
        value = getattr(cfg, key, None)
        if value in choices:
            settings[key] = value
    for key, limit in SETTING_LIMITS.items():  # a run file holds values up to these; a larger server says so elsewhere
        if isinstance(settings.get(key), int) and not isinstance(settings[key], bool):
            settings[key] = min(settings[key], int(limit))
    return settings


def prompt_text(prompt, tokenizer) -> str:
    """A request's prompt as the classroom shows it: a completion's text (token ids decoded), a
    chat's last user message."""
    if isinstance(prompt, str):
        return prompt
    if prompt and isinstance(prompt[0], dict):
        users = [m.get("content") for m in prompt if m.get("role") == "user"]
        text = users[-1] if users else prompt[-1].get("content")
        return text if isinstance(text, str) else str(text)
    return tokenizer.decode(list(prompt), skip_special_tokens=True)


# ---- the endpoints --------------------------------------------------------------------------------


def add_lab_routes(app, llm: AsyncLLM, hub: StepHub, teacher_token: str, read_keys: dict[str, str],
                   auth_failures: AuthFailures | None = None, max_body_bytes: int = 1 << 20) -> None:
    """The lab endpoints on ``app`` (module docstring).

    Args:
        teacher_token: what ``POST /lab/control`` asks for, as ``Authorization: Bearer TOKEN``.
        read_keys: the server's API keys (key -> name); when any, the read endpoints need one of
            them or the teacher token.
        auth_failures: wrong keys and tokens by address, shared with the OpenAI endpoints (429 beyond
            the limit; engine/entrypoints/auth.py).
        max_body_bytes: the largest body of ``POST /lab/control`` (413 beyond), the server's own cap.
    """
    failures = auth_failures or AuthFailures()

    def may_read(raw: Request) -> None:
        if not read_keys:
            return
        key = bearer(raw)
        if key is None:
            raise APIError(401, "missing API key: send 'Authorization: Bearer <key>'", "authorization", {"WWW-Authenticate": "Bearer"})
        failures.check(raw)
        if key_name(key, read_keys) is None and not same_secret(key, teacher_token):
            failures.failed(raw)
            raise APIError(401, "invalid API key", "authorization", {"WWW-Authenticate": "Bearer"})

    def teacher(raw: Request) -> None:
        key = bearer(raw)
        if key is None:
            raise APIError(401, "the lab's control needs the teacher token: send 'Authorization: Bearer <teacher token>'",
                           "authorization", {"WWW-Authenticate": "Bearer"})
        failures.check(raw)
        if not same_secret(key, teacher_token):
            failures.failed(raw)
            raise APIError(403, "this is not the teacher token (--teacher-token, or the one printed at start)", "authorization")

    def control_state() -> dict:
        return {**hub.mode, "next_step": hub.next_step, "num_requests": llm.num_requests, "num_viewers": len(hub.viewers),
                "num_lagged_viewers": hub.num_lagged}

    @app.get(f"{LAB_PREFIX}/steps")
    async def steps(raw: Request):
        may_read(raw)
        return StreamingResponse(hub.follow(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    @app.get(f"{LAB_PREFIX}/snapshot")
    async def snapshot(raw: Request) -> JSONResponse:
        may_read(raw)
        queues = await llm.run_on_engine(_queues, llm.engine)
        last = hub.steps[-1] if hub.steps else None
        return SafeJSONResponse({**hub.header(), "queues": queues, "control": control_state(),
                                 "step": dataclasses.asdict(last) if last is not None else None})

    @app.get(f"{LAB_PREFIX}/session")
    async def session(raw: Request) -> Response:
        may_read(raw)
        text = hub.run_file()
        if text is None:
            raise APIError(409, "nothing to save yet: the engine has not stepped")
        return Response(text.encode("utf-8"), media_type="application/json",
                        headers={"Content-Disposition": 'attachment; filename="classroom_session.json"'})

    @app.get(f"{LAB_PREFIX}/control")
    async def get_control(raw: Request) -> JSONResponse:
        may_read(raw)
        return JSONResponse(control_state())

    @app.post(f"{LAB_PREFIX}/control")
    async def post_control(raw: Request) -> JSONResponse:
        teacher(raw)
        body = await read_json_body(raw, max_body_bytes, empty={})
        if not isinstance(body, dict):
            raise APIError(400, "the body must be a JSON object such as {\"action\": \"step\"}", "body")
        unknown = sorted(set(body) - {"action", "max_steps_per_s"})
        if unknown:
            raise APIError(400, f"'{unknown[0]}' is not a field of the lab's control (only 'action' and 'max_steps_per_s')", unknown[0])
        action = body.get("action")
        if action not in CONTROL_ACTIONS:
            raise APIError(400, f"'action' must be one of {', '.join(map(repr, CONTROL_ACTIONS))}, got {action!r}", "action")
        rate = body.get("max_steps_per_s")
        if rate is not None and action != "run":
            raise APIError(400, "'max_steps_per_s' goes with the action 'run' only", "max_steps_per_s")
        if action == "step":
            try:
                report = await llm.step_once()
            except EngineStopping as error:
                raise APIError(503, str(error)) from None
            except TimeoutError:
                raise APIError(503, "the step did not end in time") from None
            _mode_changed(llm, hub)
            if report is None:
                return JSONResponse({"stepped": False, "reason": "no request is waiting or running", **control_state()})
            return JSONResponse({"stepped": True, "step": report.step, "phase": report.phase, **control_state()})
        if action == "status":
            return JSONResponse(control_state())
        try:
            llm.set_pace(STEP_MODE if action == "pause" else RUN_MODE, rate)
        except ValueError as error:
            raise APIError(400, str(error), "max_steps_per_s") from None
        _mode_changed(llm, hub)
        return JSONResponse(control_state())


def _mode_changed(llm: AsyncLLM, hub: StepHub) -> None:
    if (llm.pace_mode, llm.max_steps_per_s) != (hub.mode["mode"], hub.mode["max_steps_per_s"]):
        hub.publish_mode(llm.pace_mode, llm.max_steps_per_s)


def _queues(engine) -> dict:
    """On the engine's thread: the scheduler's queues, request ids in queue order."""
    scheduler = engine.scheduler
    return {"waiting": [g.request_id for g in scheduler.waiting], "running": [g.request_id for g in scheduler.running],
            "swapped": [g.request_id for g in scheduler.swapped]}

