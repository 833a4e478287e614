"""``python -m engine serve-disagg`` on the default model: a prefill and a decode instance (two
processes) behind the proxy, started once for the module. The decode instance asked directly without
``kv_transfer_params`` is an ordinary colocated engine: it is the reference the handover must equal.

Both instances run the ``kv_connector`` lab's parts (the connector's scheduler side) from a student's
file, the model answer cut by ``lessons/labs.py``, plugged in through the seam (``--impl``): every test
here is also the lab's part in the live two-process engine."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import openai
import pytest

from engine.config import KVTransferConfig
from engine.entrypoints.disagg import instance_argv, instance_kv_transfer_config, split_cores
from lessons import labs
from serving import wait_until, wait_until_healthy

pytestmark = pytest.mark.slow

BLOCK_SIZE = 32  # vLLM's CPU attention takes multiples of 32: vLLM's P/D beside this one reads the same blocks
LEASE_S = 30  # kv_lease_duration of the module's prefill instance (an expiry is tested in test_kv_transfer.py)
PROMPTS = ["The capital of France is", "Paged attention stores the KV cache in fixed-size blocks, so that " * 3,
           "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def disagg(default_model_dir, tmp_path_factory):
    """(proxy URL, prefill URL, decode URL) of one serve-disagg, killed with both instances at the end; both
    instances run the kv_connector lab's model answer from a file (module docstring)."""
    answer = tmp_path_factory.mktemp("kv-connector") / "kv_connector.py"
    answer.write_text(labs.cut(labs.get("kv_connector"), keep_solution=True), encoding="utf-8")
    ports = [free_port() for _ in range(3)]
    process = subprocess.Popen(
        [sys.executable, "-m", "engine", "serve-disagg", "--port", str(ports[0]), "--prefill-port", str(ports[1]),
         "--decode-port", str(ports[2]), "--kv-lease-duration", str(LEASE_S), "--num-gpu-blocks-override", "128", "--block-size", str(BLOCK_SIZE),
         "--max-model-len", "1024", "--no-enable-prefix-caching",  # no cache: the colocated reference computes every token
         "--impl", str(answer)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    try:
        wait_until_healthy(process, urls[0], timeout=300)
        said = []  # serve-disagg's stderr up to its ready line: each instance, started before it, has said its own
        while not said or said[-1] and not said[-1].startswith("serving prefill/decode disaggregated"):
            said.append(process.stderr.readline())
        plugged = f"lab parts: {answer} in place of the engine's own (LAB_IMPL)\n"
        assert said.count(plugged) == 3, f"serve-disagg and both its instances run the lab's file: {said}"
        yield urls
    finally:
        process.send_signal(signal.SIGTERM)  # serve-disagg stops its two instances, then itself
        try:
            process.wait(90)
        except subprocess.TimeoutExpired:
            pass
        deadline = time.monotonic() + 10  # a helper process (multiprocessing's resource tracker) ends once its parents have
        while True:
            leftovers = subprocess.run(["pgrep", "-a", "-g", str(process.pid)], capture_output=True, text=True).stdout.splitlines()
            if not leftovers or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        try:
            os.killpg(process.pid, signal.SIGKILL)  # whatever is left of the process group, in any case
        except ProcessLookupError:
            pass
        process.wait(10)
        assert not leftovers, f"processes outlived serve-disagg: {leftovers}"


def complete(url: str, prompt: str | list[int], **body) -> dict:
    answer = httpx.post(f"{url}/v1/completions", json={"prompt": prompt, "max_tokens": 6, "return_token_ids": True, **body}, timeout=120)
    assert answer.status_code == 200, answer.text
    return answer.json()


def tokens(answer: dict) -> list[int]:
    return answer["choices"][0]["token_ids"]


def status(proxy: str) -> dict:
    return httpx.get(f"{proxy}/kv_transfer/status", timeout=30).json()


def all_free(proxy: str) -> bool:
    s = status(proxy)
    return all(side["num_free_blocks"] == side["num_blocks"] and side["num_lent_requests"] == 0
               and side["num_waiting_for_remote_kvs"] == 0 for side in s.values())


def test_greedy_tokens_through_prefill_and_decode_equal_a_colocated_engine_request_by_request(disagg):
    proxy, _, decode = disagg
    forged = {"do_remote_prefill": True, "transfer_id": "C" * 32, "remote_host": "127.0.0.1", "remote_port": 1, "remote_block_ids": [0]}
    for prompt in PROMPTS[0], PROMPTS[2]:  # one block; several
        handed_over = complete(proxy, prompt, kv_transfer_params=forged)  # a client's own are dropped: the proxy makes them
        assert handed_over["kv_transfer_params"]["kv_load"] == "loaded", "the decode instance read the prompt's KV"
        assert tokens(handed_over) == tokens(complete(decode, prompt)), prompt
    # The two instances in one Perfetto trace: a process track each, the prefill on one, the KV's load on the other.
    trace = httpx.get(f"{proxy}/kv_transfer/trace", timeout=60)
    assert trace.status_code == 200, trace.text
    events = trace.json()["traceEvents"]
    tracks = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    assert sorted(name.split()[0] for name in tracks.values()) == ["decode", "prefill"]
    slices = {(tracks[e["pid"]].split()[0], e["name"], e["args"].get("reason")) for e in events if e["ph"] == "X"}
    assert ("prefill", "prefill", None) in slices and ("decode", "kv_transfer", "loading") in slices, \
        "the prefill instance computed the prompts, the decode instance loaded their KV"


def test_vllms_own_prefill_and_decode_gives_the_lab_proxys_greedy_tokens_and_reads_the_same_kv_bytes(disagg):
    """vLLM's P/D (two ``vllm serve`` from vLLM's venv, NixlConnector on the CPU where NIXL starts there)
    behind the same proxy code: request by request the tokens of the lab's serve-disagg, and its decode
    instance reads as many prompts' KV, of as many bytes (same block size, float32)."""
    from engine.tools.bench_disagg_vllm import run_vllm, why_no_nixl
    from engine.vllm_bridge.env import setup, venv_python, why_not_supported

    reason = why_not_supported()
    if reason:
        pytest.skip(reason)
    setup(progress=lambda line: None)  # built here if it is not; CI's own build runs beside the suite and this waits on its lock
    proxy = disagg[0]
    model = httpx.get(f"{proxy}/v1/models").json()["data"][0]["id"]
    before = status(proxy)["decode"]
    lab = [tokens(complete(proxy, prompt, max_tokens=4, temperature=0, ignore_eos=True)) for prompt in PROMPTS]
    after = status(proxy)["decode"]
    connector = "NixlConnector" if why_no_nixl(venv_python()) is None else "ExampleConnector"
    vllm = run_vllm(venv_python(), model, PROMPTS, 4, connector, say=lambda *_: None)
    assert vllm["token_ids"] == lab, f"vLLM's P/D ({connector}) and the lab's disagree"
    assert after["num_loaded"] - before["num_loaded"] == len(PROMPTS)
    if connector == "NixlConnector":
        assert vllm["reads"] == {"num_reads": len(PROMPTS), "num_bytes": after["num_loaded_bytes"] - before["num_loaded_bytes"], "num_failed": 0}


def test_a_burst_of_streams_some_cancelled_mid_transfer_leaves_every_block_free_on_both_sides(disagg):
    proxy = disagg[0]
    client = openai.AsyncOpenAI(base_url=f"{proxy}/v1", api_key="unused", timeout=120, max_retries=0)
    model = httpx.get(f"{proxy}/v1/models").json()["data"][0]["id"]

    async def stream(i: int) -> str:
        text = ""
        async for chunk in await client.completions.create(model=model, prompt=PROMPTS[i % 3] + f" ({i})", max_tokens=12, stream=True):
            text += chunk.choices[0].text if chunk.choices else ""
        return text

    async def burst() -> list:
        tasks = [asyncio.create_task(stream(i)) for i in range(8)]
        await asyncio.sleep(0.3)  # the cancelled two are between the prefill call and their first token
        for task in tasks[:2]:
            task.cancel()
        return await asyncio.gather(*tasks, return_exceptions=True)

    results = asyncio.run(asyncio.wait_for(burst(), 240))
    assert all(isinstance(r, asyncio.CancelledError) for r in results[:2]) and all(isinstance(r, str) and r for r in results[2:]), results
    wait_until(lambda: all_free(proxy), timeout=LEASE_S + 20, what="every block free on both instances", poll_s=0.5)


def test_a_forged_transfer_id_or_block_list_never_reads_another_requests_kv(disagg):
    proxy, prefill, decode = disagg
    victim, forger = list(range(1000, 1050)), list(range(2000, 2050))  # token ids: two prompts of as many blocks
    lent = complete(prefill, victim, max_tokens=1, kv_transfer_params={"do_remote_decode": True})["kv_transfer_params"]
    refused = status(proxy)["prefill"]["num_refused_reads"]
    forgeries = [{**lent, "transfer_id": "A" * 32},  # a guessed id, the victim's blocks
                 lent]  # the victim's own id and blocks, read for another prompt
    forged = [complete(decode, forger, max_tokens=3, kv_transfer_params=params) for params in forgeries]
    rightful = complete(decode, victim, max_tokens=3, kv_transfer_params=lent)  # the refusals did not spend or end the lease
    assert status(proxy)["prefill"]["num_refused_reads"] == refused + len(forgeries)
    own = tokens(complete(decode, forger, max_tokens=3))
    for answer in forged:
        assert answer["kv_transfer_params"]["kv_load"] == "recomputed" and "403" in answer["kv_transfer_params"]["kv_load_error"]
        assert tokens(answer) == own, "the forger gets its own prompt's answer, computed by itself"
    assert rightful["kv_transfer_params"]["kv_load"] == "loaded", rightful["kv_transfer_params"]
    assert tokens(rightful) == tokens(complete(decode, victim, max_tokens=3))


def test_when_the_prefill_instance_dies_the_decode_instance_computes_the_prompt_itself_and_says_so(disagg):
    proxy, prefill, decode = disagg
    want = tokens(complete(decode, PROMPTS[0]))
    os.kill(status(proxy)["prefill"]["pid"], signal.SIGKILL)
    wait_until(lambda: "error" in status(proxy)["prefill"], timeout=30, what="the prefill instance to be gone")
    answer = httpx.post(f"{proxy}/v1/completions", json={"prompt": PROMPTS[0], "max_tokens": 6, "return_token_ids": True}, timeout=120)
    assert answer.status_code == 200 and answer.headers["x-disagg"] == "prefill-unavailable" and tokens(answer.json()) == want
    dead = complete(decode, PROMPTS[0], kv_transfer_params={"do_remote_prefill": True, "transfer_id": "B" * 32, "remote_host": "127.0.0.1",
                                                             "remote_port": int(prefill.rsplit(":", 1)[1]), "remote_block_ids": [0]})
    assert tokens(dead) == want and dead["kv_transfer_params"]["kv_load"] == "recomputed"
    left = status(proxy)["decode"]
    assert left["num_free_blocks"] == left["num_blocks"]


def test_each_instance_gets_the_engine_flags_given_to_serve_disagg():
    from engine.cli import build_parser

    parser = next(a for a in build_parser()._actions if a.dest == "command").choices["serve-disagg"]
    args = parser.parse_args(["my-model", "--block-size", "32", "--no-enable-prefix-caching", "--reserve-null-block", "--port", "9"])
    assert instance_argv(args, parser) == ["--block-size", "32", "--no-enable-prefix-caching",
                                           "--reserve-null-block", "--model", "my-model"]
    assert args.kv_handover == "pull", "vLLM's order unless asked"
    push = parser.parse_args(["--kv-handover", "push", "--kv-lease-duration", "5"])
    configs = [KVTransferConfig.from_dict(instance_kv_transfer_config(role, push.kv_lease_duration, push.kv_handover))
               for role in ("kv_producer", "kv_consumer")]
    assert [(c.kv_role, c.kv_handover, c.kv_lease_duration) for c in configs] == [("kv_producer", "push", 5), ("kv_consumer", "push", 5)]
    split = parser.parse_args(["--split-cores", "--block-size", "32"])
    assert split.split_cores and instance_argv(split, parser) == ["--block-size", "32"], "a proxy's flag, not the engine's"
    prefill_cores, decode_cores = split_cores()  # each instance its own half of the cores, as two GPUs
    cores = sorted(os.sched_getaffinity(0))
    assert prefill_cores + decode_cores == cores if len(cores) > 1 else prefill_cores == decode_cores == cores
