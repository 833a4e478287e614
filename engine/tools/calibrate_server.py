"""``python -m engine calibrate --server URL``: fit the step-time model on a running lab server's own steps.

``python -m engine calibrate`` times the engine alone, in one process. A server's step also carries
what happens around it: the event loop taking each step's text and streaming it over HTTP, and, on
a small machine, the clients themselves sharing the cores with the engine's threads. Fitted offline,
the model predicted the server's time per output token 25-40 % low under a ShareGPT-like load.

So this fits the same model (engine/tools/calibrate.py: the same features, non-negative least
squares) on the server's steps while it serves a calibration load:

1. it follows the lab's step stream (``GET /lab/steps``, engine/entrypoints/lab.py), which carries
   every step's scheduled requests (phase, new tokens, context length) and its time inside the
   engine (``timings_ms["total"]``), and notes when each step arrived;
2. it sends the load with ``bench-serve``'s client (streaming completions of random token ids):
   requests with prompts of 32-768 and outputs of 64-384 tokens, at most 1, 2, 4, 8 and then 16 in
   flight, so that the steps cover batch sizes and context lengths of a ShareGPT-like load;
3. a step's time is the time from the previous step's arrival to its own, when the engine went
   straight on (that includes the server's work between steps); after an idle pause, its time in
   the engine plus the median time between steps.

The load is not any trace the prediction is later checked on (``bench-serve --predict`` sends its
own). The fit is kept where ``python -m engine calibrate`` keeps its own (the "this-machine" preset).
"""

from __future__ import annotations

import asyncio
import json
import platform
import threading
import time

import numpy as np

CONCURRENCY = (1, 2, 4, 8, 16)  # requests in flight, one round each
REQUESTS_PER_SLOT = 2  # each round sends this many requests per slot of concurrency
PROMPT_LENS = (32, 768)  # uniform, tokens
OUTPUT_LENS = (64, 384)
IDLE_GAP_S = 0.05  # more than this between a step's end in the engine and the next step's: the engine idled


def calibrate_server(base_url: str, api_key: str | None = None, save: bool = True, seed: int = 0, progress=print) -> dict:
    """Fit the step-time model on the steps of the lab server at ``base_url`` while it serves the
    calibration load (see the module's docstring); returns the figures as ``calibrate`` does.

    Raises:
        ValueError: the server cannot be reached or names no model, has no step stream (not a lab
            server), failed a calibration request, or ran too few steps to fit.
    """
    import httpx

    from engine.sim.cost_model import StepShape
    from engine.tools.bench_serve import benchmark
    from engine.tools.calibrate import fit_cost_model, prediction_error, save_calibration
    from engine.tools.serve_datasets import SampleRequest

    base_url = base_url.rstrip("/")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        answer = httpx.get(f"{base_url}/v1/models", headers=headers, timeout=30)
        answer.raise_for_status()
        models = answer.json()["data"][0]
    except (httpx.HTTPError, ValueError, KeyError, IndexError) as error:
        raise ValueError(f"cannot ask the server at {base_url} for its model (GET /v1/models): {error}") from error
    follower = _StepFollower(base_url, headers)
    follower.start()
    header = follower.wait_for_hello()
    engine = header["engine"]
    block_size = engine["block_size"]

    rng = np.random.default_rng(seed)
    vocab = 32_000  # token ids below the vocabulary of any model the lab serves
    for concurrency in CONCURRENCY:
        n = REQUESTS_PER_SLOT * concurrency
        progress(f"calibration load: {n} requests, at most {concurrency} in flight")
        requests = []
        for _ in range(n):
            prompt_len, output_len = (int(rng.integers(lo, hi + 1)) for lo, hi in (PROMPT_LENS, OUTPUT_LENS))
            start = int(rng.integers(0, vocab))
            requests.append(SampleRequest([(start + j) % vocab for j in range(prompt_len)], prompt_len, output_len))
        results, _ = asyncio.run(benchmark(base_url, models["id"], requests, max_concurrency=concurrency, seed=seed,
                                           api_key=api_key))
        failed = [r.error for r in results if not r.success]
        if failed:
            raise ValueError(f"{len(failed)} calibration requests failed, e.g. {failed[0]}")
    time.sleep(0.5)  # the last step's event
    steps = follower.stop()
    if len(steps) < 50:
        raise ValueError(f"the server's step stream gave {len(steps)} steps; a fit needs more")

    arrivals = np.array([t for t, _, _ in steps])
    inside = np.array([ms / 1e3 for _, _, ms in steps])
    gaps = np.diff(arrivals, prepend=np.nan)
    between = gaps - inside  # the server's time between one step's end in the engine and the next
    straight_on = ~np.isnan(between) & (between < IDLE_GAP_S)
    overhead = float(np.median(between[straight_on])) if straight_on.any() else 0.0
    seconds = np.where(straight_on, gaps, inside + overhead).tolist()
    shapes = [StepShape.of_batch([(r["num_tokens"], r["context_len"]) for r in scheduled if r["phase"] == "prefill"],
                                 [r["context_len"] for r in scheduled if r["phase"] == "decode"], block_size)
              for _, scheduled, _ in steps]
    fitted = fit_cost_model(shapes, seconds, name="this machine (fitted on the server's steps)")
    result = {
        "cost_model": fitted.to_json(), "fit": prediction_error(fitted, shapes, seconds),
        "server": {"url": base_url, "steps": len(steps), "between_steps_ms": 1e3 * overhead,
                   "engine_share": float(inside.sum() / np.sum(seconds))},
        "kv_slots": engine["num_blocks"] * block_size, "max_model_len": models.get("max_model_len"),
        "description": f"{engine['model_name']} served at {base_url} ({platform.machine()}), fitted on the server's own steps",
        "machine": {"platform": platform.platform()},
    }
    if save:
        save_calibration(result)
    return result


class _StepFollower:
    """Reads ``/lab/steps`` on a thread: the hello header, then (arrival time, scheduled, ms in the engine) per step."""

    def __init__(self, base_url: str, headers: dict):
        self.base_url, self.headers = base_url, headers
        self.steps: list[tuple[float, list, float]] = []
        self.hello: dict | None = None
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._hello = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lab-steps", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def wait_for_hello(self, timeout_s: float = 30) -> dict:
        if not self._hello.wait(timeout_s) or self.hello is None:
            raise ValueError(f"{self.base_url}/lab/steps sent no hello: is it a lab server (python -m engine serve)? {self.error or ''}")
        return self.hello

    def stop(self) -> list[tuple[float, list, float]]:
        self._stop.set()
        self._thread.join(5)
        return list(self.steps)

    def _run(self) -> None:
        import httpx

        try:
            with httpx.stream("GET", f"{self.base_url}/lab/steps", headers=self.headers, timeout=httpx.Timeout(30, read=None)) as response:
                response.raise_for_status()
                event = None
                for line in response.iter_lines():
                    if self._stop.is_set():
                        return
                    if line.startswith("event:"):
                        event = line.split(":", 1)[1].strip()
                    elif line.startswith("data:"):
                        now = time.monotonic()
                        data = json.loads(line[5:])
                        if event == "hello":
                            self.hello = data
                            self._hello.set()
                        elif event == "step" and data["scheduled"]:
                            self.steps.append((now, data["scheduled"], data["timings_ms"]["total"]))
        except Exception as error:  # reported by wait_for_hello, or as too few steps
            self.error = error
            self._hello.set()


def format_server_calibration(r: dict) -> str:
    from engine.tools.calibrate import format_calibration

    s = r["server"]
    return (format_calibration(r) + f"\nserver: {s['steps']} steps followed; {s['between_steps_ms']:.2f} ms between steps "
            f"(median); the engine's share of the step time {s['engine_share']:.1%}")
