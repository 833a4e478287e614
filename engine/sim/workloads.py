"""Request workloads for the model-free simulator: lengths and arrival times, no text.

Two workloads also carry token ids, for prefix caching (``TOKEN_WORKLOADS``): "multiturn", chat
conversations replayed turn by turn, each turn resending the whole history (ShareGPT-like, as in
SGLang's multi-turn benchmarks), and "fewshot", prompts that begin with one of a few long few-shot
prefixes (SGLang's MMLU 5-shot). Their ids are synthetic (no vocabulary, no model): equal ids mean
equal tokens, which is all a prefix cache looks at.

The PagedAttention paper serves two traces (§6.1, Figure 11): ShareGPT (long conversations; mean
input 161.31 tokens, mean output 337.99) and Alpaca (short instructions; 19.31 and 58.45). We do not
ship the traces; instead each length is drawn from a long-tailed lognormal distribution whose
location is calibrated on the drawn sample so that the means after capping at ``max_model_len``
equal the paper's. Arrivals are all at time 0 (saturation) or a Poisson process.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class Request:
    """One simulated request.

    Attributes:
        arrival: arrival time in seconds from the start.
        prompt_len: prompt tokens (>= 1).
        output_len: tokens to generate (>= 1); the request ends at prompt_len + output_len tokens.
        token_ids: None (lengths only), or the prompt's ids then the output's, ``prompt_len +
            output_len`` of them (the token workloads: the output is the one the trace replays).
    """

    arrival: float
    prompt_len: int
    output_len: int
    token_ids: tuple[int, ...] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.prompt_len < 1 or self.output_len < 1:
            raise ValueError(f"prompt_len and output_len must be >= 1, got {self.prompt_len} and {self.output_len}")
        if not self.arrival >= 0 or math.isinf(self.arrival):
            raise ValueError(f"arrival must be a finite time >= 0 s, got {self.arrival}")
        if self.token_ids is not None and len(self.token_ids) != self.prompt_len + self.output_len:
            raise ValueError(f"token_ids must hold prompt_len + output_len = {self.prompt_len + self.output_len} ids, got {len(self.token_ids)}")


@dataclass(frozen=True)
class LengthSpec:
    """Target means (tokens, from the paper) and lognormal shapes (sigma of log length)."""

    mean_prompt: float
    mean_output: float
    sigma_prompt: float
    sigma_output: float


# The sigmas are our choice (the paper gives means and histograms, Figure 11): both traces are
# long-tailed, Alpaca's outputs relatively more so than its short, uniform instructions.
WORKLOADS = {
    "sharegpt": LengthSpec(mean_prompt=161.31, mean_output=337.99, sigma_prompt=1.0, sigma_output=0.9),
    "alpaca": LengthSpec(mean_prompt=19.31, mean_output=58.45, sigma_prompt=0.5, sigma_output=0.9),
    # Figure 16's translation task (WMT16 En-De, §6.4): the paper gives no lengths; one sentence in
    # and its translation out, ~32 tokens each, is our assumption. Used after a shared few-shot prefix.
    "translation": LengthSpec(mean_prompt=32.0, mean_output=32.0, sigma_prompt=0.5, sigma_output=0.5),
}


# The token workloads (module docstring). Lengths in tokens, our choices, stated here:
# multiturn: ShareGPT-like turns (a user message of mean 64 tokens, an answer of mean 160; ShareGPT's
#   conversations have 3-4 turns on average), a conversation ends at its drawn number of turns or
#   when the next turn would pass max_model_len; turn t + 1 arrives a think time (mean 5 s) after
#   turn t, conversations start as a Poisson process.
# fewshot: 4 tasks, each with its own few-shot prefix of 800 tokens; a question of mean 48 tokens,
#   an answer of mean 32; the task of each request drawn uniformly.
TOKEN_WORKLOADS = {
    "multiturn": dict(mean_user=64, mean_answer=160, mean_turns=4, think_s=5.0),
    "fewshot": dict(num_tasks=4, prefix_len=800, mean_question=48, mean_answer=32),
}


def make_workload(
    name: str,
    num_requests: int,
    seed: int = 0,
    max_model_len: int = 2048,
    request_rate: float | None = None,
) -> list[Request]:
    """Draw ``num_requests`` requests of a named workload.

    Args:
        name: "sharegpt", "alpaca" or "translation" (lengths), "multiturn" or "fewshot" (token ids).
        num_requests: how many (>= 1).
        seed: seeds a ``numpy.random.Generator``; the same seed gives the same requests.
        max_model_len: cap on prompt + output tokens (>= 2).
        request_rate: Poisson arrivals at this many requests per second; None = all at time 0.

    Returns:
        Requests sorted by arrival time.

    Raises:
        ValueError: on an unknown name, num_requests < 1, max_model_len < 2 or a rate <= 0.
    """
    if name not in WORKLOADS and name not in TOKEN_WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; choose from {', '.join([*WORKLOADS, *TOKEN_WORKLOADS])}")
    if num_requests < 1:
        raise ValueError(f"num_requests must be >= 1, got {num_requests}")
    if max_model_len < 2:
        raise ValueError(f"max_model_len must be >= 2 tokens, got {max_model_len}")
    if name == "multiturn":
        return multiturn_workload(num_requests, seed, max_model_len, request_rate, **TOKEN_WORKLOADS[name])
    if name == "fewshot":
        return fewshot_workload(num_requests, seed, max_model_len, request_rate, **TOKEN_WORKLOADS[name])
    spec = WORKLOADS[name]
    rng = np.random.default_rng(seed)
    prompt = _calibrated_lengths(rng.standard_normal(num_requests), spec.sigma_prompt, spec.mean_prompt, max_model_len - 1)
    output = _calibrated_lengths(rng.standard_normal(num_requests), spec.sigma_output, spec.mean_output, max_model_len - prompt)
    arrivals = poisson_arrivals(rng, num_requests, request_rate) if request_rate is not None else np.zeros(num_requests)
    return [Request(a, p, o) for a, p, o in zip(arrivals.tolist(), prompt.tolist(), output.tolist())]


def head_of_line_workload(long_prompt: int = 1500, num_short: int = 8, short_prompt: int = 50, output_len: int = 32,
                          long_arrival_s: float | None = None) -> list[Request]:
    """The head-of-line blocking demo (``engine/timeline.py`` draws who waits behind whom), in arrival order.

    ``long_arrival_s`` None: one long prompt, then ``num_short`` short ones, all at time 0 and queued in
    that order (queued prompts behind a long one). A time in seconds: the short ones at 0 and the long
    prompt at ``long_arrival_s``, when they are decoding: its prefill stalls their decodes unless it is
    chunked (the stall chunked prefill removes: Agrawal et al. 2023, Sarathi, §3; vLLM's chunked prefill).

    Raises:
        ValueError: a length < 1, ``num_short`` < 0 or a negative ``long_arrival_s``.
    """
    if num_short < 0:
        raise ValueError(f"num_short must be >= 0, got {num_short}")
    short = [Request(0.0, short_prompt, output_len) for _ in range(num_short)]
    if long_arrival_s is None:
        return [Request(0.0, long_prompt, output_len)] + short
    if long_arrival_s < 0:
        raise ValueError(f"long_arrival_s must be >= 0, got {long_arrival_s}")
    return short + [Request(float(long_arrival_s), long_prompt, output_len)]


def _lognormal(rng: np.random.Generator, mean: float, sigma: float = 0.8) -> int:
    """One length >= 1 from a lognormal of this mean."""
    return max(1, int(round(rng.lognormal(math.log(mean) - sigma * sigma / 2, sigma))))


def multiturn_workload(num_requests: int, seed: int, max_model_len: int, request_rate: float | None,
                       mean_user: int, mean_answer: int, mean_turns: int, think_s: float) -> list[Request]:
    """Conversations replayed turn by turn: turn t's prompt is every earlier message and the new
    user message; its output is the answer the next turn's prompt will contain. Lengths in tokens
    (lognormal around each mean), ``think_s`` the mean gap between turns (s); ``make_workload``'s
    "multiturn" gives them ``TOKEN_WORKLOADS``' values. Sorted by arrival; with ``request_rate``
    None all arrive at 0, first turns first."""
    rng = np.random.default_rng(seed)
    requests: list[Request] = []
    next_id, start = 0, 0.0
    while len(requests) < num_requests:
        turns = int(rng.geometric(1 / mean_turns))
        if request_rate is not None:
            start += float(rng.exponential(mean_turns / request_rate))  # conversations arrive at rate / turns
        history: list[int] = []
        arrival = start
        for _ in range(turns):
            user, answer = _lognormal(rng, mean_user), _lognormal(rng, mean_answer)
            if len(history) + user + answer > max_model_len or len(requests) == num_requests:
                break
            prompt = history + list(range(next_id, next_id + user))
            output = list(range(next_id + user, next_id + user + answer))
            next_id += user + answer
            requests.append(Request(arrival if request_rate is not None else 0.0, len(prompt), answer, tuple(prompt + output)))
            history = prompt + output
            arrival += float(rng.exponential(think_s))
    return sorted(requests, key=lambda r: r.arrival)


def fewshot_workload(num_requests: int, seed: int, max_model_len: int, request_rate: float | None,
                     num_tasks: int, prefix_len: int, mean_question: int, mean_answer: int) -> list[Request]:
    """Prompts that begin with one of ``num_tasks`` few-shot prefixes of ``prefix_len`` tokens, then
    a question of their own (lengths in tokens, lognormal around each mean)."""
    rng = np.random.default_rng(seed)
    prefix_len = min(prefix_len, max_model_len // 2)
    prefixes = [list(range(t * prefix_len, (t + 1) * prefix_len)) for t in range(num_tasks)]
    next_id = num_tasks * prefix_len
    arrivals = poisson_arrivals(rng, num_requests, request_rate) if request_rate is not None else np.zeros(num_requests)
    requests = []
    for arrival in arrivals:
        task = int(rng.integers(num_tasks))
        question = min(_lognormal(rng, mean_question), max_model_len - prefix_len - 1)
        answer = min(_lognormal(rng, mean_answer), max_model_len - prefix_len - question)
        ids = prefixes[task] + list(range(next_id, next_id + question + answer))
        next_id += question + answer
        requests.append(Request(float(arrival), prefix_len + question, answer, tuple(ids)))
    return requests


def poisson_arrivals(rng: np.random.Generator, num_requests: int, request_rate: float) -> np.ndarray:
    """Arrival times in seconds of a Poisson process of ``request_rate`` requests/s (> 0)."""
    if not request_rate > 0 or math.isinf(request_rate):
        raise ValueError(f"request_rate must be a finite number of requests/s > 0, got {request_rate}")
    return np.cumsum(rng.exponential(1.0 / request_rate, num_requests))


def _calibrated_lengths(z: np.ndarray, sigma: float, target_mean: float, cap) -> np.ndarray:
    """round(exp(mu + sigma * z)) clipped to [1, cap], with mu found by bisection so that the
    clipped sample's mean is the target (capping the tail would otherwise lower the mean)."""

    scaled = sigma * z
    buffer = np.empty_like(scaled)

    def lengths(mu: float) -> np.ndarray:  # float64 whole numbers, in one buffer reused by the 50 bisection steps
        np.add(scaled, mu, out=buffer)
        np.exp(buffer, out=buffer)
        np.rint(buffer, out=buffer)
        return np.clip(buffer, 1, cap, out=buffer)

    lo, hi = math.log(target_mean) - 4 * sigma * sigma - 2, math.log(target_mean) + 2
    for _ in range(50):
        mid = (lo + hi) / 2  # the mean of lengths below 2**53 is exact in float64: the same whatever their dtype
        lo, hi = (mid, hi) if lengths(mid).mean() < target_mean else (lo, mid)
    return lengths(hi).astype(np.int64)


def load_trace(path: str | Path) -> list[Request]:
    """Read a JSONL trace: one object per line with ``arrival`` (s), ``prompt_len``, ``output_len``.

    Raises:
        ValueError: on an empty trace, a line that is not JSON, a missing field or a bad value,
            naming the line.
    """
    requests = []
    for lineno, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            requests.append(Request(float(row["arrival"]), int(row["prompt_len"]), int(row["output_len"])))
        except KeyError as e:
            raise ValueError(f"{path}:{lineno}: missing field {e.args[0]!r} (need arrival, prompt_len, output_len)") from None
        except (ValueError, TypeError) as e:
            raise ValueError(f"{path}:{lineno}: {e}") from None
    if not requests:
        raise ValueError(f"{path}: empty trace (no requests)")
    return sorted(requests, key=lambda r: r.arrival)
