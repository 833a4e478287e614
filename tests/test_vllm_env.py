"""vLLM's environment: the set-up's choice of package indexes (engine/vllm_bridge/env.py)."""

import http.server
import socket
import threading
import time

from engine.vllm_bridge.env import index_reachable


def _serve_once(status: int):
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            self.send_response(status)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.handle_request, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/whl/cpu"


def test_an_index_that_answers_is_reachable_whatever_its_status():
    for status in (200, 404):
        server, url = _serve_once(status)
        try:
            assert index_reachable(url, timeout=5)
        finally:
            server.server_close()


def test_a_refused_connection_or_an_unknown_host_is_not_reachable_and_is_said_quickly():
    with socket.socket() as s:  # a port nobody listens on: bound, then closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.perf_counter()
    assert not index_reachable(f"http://127.0.0.1:{port}/whl/cpu", timeout=5)
    assert not index_reachable("https://download.pytorch.invalid/whl/cpu", timeout=5)  # .invalid never resolves (RFC 2606)
    assert time.perf_counter() - t0 < 12


def test_a_silent_host_times_out():
    with socket.socket() as listener:  # accepts the connection (backlog) but never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        t0 = time.perf_counter()
        assert not index_reachable(f"http://127.0.0.1:{listener.getsockname()[1]}/", timeout=0.5)
        assert time.perf_counter() - t0 < 5
