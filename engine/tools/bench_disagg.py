"""Colocated against 1P1D: the inter-token latency of running streams while long prompts arrive
(prefill/decode interference, DistServe §2; Splitwise §3).

``python -m engine.tools.bench_disagg`` starts ``python -m engine serve`` (one engine: the long
prompts' prefills run in the same steps as the streams' decodes) and then ``python -m engine
serve-disagg`` (a prefill and a decode instance: the prefills run in another process), and on each
keeps ``--streams`` greedy streams of ``--output-len`` tokens running while a ``--long-prompt-len``
token prompt arrives every ``--long-every`` seconds. It prints each setup's ITL p50 / p99 (ms, the
gaps between a stream's chunks after its first) and TTFT p50 of the long prompts. With ``--burst N
--cancel K`` it instead sends N streams at once through serve-disagg, cancels K of them mid-transfer,
and reports how long until every block of both instances is free again. With ``--against vllm`` it
sends the same greedy prompts through serve-disagg and through vLLM's own P/D (two ``vllm serve``
with NixlConnector on the CPU, behind the same proxy) and compares tokens and KV reads
(engine/tools/bench_disagg_vllm.py).

Both instances share this machine's cores: on a CPU, the prefill instance's work slows the decode
instance's steps by contention instead of by batching, which is what the numbers measure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time

import httpx

from engine.config import KV_HANDOVERS
from engine.entrypoints.disagg import free_port


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def run_load(url: str, streams: int, output_len: int, long_len: int, long_every: float) -> dict:
    """Streams decoding while long prompts arrive; their ITLs (ms) and the long prompts' TTFTs (ms)."""
    itls, ttfts = [], []
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        async def stream(i: int) -> None:
            body = {"prompt": f"Count slowly from {i} upwards:", "max_tokens": output_len, "stream": True, "ignore_eos": True}
            last = None
            async with client.stream("POST", "/v1/completions", json=body) as answer:
                async for line in answer.aiter_lines():
                    if not line.startswith("data: {"):
                        continue
                    now = time.perf_counter()
                    if last is not None:
                        itls.append(1e3 * (now - last))
                    last = now

        async def long_prompts(stop: asyncio.Event) -> None:
            k = 0
            while not stop.is_set():
                prompt = [1000 + (k * 7 + j) % 20000 for j in range(long_len)]  # a new prompt each time: no prefix hit
                start = time.perf_counter()
                await client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 1})
                ttfts.append(1e3 * (time.perf_counter() - start))
                k += 1
                try:
                    await asyncio.wait_for(stop.wait(), long_every)
                except asyncio.TimeoutError:
                    pass

        await client.post("/v1/completions", json={"prompt": "warm up", "max_tokens": 2})
        stop = asyncio.Event()
        interferer = asyncio.create_task(long_prompts(stop))
        await asyncio.gather(*(stream(i) for i in range(streams)))
        stop.set()
        await interferer
    return {"itl_p50_ms": percentile(itls, 0.5), "itl_p99_ms": percentile(itls, 0.99), "num_itls": len(itls),
            "long_ttft_p50_ms": percentile(ttfts, 0.5), "num_long_prompts": len(ttfts)}


async def run_burst(url: str, num_streams: int, num_cancelled: int, output_len: int) -> dict:
    """``num_streams`` streams at once through serve-disagg, the first ``num_cancelled`` cancelled
    after 0.3 s (mid-transfer); then how long until every block is free on both instances."""
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        async def stream(i: int) -> int:
            body = {"prompt": f"Request {i}: " + "tell me about paged attention. " * 8, "max_tokens": output_len, "stream": True}
            chunks = 0
            async with client.stream("POST", "/v1/completions", json=body) as answer:
                async for line in answer.aiter_lines():
                    chunks += line.startswith("data: {")
            return chunks

        start = time.perf_counter()
        tasks = [asyncio.create_task(stream(i)) for i in range(num_streams)]
        await asyncio.sleep(0.3)
        for task in tasks[:num_cancelled]:
            task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        done = time.perf_counter()
        while True:
            status = (await client.get("/kv_transfer/status")).json()
            if all(side["num_free_blocks"] == side["num_blocks"] and side["num_lent_requests"] == 0
                   and side["num_waiting_for_remote_kvs"] == 0 and side["num_bootstrapping"] == 0 for side in status.values()):
                break
            await asyncio.sleep(0.1)
    return {"completed": sum(isinstance(r, int) and r > 0 for r in results),
            "cancelled": sum(isinstance(r, asyncio.CancelledError) for r in results),
            "burst_s": round(done - start, 2), "all_blocks_free_after_s": round(time.perf_counter() - done, 2), "status": status}


def serve_and_measure(command: list[str], args) -> dict:
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "engine", *command, "--port", str(port), "--no-enable-prefix-caching",
                                "--max-model-len", str(max(2048, args.long_prompt_len + 16))],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while True:
            assert process.poll() is None, f"{command[0]} exited"
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, f"{command[0]} did not start"
            time.sleep(0.5)
        if args.burst:
            return asyncio.run(run_burst(url, args.burst, args.cancel, args.output_len))
        return asyncio.run(run_load(url, args.streams, args.output_len, args.long_prompt_len, args.long_every))
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(90)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m engine.tools.bench_disagg", description=__doc__.split("\n\n")[0])
    p.add_argument("--streams", type=int, default=4, help="greedy streams decoding at once")
    p.add_argument("--output-len", type=int, default=64, help="tokens per stream")
    p.add_argument("--long-prompt-len", type=int, default=1024, help="tokens of each interfering prompt")
    p.add_argument("--long-every", type=float, default=2.0, help="seconds between interfering prompts")
    p.add_argument("--burst", type=int, default=0, help="instead: this many streams at once through serve-disagg ...")
    p.add_argument("--cancel", type=int, default=0, help="... the first of them cancelled after 0.3 s; then the time until every block is free")
    p.add_argument("--against", choices=["vllm"], default=None,
                   help="instead: the same greedy prompts through the lab's serve-disagg and vLLM's own P/D (two `vllm serve`, "
                        "NixlConnector on the CPU); compare tokens and the decode instances' KV reads (engine/tools/bench_disagg_vllm.py)")
    p.add_argument("--num-prompts", type=int, default=4, help="--against: prompts sent, one at a time")
    p.add_argument("--vllm-python", default=None, help="--against: an interpreter that imports vLLM (default: the venv of `python -m engine vllm setup`)")
    p.add_argument("--vllm-kv-connector", choices=["NixlConnector", "ExampleConnector"], default=None,
                   help="--against: vLLM's transport (default: NixlConnector where NIXL starts in vLLM's venv, else ExampleConnector)")
    p.add_argument("--lab-kv-connector", choices=["SharedMemoryConnector", "NixlConnector"], default="SharedMemoryConnector",
                   help="--against: the lab's transport (serve-disagg --kv-connector; NixlConnector needs .[disagg])")
    p.add_argument("--kv-handover", choices=KV_HANDOVERS, default="pull", help="serve-disagg's order: pull (vLLM's) or push (SGLang's)")
    p.add_argument("--split-cores", action="store_true",
                   help="serve-disagg --split-cores: each instance on its own half of the cores (the colocated engine gets all)")
    p.add_argument("--json", action="store_true", help="print JSON")
    args = p.parse_args(argv)
    if args.against:
        from engine.tools.bench_disagg_vllm import run_cli

        run_cli(args)
        return
    disagg = ["serve-disagg", "--kv-handover", args.kv_handover, *(["--split-cores"] if args.split_cores else [])]
    if args.burst:
        print(json.dumps(serve_and_measure(disagg, args), indent=2))
        return
    results = {"colocated": serve_and_measure(["serve"], args), "1P1D": serve_and_measure(disagg, args)}
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"{'setup':<10} {'ITL p50 ms':>11} {'ITL p99 ms':>11} {'ITLs':>6} {'long TTFT p50 ms':>17} {'long prompts':>13}")
    for name, r in results.items():
        print(f"{name:<10} {r['itl_p50_ms']:>11.1f} {r['itl_p99_ms']:>11.1f} {r['num_itls']:>6} {r['long_ttft_p50_ms']:>17.0f} {r['num_long_prompts']:>13}")


if __name__ == "__main__":
    main()
