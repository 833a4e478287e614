"""`python -m engine serve`: the OpenAI-compatible server, driven by the real `openai` client and by raw HTTP.

Servers run in-process (uvicorn on a free 127.0.0.1 port, on a thread) over tiny random models,
whose tokens only need to be consistent; one test starts `python -m engine serve` as a process to
stop it with SIGTERM.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import openai
import pytest

from engine import LLM, EngineConfig, LLMEngine, SamplingParams
from engine.entrypoints.openai.api_server import ServerSettings, bind_warning
from engine.model_executor.model_loader import ModelLoadError
from engine.report import FINISH
from tests.serving import serving, wait_until, wait_until_healthy

ROOT = Path(__file__).resolve().parent.parent


def metrics(base: str, key: str | None = None) -> dict[str, float]:
    """/metrics as {name: value}, labels dropped (one model per server); ``key``: a server with API keys'."""
    values = {}
    for line in httpx.get(f"{base}/metrics", headers={"Authorization": f"Bearer {key}"} if key else {}).text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[re.sub(r"\{.*\}", "", name)] = float(value)
    return values


def all_blocks_free(engine: LLMEngine) -> bool:
    return engine.kv.num_free_blocks == engine.kv.num_usable_blocks


@pytest.fixture(scope="module")
def tiny(tiny_llama_dir) -> str:
    return str(tiny_llama_dir)


def test_a_server_given_a_config_builds_its_engine_on_the_thread_that_steps_it(tiny, monkeypatch):
    """OpenMP keeps a pool of worker threads per thread that starts parallel work: an engine built on
    one thread and stepped on another leaves two pools (engine/entrypoints/async_llm.py). Given a
    config, the server builds the engine on its engine thread, and every step runs there."""
    threads = {"build": set(), "step": set()}
    build, step = LLMEngine.__init__, LLMEngine.step
    monkeypatch.setattr(LLMEngine, "__init__", lambda self, *a, **k: threads["build"].add(threading.current_thread().name) or build(self, *a, **k))
    monkeypatch.setattr(LLMEngine, "step", lambda self: threads["step"].add(threading.current_thread().name) or step(self))
    with serving(EngineConfig(model=tiny, num_gpu_blocks=64)) as (base, app):
        body = httpx.post(f"{base}/v1/completions", json={"prompt": "Hello", "max_tokens": 3, "ignore_eos": True}, timeout=60).json()
        assert body["usage"]["completion_tokens"] == 3
        assert app.state.llm.engine.model_name in body["model"]
    assert len(threads["build"]) == 1 and threads["build"] == threads["step"]
    assert threads["build"] != {threading.current_thread().name}
    with pytest.raises(ModelLoadError, match="Cannot find model"):  # an engine that cannot be built fails at once, as LLMEngine does
        with serving(EngineConfig(model=str(ROOT / "no-such-model"))):
            pass


def test_openai_client_matches_offline_generate(tiny):
    engine = LLMEngine(EngineConfig(model=tiny, num_gpu_blocks=64))
    prompt = "The capital of France is"
    messages = [{"role": "user", "content": "Name three fruits."}]
    offline = LLM(model=tiny, num_gpu_blocks=64).generate([prompt, messages], SamplingParams(max_tokens=12, ignore_eos=True))
    with serving(engine) as (base, app):
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
        extra = {"ignore_eos": True}
        done = client.completions.create(model=engine.model_name, prompt=prompt, max_tokens=12, temperature=0, extra_body=extra)
        assert done.choices[0].text == offline[0].text
        assert done.choices[0].finish_reason == "length"
        assert (done.usage.prompt_tokens, done.usage.completion_tokens) == (len(offline[0].prompt_token_ids), 12)

        chunks = list(client.completions.create(model=engine.model_name, prompt=prompt, max_tokens=12, temperature=0, stream=True,
                                                stream_options={"include_usage": True}, extra_body=extra))
        assert "".join(c.choices[0].text for c in chunks if c.choices) == offline[0].text
        assert len([c for c in chunks if c.choices]) > 1, "the text came in one piece, not streamed"
        assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12

        chat = client.chat.completions.create(model=engine.model_name, messages=messages, max_tokens=12, temperature=0, extra_body=extra)
        assert chat.choices[0].message.content == offline[1].text
        assert chat.usage.prompt_tokens == len(offline[1].prompt_token_ids)
        stream = client.chat.completions.create(model=engine.model_name, messages=messages, max_tokens=12, temperature=0, stream=True,
                                                extra_body=extra)
        chunks = list(stream)
        assert chunks[0].choices[0].delta.role == "assistant"
        assert "".join(c.choices[0].delta.content or "" for c in chunks) == offline[1].text
        assert chunks[-1].choices[0].finish_reason == "length"

        two = client.completions.create(model=engine.model_name, prompt=prompt, max_tokens=6, temperature=1.0, seed=7, n=2, extra_body=extra)
        assert sorted(c.index for c in two.choices) == [0, 1]
        assert two.usage.completion_tokens == 12 and all(c.text for c in two.choices)
        texts = {0: "", 1: ""}
        for c in client.completions.create(model=engine.model_name, prompt=prompt, max_tokens=6, temperature=1.0, seed=7, n=2,
                                           stream=True, extra_body=extra):
            for choice in c.choices:
                texts[choice.index] += choice.text
        assert texts == {c.index: c.text for c in two.choices}, "the same seed streams the same two samples"

        for _ in range(5):  # requests that end in their first step, maybe before their handler reads them
            assert client.completions.create(model=engine.model_name, prompt=prompt, max_tokens=1, temperature=0).usage.completion_tokens == 1
            assert len([c for c in client.completions.create(model=engine.model_name, prompt=prompt, max_tokens=1, temperature=0,
                                                             stream=True) if c.choices]) == 1

        models = client.models.list()
        assert [m.id for m in models.data] == [engine.model_name]
        assert httpx.get(f"{base}/health").status_code == 200
        m = metrics(base)
        assert m["vllm:request_success_total"] >= 6 and m["vllm:generation_tokens_total"] >= 12 * 4
        assert m["vllm:time_to_first_token_seconds_count"] >= 6 and m["vllm:inter_token_latency_seconds_count"] > 0
        assert m["vllm:e2e_request_latency_seconds_count"] >= 6 and m["vllm:prefix_cache_queries_total"] > 0
    assert all_blocks_free(engine) and not engine.requests


def test_client_that_drops_mid_stream_aborts_its_request(tiny):
    engine = LLMEngine(EngineConfig(model=tiny, num_gpu_blocks=64))
    finishes = []
    with serving(engine) as (base, app):
        app.state.llm.step_callbacks.append(
            lambda report: finishes.extend((e.request_id, e.detail) for e in report.events if e.kind == FINISH))
        body = {"prompt": "Once upon a time", "max_tokens": 1000, "temperature": 0, "ignore_eos": True, "stream": True}
        with httpx.Client(timeout=30) as client:
            with client.stream("POST", f"{base}/v1/completions", json=body) as response:
                data = (line for line in response.iter_lines() if line.startswith("data:"))
                assert all(json.loads(next(data)[5:])["choices"][0]["finish_reason"] is None for _ in range(3))
                assert metrics(base)["vllm:num_requests_running"] == 1
        # The client is gone: the request is aborted, not run to its 1000 tokens.
        wait_until(lambda: finishes, what="the request's end")
        assert finishes == [(0, "abort")]
        wait_until(lambda: metrics(base)["lab:kv_cache_free_blocks"] == 64, what="every block free")
        m = metrics(base)
        assert m["vllm:num_requests_running"] == 0 and m["vllm:num_requests_waiting"] == 0 and m["vllm:kv_cache_usage_perc"] == 0
        assert m["vllm:generation_tokens_total"] < 1000
        assert not engine.requests and all_blocks_free(engine)
        # A client that gives up on a whole (non-streaming) answer aborts its request too.
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{base}/v1/completions", json={**body, "stream": False}, timeout=0.5)
        wait_until(lambda: len(finishes) == 2, what="the second request's end")
        assert finishes[1] == (1, "abort")
        wait_until(lambda: not engine.requests and metrics(base)["lab:kv_cache_free_blocks"] == 64, what="every block free")
        # ... and the server serves on.
        again = httpx.post(f"{base}/v1/completions", json={"prompt": "Hi", "max_tokens": 3, "temperature": 0}, timeout=30)
        assert again.status_code == 200


@pytest.mark.parametrize("preemption_mode", ["recompute", "swap"])
def test_64_streaming_clients_under_memory_pressure(tiny, preemption_mode):
    """64 concurrent streams of mixed lengths through a 20-block pool: requests are preempted, and
    every one still completes with exactly the text an offline run of the same prompts gives."""
    config = dict(num_gpu_blocks=20, max_num_seqs=16, preemption_mode=preemption_mode)
    words = "the a cat sat on mat and ran far away into deep blue sea under bright sky".split()
    prompts = [" ".join(words[(i * 7 + j) % len(words)] for j in range(3 + i % 13)) for i in range(64)]
    max_tokens = [8 + (i * 11) % 41 for i in range(64)]
    offline = LLM(model=tiny, **config).generate(prompts, [SamplingParams(max_tokens=m, ignore_eos=True) for m in max_tokens])
    engine = LLMEngine(EngineConfig(model=tiny, **config))
    preempted, swapped = [], []
    with serving(engine) as (base, app):
        app.state.llm.step_callbacks.append(lambda r: (preempted.extend(r.preempted), swapped.extend(r.swapped_out)))
        client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=120)

        async def one(i: int) -> tuple[str, str]:
            stream = await client.completions.create(model=engine.model_name, prompt=prompts[i], max_tokens=max_tokens[i], temperature=0,
                                                     stream=True, extra_body={"ignore_eos": True})
            text, reason = "", None
            async for chunk in stream:
                text += chunk.choices[0].text
                reason = chunk.choices[0].finish_reason or reason
            return text, reason

        async def all_clients():
            try:
                return await asyncio.gather(*(one(i) for i in range(64)))
            finally:
                await client.close()

        results = asyncio.run(all_clients())
        assert [reason for _, reason in results] == ["length"] * 64
        assert [text for text, _ in results] == [o.text for o in offline]
        assert preempted, "the pool never ran out: nothing was preempted"
        assert bool(swapped) == (preemption_mode == "swap")
        m = metrics(base)
        assert m["vllm:num_preemptions_total"] == len(preempted)
        assert m["vllm:request_success_total"] == 64 and m["vllm:generation_tokens_total"] == sum(max_tokens)
        assert m["lab:kv_cache_free_blocks"] == m["lab:kv_cache_blocks"] == 20
        assert m["vllm:num_requests_running"] == m["vllm:num_requests_swapped"] == 0
    assert not engine.requests and all_blocks_free(engine)
    assert engine.kv.cpu_allocator is None or engine.kv.cpu_allocator.num_free == engine.num_cpu_blocks


def _post(base: str, path: str, body=None, key: str | None = None, **kwargs) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(f"{base}{path}", json=body, headers=headers, timeout=30, **kwargs)


def _error(response: httpx.Response, status: int, param: str | None) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["code"] == status, error
    return error["message"]


def test_a_length_refusal_names_the_pool_when_the_pool_caps_max_model_len(tiny):
    """max_model_len=512 asked, a pool of 16 blocks of 16: one request holds 256 tokens, and the
    refusal says it is the pool's limit, not the model's context length; as asked, vLLM's words."""
    from engine.entrypoints.async_llm import AsyncLLM
    from engine.entrypoints.openai.protocol import APIError, parse_completion
    from engine.entrypoints.openai.serving import OpenAIServing

    def refusal(engine, prompt_len, max_tokens=None):
        body = {"prompt": [5] * prompt_len} | ({"max_tokens": max_tokens} if max_tokens else {})
        with pytest.raises(APIError) as refused:
            OpenAIServing(AsyncLLM(engine), "tiny").max_tokens(parse_completion(body), prompt_len, chat=False)
        return str(refused.value)

    capped = LLMEngine(EngineConfig(model=tiny, num_gpu_blocks=16, max_model_len=512))
    assert capped.max_model_len == 256 and capped.max_model_len_capped_by_pool
    assert refusal(capped, 300) == "the KV pool holds 256 tokens; the prompt has 300 tokens, which leaves no room to generate"
    assert refusal(capped, 200, 100).startswith("the KV pool holds 256 tokens; you asked for 300")
    with pytest.raises(ValueError, match="^prompt of 300 tokens leaves no room to generate: the KV pool holds 256 tokens$"):
        capped.add_request([5] * 300)
    as_asked = LLMEngine(EngineConfig(model=tiny, num_gpu_blocks=64, max_model_len=128))
    assert refusal(as_asked, 200).startswith("this model's maximum context length is 128 tokens; the prompt has 200 tokens")
    with pytest.raises(ValueError, match="^prompt of 200 tokens leaves no room to generate: max_model_len=128$"):
        as_asked.add_request([5] * 200)


def test_bad_input_and_limits_name_the_field(tiny):
    engine = LLMEngine(EngineConfig(model=tiny, num_gpu_blocks=64, max_model_len=256))
    settings = ServerSettings(api_keys={"key-a": "alice", "key-b": "bob"}, max_concurrent_requests_per_client=2,
                              max_tokens_per_client=100, max_request_body_bytes=4096)
    ok = {"prompt": "Hello", "max_tokens": 4, "temperature": 0}
    with serving(engine, settings) as (base, app):
        assert "missing API key" in _error(_post(base, "/v1/completions", ok), 401, "authorization")
        assert "invalid API key" in _error(_post(base, "/v1/completions", ok, key="nope"), 401, "authorization")
        assert httpx.get(f"{base}/v1/models").status_code == 401
        assert _post(base, "/v1/completions", ok, key="key-a").status_code == 200

        bad = [({"max_tokens": 0}, "max_tokens"), ({"temperature": -0.5}, "temperature"), ({"top_p": 0}, "top_p"),
               ({"n": 0}, "n"), ({"stop": [""]}, "stop"), ({"seed": "x"}, "seed"), ({"logprobs": 2}, "logprobs"),
               ({"presence_penalty": 0.5}, "presence_penalty"), ({"best_of": 3}, "best_of"), ({"frobnicate": 1}, "frobnicate"),
               ({"stream_options": {"include_usage": True}}, "stream_options"), ({"prompt": ["a", "b"]}, "prompt"),
               ({"prompt": "word " * 300}, "prompt"), ({"max_tokens": 300}, "max_tokens"), ({"prompt": [10**9]}, "prompt")]
        for change, param in bad:
            message = _error(_post(base, "/v1/completions", {**ok, **change}, key="key-a"), 400, param)
            assert param.split(".")[0] in message, message
        # A neutral value of an unsupported field asks for nothing and is accepted.
        assert _post(base, "/v1/completions", {**ok, "presence_penalty": 0, "logprobs": None}, key="key-a").status_code == 200
        chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
        _error(_post(base, "/v1/chat/completions", {**chat, "messages": [{"role": "robot", "content": "x"}]}, key="key-a"), 400, "messages[0].role")
        _error(_post(base, "/v1/chat/completions", {**chat, "tools": [{"type": "function"}]}, key="key-a"), 400, "tools")
        _error(_post(base, "/v1/chat/completions", {**chat, "messages": [{"role": "user", "content": "x " * 300}]}, key="key-a"), 400, "messages")
        assert "does not exist" in _error(_post(base, "/v1/completions", {**ok, "model": "gpt-4"}, key="key-a"), 404, "model")
        assert "not valid JSON" in _error(httpx.post(f"{base}/v1/completions", content=b'{"prompt": ', headers={"Authorization": "Bearer key-a", "Content-Type": "application/json"}), 400, "body")
        assert "4096 bytes" in _error(_post(base, "/v1/completions", {**ok, "prompt": "x" * 5000}, key="key-a"), 413, "body")
        assert "per-client limit" in _error(_post(base, "/v1/completions", {**ok, "max_tokens": 101}, key="key-a"), 400, "max_tokens")

        # Hold the engine's thread so that requests stay in flight while the limits are tried.
        gate = threading.Event()
        app.state.llm._executor.submit(gate.wait)
        with httpx.Client(timeout=60) as client:
            pending = [threading.Thread(target=client.post, args=(f"{base}/v1/completions",),
                                        kwargs={"json": {**ok, "max_tokens": 40}, "headers": {"Authorization": "Bearer key-a"}}) for _ in range(2)]
            for t in pending:
                t.start()
            wait_until(lambda: app.state.limits.requests["alice"] == 2, what="alice's two requests in flight")
            over_tokens = _post(base, "/v1/completions", {**ok, "max_tokens": 30}, key="key-a")
            assert "requests in flight" in _error(over_tokens, 429, None) and over_tokens.headers["Retry-After"] == "1"
            gate.set()
            for t in pending:
                t.join(60)
        gate2 = threading.Event()
        app.state.llm._executor.submit(gate2.wait)
        with httpx.Client(timeout=60) as client:
            first = threading.Thread(target=client.post, args=(f"{base}/v1/completions",),
                                     kwargs={"json": {**ok, "max_tokens": 80}, "headers": {"Authorization": "Bearer key-a"}})
            first.start()
            wait_until(lambda: app.state.limits.requests["alice"] == 1, what="alice's request in flight")
            too_many = _post(base, "/v1/completions", {**ok, "max_tokens": 30}, key="key-a")
            assert "80 tokens" in _error(too_many, 429, "max_tokens") and too_many.headers["Retry-After"] == "1"
            bob = threading.Thread(target=lambda: bob_result.append(_post(base, "/v1/completions", {**ok, "max_tokens": 30}, key="key-b")))
            bob_result = []
            bob.start()  # another client is not held back by alice's limits
            wait_until(lambda: app.state.limits.requests["bob"] == 1, what="bob's request in flight")
            gate2.set()
            first.join(60)
            bob.join(60)
        assert bob_result[0].status_code == 200
        m = metrics(base, "key-a")
        assert m["vllm:num_requests_running"] == 0
    assert all_blocks_free(engine) and not engine.requests


def test_public_bind_warns():
    assert bind_warning("127.0.0.1", False) is None
    assert "no API key" in bind_warning("0.0.0.0", False)
    assert "exposes" in bind_warning("0.0.0.0", True) and "no API key" not in bind_warning("0.0.0.0", True)


def test_sigterm_aborts_running_requests_and_frees_every_block(tiny):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    process = subprocess.Popen([sys.executable, "-m", "engine", "serve", tiny, "--port", str(port), "--num-gpu-blocks-override", "64",
                                "--shutdown-timeout", "1", "--uvicorn-log-level", "warning"],
                               cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(process, base)
        body = {"prompt": "Once upon a time", "max_tokens": 1000, "temperature": 0, "ignore_eos": True, "stream": True}
        events = []
        with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=60) as response:
            for line in response.iter_lines():
                if line.startswith("data:"):
                    events.append(line[5:].strip())
                    if len(events) == 2:
                        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode in (0, -signal.SIGTERM), err  # uvicorn re-raises the signal once it has shut down
    assert events[-1] == "[DONE]" and json.loads(events[-2])["error"]["code"] == 503
    assert "1 running requests get up to 1 s to finish" in err
    assert "1 requests still running were aborted" in err
    assert re.search(r"engine stopped: 0 requests completed, 1 aborted; KV pool: 64 of 64 blocks free", err), err


def test_serve_flags_choose_the_prefix_cache_and_a_shared_prefix_reports_cached_tokens(tiny):
    """`serve --prefix-cache radix --scheduling-policy lpm --kv-offload-blocks 8` builds that engine,
    and the second request of a shared prefix reports its hit as vLLM does,
    ``usage.prompt_tokens_details.cached_tokens``: the shared prompt's full blocks (the last
    prompt token is always computed)."""
    from engine.cli import build_parser
    from engine.entrypoints.openai.cli_args import engine_config

    args = build_parser().parse_args(["serve", tiny, "--block-size", "4", "--num-gpu-blocks-override", "32", "--prefix-cache", "radix",
                                      "--scheduling-policy", "lpm", "--kv-offload-blocks", "8"])
    config = engine_config(args)
    assert (config.prefix_cache, config.scheduling_policy, config.kv_offload_blocks) == ("radix", "lpm", 8)
    shared = list(range(100, 114))  # 3 full blocks and 2 tokens
    with serving(config) as (base, app):
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
        first, second = (client.completions.create(model=app.state.llm.engine.model_name, prompt=shared + [tail], max_tokens=2, temperature=0)
                         for tail in (7, 9))
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert second.usage.prompt_tokens_details.cached_tokens == 12 and second.usage.prompt_tokens == 15


def test_a_failing_request_fails_alone_and_a_failing_step_fails_every_request(tiny):
    """A request whose own part of a step raises ends in an error (500, or an error event when
    streaming) while the others complete; a step that raises fails every request in it, and the
    server serves on with every block free."""
    engine = LLMEngine(EngineConfig(model=tiny, num_gpu_blocks=64))
    update_text = engine.output_processor._update_text

    def fail_request_1(seq):
        if seq.request_id == 1:
            raise RuntimeError("detokenizer broke")
        update_text(seq)

    engine.output_processor._update_text = fail_request_1
    body = {"prompt": "Hello", "max_tokens": 5, "temperature": 0, "ignore_eos": True}
    with serving(engine) as (base, app):
        assert _post(base, "/v1/completions", body).status_code == 200  # request 0
        assert "detokenizer broke" in _error(_post(base, "/v1/completions", body), 500, None)  # request 1
        assert _post(base, "/v1/completions", body).status_code == 200  # request 2
        engine.output_processor._update_text = update_text

        execute = engine.runner.execute
        engine.runner.execute = lambda *args: (_ for _ in ()).throw(RuntimeError("the forward pass broke"))
        with httpx.stream("POST", f"{base}/v1/completions", json={**body, "stream": True}, timeout=30) as response:
            events = [line[5:].strip() for line in response.iter_lines() if line.startswith("data:")]
        assert events[-1] == "[DONE]" and "the forward pass broke" in json.loads(events[-2])["error"]["message"]
        engine.runner.execute = execute
        assert _post(base, "/v1/completions", body).status_code == 200
        m = metrics(base)
        assert m["vllm:num_requests_running"] == 0 and m["lab:kv_cache_free_blocks"] == 64
    assert not engine.requests and all_blocks_free(engine)
