"""``python -m engine bench-serve``: load an OpenAI-compatible server and measure it, with the
conventions of ``vllm bench serve`` (its flags, its metrics, its printout).

Requests come from a dataset (engine/tools/serve_datasets.py: ``random``, ``sharegpt``,
``prefix_repetition``). They arrive as a Poisson process at ``--request-rate`` requests/s
(``--burstiness`` < 1 burstier, > 1 more regular: gamma-distributed gaps, as vLLM) or all at once
(``inf``), at most ``--max-concurrency`` at a time. Each request streams; the client times:

- TTFT, time to first token: request sent -> its first chunk (ms).
- ITL, inter-token latency: the gaps between its chunks (ms; one chunk per engine step).
- TPOT, time per output token: (e2e latency - TTFT) / (output tokens - 1), per request (ms).
- E2EL, end-to-end latency: request sent -> its last chunk (ms).

Output tokens are counted from the stream's usage chunk (``stream_options.include_usage``).
Goodput (``--goodput ttft:MS tpot:MS e2el:MS``, vLLM's): completed requests per second that met
every one of those service-level objectives.

Two more modes: ``--against vllm`` starts the lab's server and ``vllm serve`` with equal settings and
drives both with the same trace at each of ``--request-rates`` (engine/tools/bench_serve_vllm.py);
``--predict`` runs the simulator, with the step-time model ``python -m engine calibrate`` fitted
here, on the trace the server was given and prints its prediction beside the measurement
(engine/sim/online.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from engine.tools.serve_datasets import DATASETS, SampleRequest, prefix_repetition_dataset, random_dataset, sharegpt_dataset

METRICS = ("ttft", "tpot", "itl", "e2el")
METRIC_TITLES = {"ttft": "Time to First Token", "tpot": "Time per Output Token (excl. 1st token)", "itl": "Inter-token Latency",
                 "e2el": "End-to-end Latency"}
GOODPUT_METRICS = ("ttft", "tpot", "e2el")

__all__ = ["SampleRequest", "RequestResult", "random_dataset", "arrival_gaps", "benchmark", "calculate_metrics", "parse_goodput"]


@dataclass
class RequestResult:
    """What the client measured of one request (vLLM's ``RequestFuncOutput``); times in seconds.

    Attributes:
        start_time: when it was sent, s after the benchmark's start.
        text: the streamed text, joined; token_ids: the streamed ``token_ids`` joined (servers that
            return them, asked with ``return_token_ids``), else None.
    """

    success: bool = False
    prompt_len: int = 0
    output_tokens: int = 0
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    latency: float = 0.0
    error: str = ""
    start_time: float = 0.0
    text: str = ""
    token_ids: list[int] | None = None


def arrival_gaps(num_requests: int, request_rate: float, burstiness: float, seed: int) -> list[float]:
    """Seconds between request arrivals: 0 for ``request_rate`` = inf; else gamma-distributed with
    mean ``1 / request_rate`` and shape ``burstiness`` (1 = exponential: a Poisson process)."""
    if math.isinf(request_rate):
        return [0.0] * num_requests
    if request_rate <= 0 or burstiness <= 0:
        raise ValueError(f"request-rate and burstiness must be > 0, got {request_rate} and {burstiness}")
    rng = np.random.default_rng(seed + 1)
    return list(rng.gamma(shape=burstiness, scale=1 / (request_rate * burstiness), size=num_requests))


def parse_goodput(values: list[str] | None) -> dict[str, float]:
    """``["ttft:500", "tpot:50"]`` -> {"ttft": 500.0, "tpot": 50.0} (ms), vLLM's ``--goodput``.

    Raises:
        ValueError: a pair that is not NAME:MS, a name not in ttft, tpot, e2el, or a value < 0.
    """
    slos = {}
    for value in values or []:
        name, sep, ms = value.partition(":")
        if not sep or name not in GOODPUT_METRICS:
            raise ValueError(f"--goodput: {value!r} must be NAME:MS with NAME one of {', '.join(GOODPUT_METRICS)}")
        try:
            slos[name] = float(ms)
        except ValueError:
            raise ValueError(f"--goodput: {value!r}: {ms!r} is not a number of milliseconds") from None
        if slos[name] < 0:
            raise ValueError(f"--goodput: {value!r}: a service-level objective must be >= 0 ms")
    return slos


async def _send(client, url: str, model: str, request: SampleRequest, ignore_eos: bool, headers: dict,
                return_token_ids: bool, origin: float) -> RequestResult:
    result = RequestResult(prompt_len=request.prompt_len)
    body = {"model": model, "prompt": request.prompt, "max_tokens": request.output_len, "temperature": 0.0,
            "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": ignore_eos}
    if return_token_ids:
        body["return_token_ids"] = True
        result.token_ids = []
    start = last = time.perf_counter()
    result.start_time = start - origin
    first = True
    try:
        async with client.stream("POST", url, json=body, headers=headers) as response:
            if response.status_code != 200:
                result.error = f"HTTP {response.status_code}: {(await response.aread()).decode(errors='replace')[:200]}"
                return result
            async for line in response.aiter_lines():
                if not line.startswith("data:") or line.strip() == "data: [DONE]":
                    continue
                chunk = json.loads(line[5:])
                if "error" in chunk:
                    result.error = chunk["error"].get("message", str(chunk["error"]))
                    return result
                now = time.perf_counter()
                if chunk.get("choices"):  # a chunk of the completion (its text may be empty: vLLM's rule)
                    choice = chunk["choices"][0]
                    if first:
                        result.ttft = now - start
                        first = False
                    else:
                        result.itl.append(now - last)
                    last = now
                    result.text += choice.get("text") or ""
                    if result.token_ids is not None:
                        result.token_ids += choice.get("token_ids") or []
                if chunk.get("usage"):
                    result.output_tokens = chunk["usage"]["completion_tokens"]
            if first:
                result.error = "the stream ended without a chunk of the completion"
                return result
            result.latency = last - start
            result.success = True
    except Exception as error:  # a failed request is counted, not fatal
        result.error = f"{type(error).__name__}: {error}"
    return result


async def benchmark(base_url: str, model: str, requests: list[SampleRequest], request_rate: float = math.inf, burstiness: float = 1.0,
                    max_concurrency: int | None = None, ignore_eos: bool = True, seed: int = 0, endpoint: str = "/v1/completions",
                    api_key: str | None = None, progress=None, return_token_ids: bool = False) -> tuple[list[RequestResult], float]:
    """Send ``requests`` to ``base_url + endpoint`` (streaming completions, greedy), arrivals as
    :func:`arrival_gaps` says; returns each request's result (in request order) and the
    benchmark's duration, s. ``return_token_ids``: ask for vLLM's ``return_token_ids`` (each
    result then has its ``token_ids``)."""
    import httpx

    gaps = arrival_gaps(len(requests), request_rate, burstiness, seed)
    limit = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(max_connections=max_concurrency or len(requests), max_keepalive_connections=max_concurrency or len(requests))
    async with httpx.AsyncClient(timeout=httpx.Timeout(6 * 3600.0), limits=limits) as client:
        start = time.perf_counter()

        async def one(request: SampleRequest) -> RequestResult:
            if limit is None:
                result = await _send(client, base_url + endpoint, model, request, ignore_eos, headers, return_token_ids, start)
            else:
                async with limit:
                    result = await _send(client, base_url + endpoint, model, request, ignore_eos, headers, return_token_ids, start)
            if progress:
                progress()
            return result

        tasks = []
        for request, gap in zip(requests, gaps):
            if gap:
                await asyncio.sleep(gap)
            tasks.append(asyncio.create_task(one(request)))
        results = await asyncio.gather(*tasks)
        return list(results), time.perf_counter() - start


def calculate_metrics(results: list[RequestResult], duration_s: float, percentiles: list[float], selected: list[str],
                      goodput: dict[str, float] | None = None) -> dict:
    """vLLM's ``calculate_metrics``: counts, throughputs (per s) and mean / median / std / pN of the
    selected latencies, in ms (keys like ``mean_ttft_ms``, ``p99_itl_ms``); with ``goodput``
    (metric -> SLO in ms) ``request_goodput``: completed requests per s that met every SLO."""
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
    if goodput:
        good = sum(1 for r in ok if _meets(r, goodput))
        out["goodput_slos_ms"] = dict(goodput)
        out["request_goodput"] = good / duration_s
    for name in selected:
        data = np.array(values[name] or [0.0]) * 1000
        out[f"mean_{name}_ms"] = float(np.mean(data))
        out[f"median_{name}_ms"] = float(np.median(data))
        out[f"std_{name}_ms"] = float(np.std(data))
        for p in percentiles:
            out[f"p{p:g}_{name}_ms"] = float(np.percentile(data, p))
    return out


def predict_results(results: list[RequestResult], requests: list[SampleRequest], settings: dict) -> dict:
    """The simulator's prediction of the requests that completed, each arriving when it was sent,
    beside their measurement (:func:`engine.sim.online.compare_prediction`). A failed request is
    left out of both: one the server refused (429, 400) never reached its engine.

    Raises:
        ValueError: no request completed.
    """
    from engine.sim.online import compare_prediction, predict_trace

    done = [i for i, r in enumerate(results) if r.success]
    if not done:
        raise ValueError("--predict: no request completed, nothing to compare")
    ok = [results[i] for i in done]
    prediction = predict_trace([r.start_time for r in ok], [requests[i].prompt_len for i in done], [requests[i].output_len for i in done], **settings)
    return compare_prediction(prediction, latencies(ok)) | {"failed_left_out": len(results) - len(done)}


def latencies(results: list[RequestResult]) -> dict[str, list[float | None]]:
    """Per request, in order: "ttft", "tpot", "e2el" in seconds (None: failed; TPOT None for one token)."""
    return {
        "ttft": [r.ttft if r.success else None for r in results],
        "tpot": [(r.latency - r.ttft) / (r.output_tokens - 1) if r.success and r.output_tokens > 1 else None for r in results],
        "e2el": [r.latency if r.success else None for r in results],
    }


def _meets(r: RequestResult, slos: dict[str, float]) -> bool:
    """Whether one completed request met every SLO (ms); TPOT of a one-token output is 0 (vLLM's rule)."""
    measured = {"ttft": r.ttft, "tpot": (r.latency - r.ttft) / (r.output_tokens - 1) if r.output_tokens > 1 else 0.0, "e2el": r.latency}
    return all(1000 * measured[name] <= slo for name, slo in slos.items())


def format_result(result: dict, percentiles: list[float], selected: list[str], max_concurrency: int | None, request_rate: float) -> str:
    """The result as ``vllm bench serve`` prints it."""
    lines = ["{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="=")]

    def row(label, value, fmt="{:<10.2f}"):
        lines.append("{:<40} ".format(label) + (fmt.format(value) if not isinstance(value, str) else f"{value:<10}"))

    if "isa" in result:
        from engine.cpu.ops import describe_isa

        row("CPU ISA (this machine's):", describe_isa(result["isa"]).removeprefix("ISA "))
    row("Successful requests:", result["completed"], "{:<10}")
    if result["failed"]:
        row("Failed requests:", result["failed"], "{:<10}")
    row("Maximum request concurrency:", str(max_concurrency) if max_concurrency else "None")
    row("Request rate configured (RPS):", "inf" if math.isinf(request_rate) else f"{request_rate:.2f}")
    row("Benchmark duration (s):", result["duration"])
    row("Total input tokens:", result["total_input_tokens"], "{:<10}")
    row("Total generated tokens:", result["total_output_tokens"], "{:<10}")
    row("Request throughput (req/s):", result["request_throughput"])
    if "request_goodput" in result:
        row("Request goodput (req/s):", result["request_goodput"])
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


def register_cli(sub, func=None) -> None:
    """Add ``bench-serve`` to ``python -m engine``'s sub-commands (``vllm bench serve``'s flags).
    ``func``: what runs the parsed arguments (default :func:`run_cli`; ``engine/cli.py`` passes one
    that sends ``--against vllm`` to ``engine/tools/bench_serve_vllm.py``)."""
    p = sub.add_parser("bench-serve", help="load an OpenAI-compatible server (this lab's or vLLM's) and measure TTFT, TPOT, ITL, throughput")
    p.add_argument("--base-url", default=None, help="server URL (default: http://HOST:PORT)")
    p.add_argument("--host", default="127.0.0.1", help="the server's address, without --base-url")
    p.add_argument("--port", type=int, default=8000, help="the server's port, without --base-url")
    p.add_argument("--endpoint", default="/v1/completions", help="default: /v1/completions")
    p.add_argument("--model", default=None, help="the served model's name (default: the server's first, from /v1/models)")
    p.add_argument("--tokenizer", default=None, help="the tokenizer the datasets draw from (default: --model)")
    p.add_argument("--dataset-name", choices=DATASETS, default="random", help="default: random")
    p.add_argument("--num-prompts", type=int, default=100, help="requests to send (default: 100)")
    p.add_argument("--random-input-len", type=int, default=1024, help="random: prompt tokens (default: 1024)")
    p.add_argument("--random-output-len", type=int, default=128, help="random: output tokens (default: 128)")
    p.add_argument("--random-range-ratio", type=float, default=0.0, help="random: lengths uniform in [len*(1-r), len*(1+r)] (default: 0)")
    p.add_argument("--sharegpt-output-len", type=int, default=None, help="sharegpt: every request's output length (default: drawn)")
    p.add_argument("--prefix-repetition-prefix-len", type=int, default=256, help="prefix_repetition: prefix tokens (default: 256)")
    p.add_argument("--prefix-repetition-suffix-len", type=int, default=256, help="prefix_repetition: suffix tokens (default: 256)")
    p.add_argument("--prefix-repetition-num-prefixes", type=int, default=10, help="prefix_repetition: distinct prefixes (default: 10)")
    p.add_argument("--prefix-repetition-output-len", type=int, default=128, help="prefix_repetition: output tokens (default: 128)")
    p.add_argument("--request-rate", type=float, default=math.inf, help="requests/s, Poisson arrivals (default: inf, all at once)")
    p.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of the arrival gaps; 1 = Poisson (default: 1)")
    p.add_argument("--max-concurrency", type=int, default=None, help="most requests in flight (default: no cap)")
    p.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=True,
                   help="every request generates its whole output length (default: on here, unlike `vllm bench serve`, "
                        "whose default is off: --no-ignore-eos lets requests stop at EOS as vLLM's does)")
    p.add_argument("--return-token-ids", action="store_true", help="ask for vLLM's return_token_ids and keep each request's token ids")
    p.add_argument("--percentile-metrics", default="ttft,tpot,itl,e2el", help="of ttft, tpot, itl, e2el (default: all four)")
    p.add_argument("--metric-percentiles", default="50,90,99", help="percentiles to report (default: 50,90,99)")
    p.add_argument("--goodput", nargs="+", default=None, metavar="NAME:MS",
                   help="service-level objectives, e.g. ttft:1000 tpot:100 (ms; of ttft, tpot, e2el): adds request goodput")
    p.add_argument("--seed", type=int, default=0, help="seeds the dataset's prompts and the arrival times")
    p.add_argument("--api-key", default=None, help="sent as 'Authorization: Bearer KEY'")
    p.add_argument("--save-result", action="store_true", help="write the result as JSON (--result-filename)")
    p.add_argument("--result-filename", default=None, help="default: bench-serve-<model>-<time>.json")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    g = p.add_argument_group("the servers' settings (--against vllm starts both with them; --predict simulates them)")
    g.add_argument("--against", choices=["vllm"], default=None,
                   help="start the lab's server and `vllm serve` on the same model with equal settings; drive both with the same trace")
    g.add_argument("--request-rates", default="1,4,inf", help="--against: the rates to run, requests/s (default: 1,4,inf)")
    g.add_argument("--predict", action="store_true",
                   help="the simulator's prediction of the same trace (the step-time model of `python -m engine calibrate`) beside the measurement")
    g.add_argument("--vllm-python", default=None, help="--against: an interpreter that imports vLLM (default: the venv of `python -m engine vllm setup`)")
    g.add_argument("--block-size", type=int, default=None, help="KV block size (default: 16; 32 with --against vllm, vLLM's CPU minimum)")
    g.add_argument("--num-gpu-blocks-override", type=int, default=None, help="KV pool in blocks (default: serve's, 512 blocks of 16 slots)")
    g.add_argument("--max-num-seqs", type=int, default=32, help="most requests running in one step (default: 32, serve's)")
    g.add_argument("--max-model-len", type=int, default=2048, help="default: 2048")
    g.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=False,
                   help="--against: automatic prefix caching on both servers (default: off on both)")
    p.set_defaults(func=func or run_cli)


def parse_percentiles(args) -> tuple[list[str], list[float]]:
    selected = [m.strip() for m in args.percentile_metrics.split(",") if m.strip()]
    bad = [m for m in selected if m not in METRICS]
    if bad:
        raise ValueError(f"--percentile-metrics: unknown {bad}; choose from {', '.join(METRICS)}")
    try:
        percentiles = [float(p) for p in args.metric_percentiles.split(",")]
    except ValueError:
        raise ValueError(f"--metric-percentiles: {args.metric_percentiles!r} is not a comma-separated list of numbers") from None
    return selected, percentiles


def make_dataset(args, tokenizer_name: str, max_model_len: int) -> list[SampleRequest]:
    """The requests of ``args.dataset_name`` (the flags above), drawn with ``args.seed``."""
    if args.num_prompts < 1:
        raise ValueError(f"--num-prompts must be >= 1, got {args.num_prompts}")
    tokenizer = _tokenizer(tokenizer_name)
    if args.dataset_name == "sharegpt":
        return sharegpt_dataset(args.num_prompts, tokenizer, max_model_len, args.seed, args.sharegpt_output_len)
    if args.dataset_name == "prefix_repetition":
        return prefix_repetition_dataset(args.num_prompts, args.prefix_repetition_prefix_len, args.prefix_repetition_suffix_len,
                                         args.prefix_repetition_num_prefixes, args.prefix_repetition_output_len, len(tokenizer), args.seed)
    return random_dataset(args.num_prompts, args.random_input_len, args.random_output_len, args.random_range_ratio, len(tokenizer), args.seed)


def run_cli(args) -> dict:
    import httpx

    selected, percentiles = parse_percentiles(args)
    goodput = parse_goodput(args.goodput)
    if args.against:
        raise ValueError("--against vllm runs through `python -m engine bench-serve` (engine/tools/bench_serve_vllm.run_cli)")
    base_url = (args.base_url or f"http://{args.host}:{args.port}").rstrip("/")
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    try:
        served = httpx.get(f"{base_url}/v1/models", headers=headers, timeout=30).json()["data"][0]
    except (httpx.HTTPError, KeyError, IndexError, ValueError) as error:
        if args.model is None:
            raise OSError(f"cannot read the served model from {base_url}/v1/models ({error}); give --model") from None
        served = {}
    model = args.model or served["id"]
    if args.predict:  # before any request: a wrong pool would waste the whole load
        _check_server(base_url, server_settings(args), headers)
    requests = make_dataset(args, args.tokenizer or model, served.get("max_model_len") or args.max_model_len)
    results, duration = asyncio.run(benchmark(base_url, model, requests, args.request_rate, args.burstiness, args.max_concurrency,
                                              args.ignore_eos, args.seed, args.endpoint, args.api_key,
                                              return_token_ids=args.return_token_ids))
    result = calculate_metrics(results, duration, percentiles, selected, goodput)
    result.update(model_id=model, base_url=base_url, dataset_name=args.dataset_name, num_prompts=args.num_prompts,
                  request_rate=args.request_rate, burstiness=args.burstiness, max_concurrency=args.max_concurrency,
                  isa=_isa_report())
    if args.dataset_name == "random":
        result.update(random_input_len=args.random_input_len, random_output_len=args.random_output_len)
    if args.predict:
        settings = server_settings(args)
        result["prediction"] = predict_results(results, requests, settings)
        result["server_settings"] = settings
        result["requests"] = [{"start_time": r.start_time, "prompt_len": q.prompt_len, "output_len": q.output_len, "success": r.success,
                               "ttft": r.ttft, "latency": r.latency, "output_tokens": r.output_tokens} for r, q in zip(results, requests)]
    if args.return_token_ids:
        result["token_ids"] = [r.token_ids for r in results]
    if args.json:
        print(json.dumps(_jsonable(result)))
    else:
        print(format_result(result, percentiles, selected, args.max_concurrency, args.request_rate))
        if "prediction" in result:
            from engine.sim.online import format_prediction

            print(format_prediction(result["prediction"]))
    if args.save_result:
        name = args.result_filename or f"bench-serve-{model.replace('/', '_')}-{time.strftime('%Y%m%d-%H%M%S')}.json"
        with open(name, "w") as f:
            json.dump(_jsonable(result), f, indent=2)
    return result


def _isa_report() -> dict:
    """This machine's CPU ISA (:func:`engine.cpu.ops.isa_report`): the server's where it runs here (a local base_url)."""
    from engine.cpu.ops import isa_report  # imports torch: only once a run has finished

    return isa_report()


def server_settings(args) -> dict:
    """The KV pool and scheduler limits the flags describe, with ``serve``'s defaults (its engine's:
    512 blocks of 16 slots, 32 sequences, a 2048-token budget), as :func:`engine.sim.online.predict_trace` takes them."""
    block_size = args.block_size or 16
    num_blocks = args.num_gpu_blocks_override or 512 * 16 // block_size
    return {"block_size": block_size, "num_blocks": num_blocks, "max_num_seqs": args.max_num_seqs,
            "max_model_len": args.max_model_len, "max_num_batched_tokens": max(2048, args.max_model_len)}


def _check_server(base_url: str, settings: dict, headers: dict) -> None:
    """Where the server is the lab's (it answers ``/lab/snapshot``): its KV pool must be the one
    simulated, and a prefix cache on it, which the simulation does not model, is warned about on stderr.

    Raises:
        ValueError: the pools differ (naming --num-gpu-blocks-override).
    """
    import httpx

    try:
        header = httpx.get(f"{base_url}/lab/snapshot", headers=headers, timeout=10).json()
        served, caching = int(header["engine"]["num_blocks"]), bool(header["settings"].get("enable_prefix_caching"))
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return  # not a lab server: nothing to check
    if served != settings["num_blocks"]:
        raise ValueError(f"--predict: the server's KV pool has {served} blocks, the simulation {settings['num_blocks']}: give "
                         "the server's --block-size and --num-gpu-blocks-override")
    if caching:
        print("warning: --predict: the server caches prefixes and the simulation does not; prompts that share a prefix "
              "will be served faster than predicted (start the server with --no-enable-prefix-caching to compare)",
              file=sys.stderr, flush=True)


def _jsonable(value):
    if isinstance(value, float) and math.isinf(value):
        return None
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return value


def _tokenizer(name: str):
    """The tokenizer of ``name`` (a local directory, .gguf or hub id the lab can resolve)."""
    from engine.model_executor.model_loader import load_tokenizer, resolve_model

    return load_tokenizer(resolve_model(name))
