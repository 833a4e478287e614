"""What a request can do to the shared classroom server, and what it cannot: a real server in the
test's process over a tiny random model, driven by raw HTTP (httpx) and by the `openai` client.

- Nothing a request carries (text that is not UTF-8, a huge label, deep JSON) breaks what the lab
  serves to others, and every refusal is a 400 in OpenAI's shape naming its field.
- Cross-site and DNS-rebinding requests are refused (a JSON content type, a loopback Host).
- Keys and the teacher token resist guessing; with keys, a student's label is its key's name and
  /metrics and the API docs are closed.
- Each `user` is its own client; the room samples greedily unless the teacher says otherwise.
"""

from __future__ import annotations

import json
import socket
import threading

import httpx
import openai
import pytest

from engine import LLM, EngineConfig, LLMEngine, SamplingParams
from engine.entrypoints.auth import MAX_AUTH_FAILURES
from engine.entrypoints.lab import StepHub, sse
from engine.entrypoints.openai.api_server import ServerSettings
from engine.runfile import load_run
from tests.serving import serving, wait_until
from tests.test_classroom import TEACHER, TEACHER_HEADERS, Viewer

JSON = {"Content-Type": "application/json"}
SURROGATE = "\\ud800"  # as JSON writes it: valid JSON, no valid UTF-8


@pytest.fixture(scope="module")
def open_server(tiny_llama_dir):
    """A server without API keys, as a class on one machine runs it."""
    engine = LLMEngine(EngineConfig(model=str(tiny_llama_dir), num_gpu_blocks=32, block_size=4))
    settings = ServerSettings(teacher_token=TEACHER, max_concurrent_requests_per_client=1)
    with serving(engine, settings) as (base, app):
        yield base, app, engine


def raw_post(base: str, path: str, data: bytes | str, headers: dict | None = None) -> httpx.Response:
    return httpx.post(f"{base}{path}", content=data, headers={**JSON, **(headers or {})}, timeout=60)


def error_of(response: httpx.Response, status: int, param: str | None) -> str:
    """The message of an OpenAI-shaped error with this status and ``param``."""
    assert response.status_code == status, (response.status_code, response.text[:300])
    error = response.json()["error"]
    assert error["param"] == param and error["code"] == status, error
    return error["message"]


def test_text_that_cannot_be_utf8_is_refused_naming_its_field_and_the_lab_serves_on(open_server):
    base, app, engine = open_server
    viewer = Viewer(base)
    ok = '"prompt": "Hello", "max_tokens": 2'
    refused = [
        ("/v1/completions", f'{{{ok}, "user": "eve {SURROGATE}"}}', "user"),
        ("/v1/completions", f'{{"prompt": "abc {SURROGATE}", "max_tokens": 2}}', "prompt"),
        ("/v1/completions", f'{{{ok}, "stop": ["a", "{SURROGATE}"]}}', "stop[1]"),
        ("/v1/chat/completions", f'{{"messages": [{{"role": "user", "content": "hi {SURROGATE}"}}], "max_tokens": 2}}',
         "messages[0].content"),
        ("/v1/completions", f'{{{ok}, "{SURROGATE}": 1}}', "body"),
    ]
    for path, body, param in refused:
        assert "UTF-8" in error_of(raw_post(base, path, body), 400, param)
    assert raw_post(base, "/v1/completions", f'{{{ok}, "user": "eve 🦊 \\ud83e\\udd8a"}}').status_code == 200  # a pair is fine
    # Every read endpoint still serves everyone: the open stream, a new viewer, the snapshot, the session.
    assert httpx.get(f"{base}/lab/snapshot").status_code == 200
    session = httpx.get(f"{base}/lab/session")
    assert session.status_code == 200 and "eve 🦊 🦊" in session.json()["clients"].values()
    wait_until(lambda: any(k == "request" and d["client"] == "eve 🦊 🦊" for k, d in viewer.events), what="the request event")
    late = Viewer(base)
    assert "eve 🦊 🦊" in [r["client"] for r in late.events[0][1]["requests"].values()]
    viewer.close(), late.close()


def test_the_hub_serializes_whatever_it_holds():
    """A label that reached the hub by another way than the server's check cannot break its events."""
    hub = StepHub({"model_name": "m", "block_size": 4, "num_blocks": 8, "bytes_per_slot": 8}, {})
    hub.note_request(0, "eve \ud800", "a prompt \udfff", 4)
    hub.note_request(1, "U" * 1_000_000, "x", 4)
    event = sse("hello", hub.header())
    event.encode("utf-8")
    hello = json.loads(event.split("data: ", 1)[1])
    assert hello["requests"]["0"]["client"] == "eve \ufffd" and hello["requests"]["0"]["prompt"] == "a prompt \ufffd"
    assert len(hello["requests"]["1"]["client"]) == 128


def test_bodies_must_be_json_and_a_loopback_server_answers_only_loopback_names(open_server):
    base, app, engine = open_server
    body = json.dumps({"prompt": "Hello", "max_tokens": 2})
    for content_type in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
        message = error_of(raw_post(base, "/v1/completions", body, {"Content-Type": content_type}), 415, "body")
        assert "application/json" in message
    response = httpx.post(f"{base}/v1/chat/completions", content=b'{"messages": [{"role": "user", "content": "hi"}]}', timeout=30)
    assert "no Content-Type" in error_of(response, 415, "body")
    control = httpx.post(f"{base}/lab/control", content=b'{"action": "status"}', headers={**TEACHER_HEADERS, "Content-Type": "text/plain"})
    error_of(control, 415, "body")
    assert raw_post(base, "/v1/completions", body, {"Content-Type": "application/json; charset=utf-8"}).status_code == 200
    # DNS rebinding: a page whose name now points at 127.0.0.1 sends its own name as Host.
    port = base.rsplit(":", 1)[1]
    assert httpx.get(f"{base}/lab/session", headers={"Host": f"evil.example:{port}"}).status_code == 400
    assert raw_post(base, "/v1/completions", body, {"Host": "evil.example"}).status_code == 400
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}"):
        assert httpx.get(f"{base}/health", headers={"Host": host}).status_code == 200


def exchange(base: str, raw: bytes) -> bytes:
    """What the server answers ``raw`` (bytes on one connection) until it closes it, or for 2 s."""
    host, port = base.rsplit("/", 1)[1].split(":")
    with socket.create_connection((host, int(port)), timeout=30) as conn:
        conn.sendall(raw)
        conn.settimeout(2)
        answer = b""
        try:
            while chunk := conn.recv(65536):
                answer += chunk
        except TimeoutError:  # still open: everything it had to say is said
            pass
    return answer


def test_a_body_framed_two_ways_is_refused_the_connection_closed_and_no_answer_is_sniffed(open_server):
    """Content-Length with Transfer-Encoding (request smuggling behind a proxy, RFC 9112 section 6.1):
    a 400, the connection closed, and the request pipelined behind it never answered. Every
    response, a 200, an error or a 404, tells the browser not to guess its type."""
    base, app, engine = open_server
    smuggled = (b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n"
                b"GET /lab/session HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    answer = exchange(base, smuggled).decode("latin-1")
    assert answer.startswith("HTTP/1.1 400 ") and answer.count("HTTP/1.1 ") == 1, answer[:500]
    assert "connection: close" in answer.lower()
    assert httpx.get(f"{base}/health").status_code == 200  # and the server serves on
    for response in (httpx.get(f"{base}/health"), httpx.get(f"{base}/lab/snapshot"), httpx.get(f"{base}/no-such-path"),
                     raw_post(base, "/v1/completions", "{", {})):
        assert response.headers.get("x-content-type-options") == "nosniff", (response.status_code, response.headers)


def test_unbounded_inputs_are_bounded_naming_the_field(open_server):
    base, app, engine = open_server
    ok = {"prompt": "Hello", "max_tokens": 2}
    assert "128" in error_of(raw_post(base, "/v1/completions", json.dumps({**ok, "user": "U" * 129})), 400, "user")
    assert raw_post(base, "/v1/completions", json.dumps({**ok, "user": "U" * 128})).status_code == 200
    assert "64" in error_of(raw_post(base, "/v1/completions", json.dumps({**ok, "stop": [f"s{i}" for i in range(65)]})), 400, "stop")
    assert "4096" in error_of(raw_post(base, "/v1/completions", json.dumps({**ok, "stop": ["x" * 5000]})), 400, "stop")
    assert raw_post(base, "/v1/completions", json.dumps({**ok, "stop": [f"s{i}" for i in range(64)]})).status_code == 200
    for rate in (1e-300, 0.01, 1e6):
        response = httpx.post(f"{base}/lab/control", json={"action": "run", "max_steps_per_s": rate}, headers=TEACHER_HEADERS)
        assert "0.1 to 1000" in error_of(response, 400, "max_steps_per_s")
    assert httpx.post(f"{base}/lab/control", json={"action": "run", "max_steps_per_s": 0.5}, headers=TEACHER_HEADERS).status_code == 200
    assert httpx.post(f"{base}/lab/control", json={"action": "run"}, headers=TEACHER_HEADERS).status_code == 200
    with pytest.raises(ValueError, match="lab_max_steps_per_s"):
        ServerSettings(lab_max_steps_per_s=1e-300)


def test_what_gave_bare_500s_is_a_400_naming_the_field(open_server):
    base, app, engine = open_server
    deep = '{"prompt": ' + "[" * 50_000 + "]" * 50_000 + "}"
    digits = '{"prompt": "Hello", "max_tokens": ' + "9" * 5000 + "}"
    for path in ("/v1/completions", "/v1/chat/completions", "/lab/control"):
        headers = TEACHER_HEADERS if path == "/lab/control" else {}
        assert "nested too deeply" in error_of(raw_post(base, path, deep, headers), 400, "body")
        assert "digits" in error_of(raw_post(base, path, digits, headers), 400, "body")
    # A byte outside ASCII in the Authorization header is a wrong token, not an error.
    response = httpx.post(f"{base}/lab/control", json={"action": "status"}, headers={"Authorization": b"Bearer caf\xe9-token"})
    error_of(response, 403, "authorization")
    assert raw_post(base, "/v1/completions", '{"prompt": "Hello", "max_tokens": 2}').status_code == 200


def test_each_user_is_its_own_client_without_keys(open_server):
    """The per-client cap (1 here) is per `user`: one student's requests do not hold the others back."""
    base, app, engine = open_server
    body = {"prompt": "Hello", "max_tokens": 3, "ignore_eos": True}
    gate = threading.Event()
    app.state.llm._executor.submit(gate.wait)  # hold the engine so that alice's request stays in flight
    results = {}
    try:
        alice = threading.Thread(target=lambda: results.update(alice=httpx.post(f"{base}/v1/completions", json={**body, "user": "alice"},
                                                                               timeout=60)))
        alice.start()
        wait_until(lambda: app.state.limits.requests["alice"] == 1, what="alice's request in flight")
        bob = threading.Thread(target=lambda: results.update(bob=httpx.post(f"{base}/v1/completions", json={**body, "user": "bob"},
                                                                           timeout=60)))
        bob.start()
        wait_until(lambda: app.state.limits.requests["bob"] == 1, what="bob's request in flight (not refused)")
        again = httpx.post(f"{base}/v1/completions", json={**body, "user": "alice"}, timeout=60)
        assert "client 'alice'" in error_of(again, 429, None)
    finally:
        gate.set()
    alice.join(60), bob.join(60)
    assert results["alice"].status_code == results["bob"].status_code == 200
    wait_until(lambda: not app.state.limits.requests, what="the limits to forget clients with nothing in flight")


def test_without_keys_each_address_and_the_whole_server_are_capped_whatever_the_names(open_server):
    """One student changing `user` on every request is still one address; and however many
    addresses, the server holds a bounded number of requests waiting for the engine."""
    base, app, engine = open_server
    limits = app.state.limits
    limits.settings = ServerSettings(teacher_token=TEACHER, max_concurrent_requests_per_client=1,
                                     max_concurrent_requests_per_address=2, max_waiting_requests=3)
    body = {"prompt": "Hello", "max_tokens": 2, "ignore_eos": True}

    def post(user: str, address: str) -> httpx.Response:
        return httpx.post(f"{base}/v1/completions", json={**body, "user": user}, headers={"X-Forwarded-For": address}, timeout=60)

    gate = threading.Event()
    app.state.llm._executor.submit(gate.wait)  # hold the engine: what is accepted stays waiting
    held = [threading.Thread(target=post, args=args) for args in (("a1", "10.0.0.1"), ("a2", "10.0.0.1"), ("b1", "10.0.0.2"))]
    try:
        for n, thread in enumerate(held[:2], 1):
            thread.start()
            wait_until(lambda: limits.addresses["10.0.0.1"] == n, what=f"{n} requests from 10.0.0.1 in flight")
        assert "this address already has 2 requests in flight" in error_of(post("a3", "10.0.0.1"), 429, None)
        held[2].start()
        wait_until(lambda: limits.in_flight == 3, what="3 requests waiting")
        refused = post("c1", "10.0.0.3")
        assert "3 requests waiting for the engine" in error_of(refused, 429, None) and refused.headers["Retry-After"] == "1"
    finally:
        gate.set()
        for thread in held:
            thread.join(60)
        limits.settings = app.state.settings
    wait_until(lambda: not limits.addresses and not limits.in_flight, what="every address forgotten once its requests end")
    assert post("c1", "10.0.0.3").status_code == 200


def test_the_room_samples_greedily_unless_a_request_says_otherwise(open_server, tiny_llama_dir):
    base, app, engine = open_server
    prompt = "The capital of France is"
    greedy = LLM(model=str(tiny_llama_dir), num_gpu_blocks=32, block_size=4).generate(
        [prompt], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))[0].text
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=60)
    for _ in range(2):  # no temperature: the room's, greedy; the same answer each time
        done = client.completions.create(model=engine.model_name, prompt=prompt, max_tokens=8, extra_body={"ignore_eos": True})
        assert done.choices[0].text == greedy
    sampled = {client.completions.create(model=engine.model_name, prompt=prompt, max_tokens=8, temperature=1.5, seed=seed,
                                         extra_body={"ignore_eos": True}).choices[0].text for seed in (1, 2, 3)}
    assert sampled != {greedy}, "a request's own temperature was not kept"
    assert httpx.get(f"{base}/lab/snapshot").json()["sampling"] == {"temperature": 0.0}
    raw = httpx.get(f"{base}/lab/session").content
    assert json.loads(raw)["sampling"] == {"temperature": 0.0} and load_run(raw, name="s.json").steps
    with pytest.raises(ValueError, match="default_temperature"):
        ServerSettings(default_temperature=-1)


def test_metrics_show_the_pool_before_the_first_step(tiny_llama_dir):
    engine = LLMEngine(EngineConfig(model=str(tiny_llama_dir), num_gpu_blocks=24, block_size=4))
    with serving(engine) as (base, app):
        lines = httpx.get(f"{base}/metrics").text.splitlines()
        value = {line.split("{")[0]: float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith("lab:kv_cache")}
        assert value == {"lab:kv_cache_free_blocks": 24, "lab:kv_cache_blocks": 24}


def test_with_keys_guessing_is_limited_labels_are_key_names_and_metrics_and_docs_are_closed(tiny_llama_dir):
    engine = LLMEngine(EngineConfig(model=str(tiny_llama_dir), num_gpu_blocks=16, block_size=4))
    settings = ServerSettings(api_keys={"key-of-bob": "bob", "key-of-carol": "carol"}, teacher_token=TEACHER)
    with serving(engine, settings) as (base, app):
        bob = {"Authorization": "Bearer key-of-bob"}
        # A student labels its request as another student, or as the teacher: the label is its key's name.
        for user in ("carol", "TEACHER (official)"):
            assert httpx.post(f"{base}/v1/completions", json={"prompt": "Hi", "max_tokens": 1, "user": user}, headers=bob,
                              timeout=60).status_code == 200
        assert set(httpx.get(f"{base}/lab/session", headers=bob).json()["clients"].values()) == {"bob"}
        # /metrics names every key's client: it needs a key; the API docs are off.
        assert httpx.get(f"{base}/metrics").status_code == 401
        assert 'client="bob"' in httpx.get(f"{base}/metrics", headers=bob).text
        for path in ("/docs", "/redoc", "/openapi.json"):
            assert httpx.get(f"{base}{path}").status_code == 404
        assert httpx.get(f"{base}/lab/snapshot", headers={"Authorization": b"Bearer caf\xe9"}).status_code == 401
        # Guessing: after MAX_AUTH_FAILURES wrong keys or tokens from one address, every try is 429 for a while.
        app.state.auth_failures.failures.clear()
        for i in range(MAX_AUTH_FAILURES - 1):
            wrong = httpx.post(f"{base}/v1/completions", json={"prompt": "Hi"}, headers={"Authorization": f"Bearer guess-{i}"})
            assert wrong.status_code == 401
        assert httpx.post(f"{base}/lab/control", json={"action": "status"}, headers={"Authorization": "Bearer guess"}).status_code == 403
        for headers, path in ((bob, "/v1/models"), (TEACHER_HEADERS, "/lab/control")):
            locked = httpx.request("GET" if path == "/v1/models" else "POST", f"{base}{path}", headers=headers,
                                   **({} if path == "/v1/models" else {"json": {"action": "status"}}))
            assert "too many wrong keys" in error_of(locked, 429, "authorization") and int(locked.headers["Retry-After"]) >= 1
        app.state.auth_failures.failures.clear()  # the window has passed
        assert httpx.get(f"{base}/v1/models", headers=bob).status_code == 200
        # The app relays a token typed in a student's browser from 127.0.0.1, naming that browser's address
        # (app_pages/classroom_link.control): its guesses lock that address, not the teacher's controls.
        from app_pages.classroom_link import control

        for i in range(MAX_AUTH_FAILURES):
            assert control(base, f"guess-{i}", "status", for_address="10.9.8.7")["status"] == 403
        assert control(base, "guess", "status", for_address="10.9.8.7")["status"] == 429
        assert "error" not in control(base, TEACHER, "status")


def test_without_keys_the_api_docs_stay_open(open_server):
    base, _, _ = open_server
    assert httpx.get(f"{base}/openapi.json").status_code == 200 and httpx.get(f"{base}/metrics").status_code == 200
