"""The lab's HTTP server in a test's own process: the OpenAI and lab endpoints on a free port."""

from __future__ import annotations

import socket
import threading
import time
from contextlib import contextmanager

import httpx
import uvicorn

from engine import EngineConfig, LLMEngine
from engine.entrypoints.openai.api_server import ServerSettings, create_app, server_config


@contextmanager
def serving(engine: LLMEngine | EngineConfig, settings: ServerSettings | None = None, grace_s: float = 10):
    """Serve ``engine`` (or an engine built from the config on the server's engine thread) on a free 127.0.0.1 port; yields (base URL, app). On exit the step streams
    end (as a stop signal ends them) and the server stops within ``grace_s`` seconds of grace."""
    app = create_app(engine, settings)
    with serving_app(app, grace_s, before_stop=app.state.hub.close) as url:
        yield url, app


@contextmanager
def serving_app(app, grace_s: float = 10, before_stop=None):
    """Serve any ASGI ``app`` on a free 127.0.0.1 port; yields its base URL. On exit ``before_stop()``
    runs, then the server stops within ``grace_s`` seconds of grace."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(server_config(app, log_level="warning", timeout_graceful_shutdown=grace_s))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        if before_stop is not None:
            before_stop()
        server.should_exit = True
        thread.join(60)
        assert not thread.is_alive(), "the server did not stop"


def wait_until(condition, timeout: float = 30.0, what: str = "condition", poll_s: float = 0.02) -> None:
    """Poll ``condition()`` until it is true; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(poll_s)


def wait_until_healthy(process, base: str, timeout: float = 180) -> None:
    """Wait for a ``python -m engine serve`` subprocess to answer /health; fail with its stderr if it exits."""
    def up() -> bool:
        assert process.poll() is None, process.communicate()[1]
        try:
            return httpx.get(f"{base}/health").status_code == 200
        except httpx.TransportError:
            return False

    wait_until(up, timeout=timeout, what="the server to start")
