"""``python -m engine bench-serve``: load an OpenAI-compatible server and measure it, with the
conventions of ``vllm bench serve`` (its flags, its metrics, its printout).

Requests come from the *random* dataset (prompts of ``--random-input-len`` token ids, outputs of
``--random-output-len`` tokens, both spread by ``--random-range-ratio``), sent as token ids so that
every prompt has exactly its length. They arrive as a Poisson process at ``--request-rate``
requests/s (``--burstiness`` < 1 burstier, > 1 more regular: gamma-distributed gaps, as vLLM) or all
at once (``inf``), at most ``--max-concurrency`` at a time. Each request streams; the client times:

- TTFT, time to first token: request sent -> its first text chunk (ms).
- ITL, inter-token latency: the gaps between its chunks (ms; one chunk per engine step).
- TPOT, time per output token: (e2e latency - TTFT) / (output tokens - 1), per request (ms).
- E2EL, end-to-end latency: request sent -> its last chunk (ms).

Output tokens are counted from the stream's usage chunk (``stream_options.include_usage``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import time
from dataclasses import dataclass, field

import numpy as np

METRICS = ("ttft", "tpot", "itl", "e2el")
METRIC_TITLES = {"ttft": "Time to First Token", "tpot": "Time per Output Token (excl. 1st token)", "itl": "Inter-token Latency",
                 "e2el": "End-to-end Latency"}


@dataclass
class SampleRequest:
    """One request of the dataset: its prompt's token ids and its output length, tokens."""

    prompt_token_ids: list[int]
    output_len: int


@dataclass
class RequestResult:
    """What the client measured of one request (vLLM's ``RequestFuncOutput``); times in seconds."""

    success: bool = False
    prompt_len: int = 0
    output_tokens: int = 0
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    latency: float = 0.0
    error: str = ""


def random_dataset(num_prompts: int, input_len: int, output_len: int, range_ratio: float, vocab_size: int, seed: int) -> list[SampleRequest]:
    """vLLM's random dataset: lengths uniform in ``[len * (1 - range_ratio), len * (1 + range_ratio)]``,
    prompt token ids ``(offset + i + arange(len)) % vocab_size`` from a random offset per request.

    Raises:
        ValueError: a length < 1 or a range_ratio outside [0, 1).
    """
    if input_len < 1 or output_len < 1:
        raise ValueError(f"random-input-len and random-output-len must be >= 1, got {input_len} and {output_len}")
    if not 0 <= range_ratio < 1:
        raise ValueError(f"random-range-ratio must be in [0, 1), got {range_ratio}")
    rng = np.random.default_rng(seed)
    inputs = rng.integers(max(1, int(input_len * (1 - range_ratio))), int(input_len * (1 + range_ratio)) + 1, num_prompts)
    outputs = rng.integers(max(1, int(output_len * (1 - range_ratio))), int(output_len * (1 + range_ratio)) + 1, num_prompts)
    offsets = rng.integers(0, vocab_size, num_prompts)
    return [SampleRequest([int((offsets[i] + i + j) % vocab_size) for j in range(inputs[i])], int(outputs[i])) for i in range(num_prompts)]


def arrival_gaps(num_requests: int, request_rate: float, burstiness: float, seed: int) -> list[float]:
    """Seconds between request arrivals: 0 for ``request_rate`` = inf; else gamma-distributed with
    mean ``1 / request_rate`` and shape ``burstiness`` (1 = exponential: a Poisson process)."""
    if math.isinf(request_rate):
        return [0.0] * num_requests
    if request_rate <= 0 or burstiness <= 0:
        raise ValueError(f"request-rate and burstiness must be > 0, got {request_rate} and {burstiness}")
    rng = np.random.default_rng(seed + 1)
    return list(rng.gamma(shape=burstiness, scale=1 / (request_rate * burstiness), size=num_requests))


async def _send(client, url: str, model: str, request: SampleRequest, ignore_eos: bool, headers: dict) -> RequestResult:
    result = RequestResult(prompt_len=len(request.prompt_token_ids))
    body = {"model": model, "prompt": request.prompt_token_ids, "max_tokens": request.output_len, "temperature": 0.0,
            "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": ignore_eos}
    start = last = time.perf_counter()
    try:
        async with client.stream("POST", url, json=body, headers=headers) as response:
            if response.status_code != 200:
                result.error = f"HTTP {response.status_code}: {(await response.aread()).decode(errors='replace')[:200]}"
                return result
            async for line in response.aiter_lines():
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[5:])
                if "error" in chunk:
                    result.error = chunk["error"].get("message", str(chunk["error"]))
                    return result
                now = time.perf_counter()
                if chunk.get("choices") and chunk["choices"][0].get("text"):
                    if result.ttft == 0.0:
                        result.ttft = now - start
                    else:
                        result.itl.append(now - last)
                    last = now
                if chunk.get("usage"):
                    result.output_tokens = chunk["usage"]["completion_tokens"]
            result.latency = last - start
            result.success = True
    except Exception as error:  # a failed request is counted, not fatal
        result.error = f"{type(error).__name__}: {error}"
    return result


async def benchmark(base_url: str, model: str, requests: list[SampleRequest], request_rate: float = math.inf, burstiness: float = 1.0,
                    max_concurrency: int | None = None, ignore_eos: bool = True, seed: int = 0, endpoint: str = "/v1/completions",
                    api_key: str | None = None, progress=None) -> tuple[list[RequestResult], float]:
    """Send ``requests`` to ``base_url + endpoint`` (streaming completions), arrivals as
    :func:`arrival_gaps` says; returns each request's result and the benchmark's duration, s."""
    import httpx

    gaps = arrival_gaps(len(requests), request_rate, burstiness, seed)
    limit = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(max_connections=max_concurrency or len(requests), max_keepalive_connections=max_concurrency or len(requests))
    async with httpx.AsyncClient(timeout=httpx.Timeout(6 * 3600.0), limits=limits) as client:

        async def one(request: SampleRequest) -> RequestResult:
            if limit is None:
                result = await _send(client, base_url + endpoint, model, request, ignore_eos, headers)
            else:
                async with limit:
                    result = await _send(client, base_url + endpoint, model, request, ignore_eos, headers)
            if progress:
                progress()
            return result

        start = time.perf_counter()
        tasks = []
        for request, gap in zip(requests, gaps):
            if gap:
                await asyncio.sleep(gap)
            tasks.append(asyncio.create_task(one(request)))
        results = await asyncio.gather(*tasks)
        return list(results), time.perf_counter() - start


def calculate_metrics(results: list[RequestResult], duration_s: float, percentiles: list[float], selected: list[str]) -> dict:
    """vLLM's ``calculate_metrics``: counts, throughputs (per s) and mean / median / std / pN of the
    selected latencies, in ms (keys like ``mean_ttft_ms``, ``p99_itl_ms``)."""
    ok = [r for r in results if r.success]
    values = {
        "ttft": [r.ttft for r in ok],
        "tpot": [(r.latency - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1],
        "itl": [gap for r in ok for gap in r.itl],
        "e2el": [r.latency for r in ok],
    }
    total_input = sum(r.prompt_len for r in ok)
    total_output = sum(r.output_tokens for r in ok)
    out = {
        "duration": duration_s, "completed": len(ok), "failed": len(results) - len(ok),
        "total_input_tokens": total_input, "total_output_tokens": total_output,
        "request_throughput": len(ok) / duration_s, "output_throughput": total_output / duration_s,
        "total_token_throughput": (total_input + total_output) / duration_s,
        "errors": [r.error for r in results if not r.success][:10],
    }
    for name in selected:
        data = np.array(values[name] or [0.0]) * 1000
        out[f"mean_{name}_ms"] = float(np.mean(data))
        out[f"median_{name}_ms"] = float(np.median(data))
        out[f"std_{name}_ms"] = float(np.std(data))
        for p in percentiles:
            out[f"p{p:g}_{name}_ms"] = float(np.percentile(data, p))
    return out


def format_result(result: dict, percentiles: list[float], selected: list[str], max_concurrency: int | None, request_rate: float) -> str:
    """The result as ``vllm bench serve`` prints it."""
    lines = ["{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="=")]

    def row(label, value, fmt="{:<10.2f}"):
        lines.append("{:<40} ".format(label) + (fmt.format(value) if not isinstance(value, str) else f"{value:<10}"))

    row("Successful requests:", result["completed"], "{:<10}")
    if result["failed"]:
        row("Failed requests:", result["failed"], "{:<10}")
    row("Maximum request concurrency:", str(max_concurrency) if max_concurrency else "None")
    row("Request rate configured (RPS):", "inf" if math.isinf(request_rate) else f"{request_rate:.2f}")
    row("Benchmark duration (s):", result["duration"])
    row("Total input tokens:", result["total_input_tokens"], "{:<10}")
    row("Total generated tokens:", result["total_output_tokens"], "{:<10}")
    row("Request throughput (req/s):", result["request_throughput"])
    row("Output token throughput (tok/s):", result["output_throughput"])
    row("Total Token throughput (tok/s):", result["total_token_throughput"])
    for name in selected:
        lines.append("{s:{c}^{n}}".format(s=METRIC_TITLES[name], n=50, c="-"))
        short = name.upper()
        row(f"Mean {short} (ms):", result[f"mean_{name}_ms"])
        row(f"Median {short} (ms):", result[f"median_{name}_ms"])
        for p in percentiles:
            row(f"P{p:g} {short} (ms):", result[f"p{p:g}_{name}_ms"])
    lines.append("=" * 50)
    return "\n".join(lines)


def register_cli(sub) -> None:
    """Add ``bench-serve`` to ``python -m engine``'s sub-commands (``vllm bench serve``'s flags)."""
    p = sub.add_parser("bench-serve", help="load an OpenAI-compatible server (this lab's or vLLM's) and measure TTFT, TPOT, ITL, throughput")
    p.add_argument("--base-url", default=None, help="server URL (default: http://HOST:PORT)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--endpoint", default="/v1/completions", help="default: /v1/completions")
    p.add_argument("--model", default=None, help="the served model's name (default: the server's first, from /v1/models)")
    p.add_argument("--tokenizer", default=None, help="the tokenizer whose vocabulary the random prompts draw from (default: --model)")
    p.add_argument("--dataset-name", choices=["random"], default="random")
    p.add_argument("--num-prompts", type=int, default=100, help="requests to send (default: 100)")
    p.add_argument("--random-input-len", type=int, default=1024, help="prompt tokens (default: 1024)")
    p.add_argument("--random-output-len", type=int, default=128, help="output tokens (default: 128)")
    p.add_argument("--random-range-ratio", type=float, default=0.0, help="lengths uniform in [len*(1-r), len*(1+r)] (default: 0)")
    p.add_argument("--request-rate", type=float, default=math.inf, help="requests/s, Poisson arrivals (default: inf, all at once)")
    p.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of the arrival gaps; 1 = Poisson (default: 1)")
    p.add_argument("--max-concurrency", type=int, default=None, help="most requests in flight (default: no cap)")
    p.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=True,
                   help="every request generates its whole output length (default: on)")
    p.add_argument("--percentile-metrics", default="ttft,tpot,itl,e2el", help="of ttft, tpot, itl, e2el (default: all four)")
    p.add_argument("--metric-percentiles", default="50,90,99", help="percentiles to report (default: 50,90,99)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--api-key", default=None, help="sent as 'Authorization: Bearer KEY'")
    p.add_argument("--save-result", action="store_true", help="write the result as JSON (--result-filename)")
    p.add_argument("--result-filename", default=None, help="default: bench-serve-<model>-<time>.json")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=run_cli)


def run_cli(args) -> dict:
    import httpx

    base_url = (args.base_url or f"http://{args.host}:{args.port}").rstrip("/")
    selected = [m.strip() for m in args.percentile_metrics.split(",") if m.strip()]
    bad = [m for m in selected if m not in METRICS]
    if bad:
        raise ValueError(f"--percentile-metrics: unknown {bad}; choose from {', '.join(METRICS)}")
    percentiles = [float(p) for p in args.metric_percentiles.split(",")]
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    model = args.model
    if model is None:
        try:
            model = httpx.get(f"{base_url}/v1/models", headers=headers, timeout=30).json()["data"][0]["id"]
        except (httpx.HTTPError, KeyError, IndexError, ValueError) as error:
            raise OSError(f"cannot read the served model from {base_url}/v1/models ({error}); give --model") from None
    requests = random_dataset(args.num_prompts, args.random_input_len, args.random_output_len, args.random_range_ratio,
                              _vocab_size(args.tokenizer or model), args.seed)
    results, duration = asyncio.run(benchmark(base_url, model, requests, args.request_rate, args.burstiness, args.max_concurrency,
                                              args.ignore_eos, args.seed, args.endpoint, args.api_key))
    result = calculate_metrics(results, duration, percentiles, selected)
    result.update(model_id=model, base_url=base_url, num_prompts=args.num_prompts, request_rate=args.request_rate,
                  burstiness=args.burstiness, max_concurrency=args.max_concurrency, random_input_len=args.random_input_len,
                  random_output_len=args.random_output_len)
    print(json.dumps(result) if args.json else format_result(result, percentiles, selected, args.max_concurrency, args.request_rate))
    if args.save_result:
        name = args.result_filename or f"bench-serve-{model.replace('/', '_')}-{time.strftime('%Y%m%d-%H%M%S')}.json"
        with open(name, "w") as f:
            json.dump({k: (None if isinstance(v, float) and math.isinf(v) else v) for k, v in result.items()}, f, indent=2)
    return result


def _vocab_size(name: str) -> int:
    """The vocabulary size of ``name``'s tokenizer (a local directory, .gguf or hub id the lab can resolve)."""
    from transformers import AutoTokenizer

    from engine.model_executor.model_loader import resolve_model

    return len(AutoTokenizer.from_pretrained(resolve_model(name)))
