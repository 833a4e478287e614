"""Goodput of prefill/decode disaggregation at production scale, on the model-free simulator.

DistServe (Zhong et al., OSDI 2024) judges a serving system by its **goodput**: the highest
request rate at which a target share of the requests (90 % here by default) meets *both* a
time-to-first-token SLO and a time-per-output-token SLO. Its **SLO attainment** is that share at one
rate; plotted against the rate it falls from 1 as the load grows. Colocating prefill and decode on
one instance couples the two latencies: a long prefill in a step delays every decode of that step
(TPOT), and decodes in a step delay the prefill (TTFT). Disaggregation gives each phase its own
instances, **xPyD**: x prefill instances and y decode instances; Splitwise (Patel et al., ISCA 2024)
names them the prompt and token machines. Between them each request's KV cache crosses a link.

What runs here, one instance = one model replica (its GPUs, its own KV pool), each on the
simulator's own stepping (``engine/sim/simulator.py``: the engine's scheduler and allocator, the
roofline step times of ``engine/sim/cost_model.py``):

- **colocated, N replicas**: requests go round-robin in arrival order to N instances that each
  prefill and decode (``kv_role="kv_both"``), with the engine's scheduling (whole prompts, or chunked
  prefill);
- **xPyD**: requests go round-robin to the x prefill instances (``kv_role="kv_producer"``: a request
  ends after its prefill, whose step samples the first token). Its KV then moves to a decode
  instance, taking ``kv_bytes_per_token x prompt tokens / link bandwidth`` (:func:`transfer_s`), and
  arrives there (round-robin, in the order the transfers end) with its prompt and first token
  computed: the decode instance (``kv_role="kv_consumer"``) admits it with one token to compute over
  its context and decodes the rest.

Per request: **TTFT** = the first token's arrival at the client - the request's arrival; colocated,
the end of its prefill step; disaggregated, the end of its prefill step plus the transfer (the first
token travels with the handover, as through the lab's ``serve-disagg`` proxy). **TPOT** = (finish -
first token) / (output tokens - 1), DistServe's per-request mean. A request that was never served
(it could not fit) meets no SLO.

Not modelled: the transfer's wait for free blocks on the decode instance (a request's KV arrives and
waits in the decode instance's queue as if buffered), contention between transfers on a shared link,
overlap of the transfer with the prefill's layers (SGLang's push), load-aware dispatch (both sides
are round-robin), the all-reduces of tensor parallelism, and the decode instance's own choice of
batch size or parallelism (DistServe searches both; here every instance is the same replica).
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field, replace

import numpy as np

from engine.sim.cost_model import PS_PER_S
from engine.sim.simulator import SimulationConfig, _cyclic_gc_paused, _Run
from engine.sim.workloads import Request

# One-way bandwidth of the link a request's KV crosses, bytes/s (vendor figures).
LINKS: dict[str, float] = {
    "nvlink": 450e9,      # NVLink 4 (H100 SXM): 900 GB/s both ways between GPUs of one node
    "rdma-400g": 50e9,    # 400 Gb/s InfiniBand NDR / RoCE, one NIC per GPU (Splitwise's machines)
    "rdma-100g": 12.5e9,  # 100 Gb/s RDMA between nodes
    "pcie-5": 64e9,       # PCIe 5.0 x16 (through the host)
    "pcie-4": 32e9,       # PCIe 4.0 x16
}
DEFAULT_LINK = "rdma-100g"
DEFAULT_TARGET = 0.9  # DistServe's attainment goal: 90 % of requests within both SLOs


@dataclass(frozen=True)
class Deployment:
    """How many instances serve, and in which roles: ``num_prefill`` prefill and ``num_decode`` decode
    instances (xPyD), or ``num_colocated`` instances that do both. ``gpus_per_instance``: one replica's
    GPUs (its tensor-parallel size).

    Raises:
        ValueError: neither or both kinds given, or a count below 1.
    """

    num_prefill: int = 0
    num_decode: int = 0
    num_colocated: int = 0
    gpus_per_instance: int = 1

    def __post_init__(self) -> None:
        disagg = self.num_prefill or self.num_decode
        if bool(disagg) == bool(self.num_colocated) or (disagg and min(self.num_prefill, self.num_decode) < 1):
            raise ValueError("a deployment is x >= 1 prefill and y >= 1 decode instances, or N >= 1 colocated ones")
        if self.gpus_per_instance < 1 or min(self.num_prefill, self.num_decode, self.num_colocated) < 0:
            raise ValueError("instance and GPU counts must be >= 1")

    @classmethod
    def parse(cls, text: str, gpus_per_instance: int = 1) -> Deployment:
        """"1P1D", "2p1d" (xPyD) or "2" / "2C" (two colocated instances).

        Raises:
            ValueError: any other text.
        """
        m = re.fullmatch(r"\s*(\d+)\s*[pP]\s*(\d+)\s*[dD]\s*", text)
        if m:
            return cls(int(m.group(1)), int(m.group(2)), gpus_per_instance=gpus_per_instance)
        m = re.fullmatch(r"\s*(\d+)\s*[cC]?\s*", text)
        if m:
            return cls(num_colocated=int(m.group(1)), gpus_per_instance=gpus_per_instance)
        raise ValueError(f"{text!r} is not a deployment: write xPyD (e.g. 1P1D) or a count of colocated instances")

    @property
    def disaggregated(self) -> bool:
        return self.num_colocated == 0

    @property
    def num_instances(self) -> int:
        return self.num_prefill + self.num_decode + self.num_colocated

    @property
    def num_gpus(self) -> int:
        return self.num_instances * self.gpus_per_instance

    @property
    def label(self) -> str:
        return f"{self.num_prefill}P{self.num_decode}D" if self.disaggregated else f"{self.num_colocated}C"

    def equal_gpus(self) -> Deployment:
        """The colocated deployment with as many GPUs: x + y replicas for xPyD (DistServe compares per GPU)."""
        return Deployment(num_colocated=self.num_instances, gpus_per_instance=self.gpus_per_instance)


def transfer_s(prompt_tokens: int | np.ndarray, kv_bytes_per_token: float, link_bandwidth: float):
    """Seconds one request's KV takes from its prefill instance to its decode instance: the prompt's
    K and V (``kv_bytes_per_token`` bytes per token, all layers; per GPU when each GPU of a replica has its
    own link) over a link of ``link_bandwidth`` bytes/s one way.

    Raises:
        ValueError: a bandwidth <= 0 or negative bytes.
    """
    if not link_bandwidth > 0 or kv_bytes_per_token < 0:
        raise ValueError(f"need a link bandwidth > 0 B/s and KV bytes >= 0, got {link_bandwidth} and {kv_bytes_per_token}")
    return np.asarray(prompt_tokens, dtype=np.float64) * kv_bytes_per_token / link_bandwidth


@dataclass
class RequestTimes:
    """Per request, in the order given (seconds; NaN where it was not served): ``ttft_s``, ``tpot_s``
    (NaN for a one-token output), ``e2el_s``; ``transfer_s`` (0 colocated); ``prefill_tokens``: prompt
    tokens each kind of instance computed, {"prefill", "decode", "colocated"}."""

    ttft_s: np.ndarray
    tpot_s: np.ndarray
    e2el_s: np.ndarray
    transfer_s: np.ndarray
    prefill_tokens: dict[str, int] = field(default_factory=dict)


def serve(requests: list[Request], instance: SimulationConfig, deployment: Deployment, kv_bytes_per_token: float = 0.0,
          link_bandwidth: float = LINKS[DEFAULT_LINK]) -> RequestTimes:
    """Serve ``requests`` on ``deployment``, each instance a simulator run of ``instance`` (its KV pool,
    limits and ``cost_model``; its ``requests`` and ``kv_role`` are set here). Module docstring: what
    runs, and what is not modelled.

    Args:
        requests: the requests (arrivals in seconds).
        instance: one replica, a :class:`SimulationConfig` with a ``cost_model``.
        deployment: xPyD or N colocated.
        kv_bytes_per_token: bytes of one token's K and V that cross one link (disaggregated only).
        link_bandwidth: the link's bytes/s one way (:data:`LINKS`).

    Raises:
        ValueError: what :class:`SimulationConfig` refuses for an instance.
    """
    order = sorted(range(len(requests)), key=lambda i: requests[i].arrival)
    arrival = np.array([requests[i].arrival for i in order])
    output = np.array([requests[i].output_len for i in order])
    n = len(order)
    if deployment.disaggregated:
        first, finish, moved, tokens = _disaggregated(requests, order, instance, deployment, kv_bytes_per_token, link_bandwidth)
    else:
        first, finish, tokens = _spread([requests[i] for i in order], instance, deployment.num_colocated, "kv_both")
        moved = np.zeros(n)
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(output > 1, (finish - first) / np.maximum(output - 1, 1), np.nan)
    back = np.empty(n, dtype=np.int64)
    back[order] = np.arange(n)
    return RequestTimes((first - arrival)[back], tpot[back], (finish - arrival)[back], moved[back], tokens)


def _disaggregated(requests, order, instance, deployment, kv_bytes_per_token, link_bandwidth):
    by_arrival = [requests[i] for i in order]
    prefilled, _, prefill_tokens = _spread(by_arrival, instance, deployment.num_prefill, "kv_producer")
    moved = transfer_s(np.array([r.prompt_len for r in by_arrival]), kv_bytes_per_token, link_bandwidth)
    ready = prefilled + moved  # NaN where the prefill instance could not serve it
    served = np.flatnonzero(~np.isnan(ready))
    first, finish = np.full(len(order), np.nan), np.full(len(order), np.nan)
    first[served] = ready[served]
    # On the decode instance a request arrives with its prompt and its first token computed; a one-token output is done.
    handed = sorted(served, key=lambda i: ready[i])
    onward = [i for i in handed if by_arrival[i].output_len > 1]
    done_at_handover = [i for i in handed if by_arrival[i].output_len == 1]
    finish[done_at_handover] = ready[done_at_handover]
    decode_requests = [Request(float(ready[i]), by_arrival[i].prompt_len + 1, by_arrival[i].output_len - 1) for i in onward]
    decode_tokens = {"decode": 0}
    if onward:
        # A loaded prompt costs its step one token, so the token budget does not bound a decode instance's admissions.
        budget = max(instance.max_num_batched_tokens or 0, instance.max_num_seqs * instance.max_model_len)
        _, done, decode_tokens = _spread(decode_requests, replace(instance, max_num_batched_tokens=budget), deployment.num_decode,
                                         "kv_consumer")
        finish[onward] = done
    return first, finish, moved, {"prefill": prefill_tokens["prefill"], **decode_tokens}


_ROLE_NAMES = {"kv_both": "colocated", "kv_producer": "prefill", "kv_consumer": "decode"}


def _spread(requests: list[Request], instance: SimulationConfig, count: int, kv_role: str):
    """Deal ``requests`` (sorted by arrival) round-robin to ``count`` instances of ``kv_role``; returns each
    request's first-token and finish times (s, NaN if not served) and the prompt tokens they computed."""
    first, finish = np.full(len(requests), np.nan), np.full(len(requests), np.nan)
    computed = 0
    if kv_role != "kv_both" and instance.enable_chunked_prefill:  # chunking is the colocated replicas' remedy; split instances run whole prompts
        instance = replace(instance, enable_chunked_prefill=False, max_num_batched_tokens=max(2048, instance.max_model_len,
                                                                                            instance.max_num_batched_tokens or 0))
    for k in range(count):
        share = requests[k::count]
        if not share:
            continue
        run = _Run(replace(instance, requests=share, kv_role=kv_role, progress=False, record_steps=False), share)
        with _cyclic_gc_paused():
            run.run()
        computed += run.prefill_tokens_computed
        clock = run.clock  # its requests sorted by arrival, as given
        first[k::count] = np.where(clock.first_token >= 0, clock.first_token / PS_PER_S, np.nan)
        finish[k::count] = np.where(clock.finish >= 0, clock.finish / PS_PER_S, np.nan)
    return first, finish, {_ROLE_NAMES[kv_role]: computed}


# --- SLO attainment and goodput ----------------------------------------------------------------------


@dataclass(frozen=True)
class SLO:
    """DistServe's two latency targets (seconds) and the share of requests that must meet both."""

    ttft_s: float
    tpot_s: float
    target: float = DEFAULT_TARGET

    def __post_init__(self) -> None:
        if not (self.ttft_s > 0 and self.tpot_s > 0 and 0 < self.target <= 1):
            raise ValueError(f"SLOs must be > 0 s and the target share in (0, 1]; got {self.ttft_s}, {self.tpot_s}, {self.target}")


def attainment(times: RequestTimes, slo: SLO) -> dict[str, float]:
    """Shares (0..1) of all requests meeting the TTFT SLO, the TPOT SLO, and both. A one-token output
    has no TPOT and meets that SLO; a request never served meets none."""
    ttft_ok = times.ttft_s <= slo.ttft_s  # NaN compares False
    tpot_ok = np.isnan(times.tpot_s) & ~np.isnan(times.e2el_s) | (times.tpot_s <= slo.tpot_s)
    n = max(len(times.ttft_s), 1)
    return {"ttft": float(ttft_ok.sum() / n), "tpot": float(tpot_ok.sum() / n), "both": float((ttft_ok & tpot_ok).sum() / n)}


def goodput(rates: list[float], both: list[float], target: float) -> float:
    """DistServe's goodput on a sweep: the highest of ``rates`` (ascending) up to which every rate's
    attainment of both SLOs (``both``) reaches ``target``; 0 when the lowest does not."""
    best = 0.0
    for rate, share in zip(rates, both):
        if share < target:
            break
        best = rate
    return best


def poisson_requests(prompt_lens: np.ndarray, output_lens: np.ndarray, rate: float, seed: int) -> list[Request]:
    """Requests with these lengths arriving as a Poisson process of ``rate`` requests/s. One seed draws
    the same unit gaps at every rate, scaled by 1 / rate, so a sweep's curves differ by the load alone."""
    gaps = np.random.default_rng(seed).exponential(1.0, len(prompt_lens))
    arrivals = np.cumsum(gaps) / rate
    return [Request(float(a), int(p), int(o)) for a, p, o in zip(arrivals, prompt_lens, output_lens)]


def sweep(instance: SimulationConfig, deployments: list[Deployment], rates: list[float], slo: SLO, prompt_lens, output_lens,
          kv_bytes_per_token: float, link_bandwidth: float = LINKS[DEFAULT_LINK], seed: int = 0) -> dict:
    """SLO attainment against the request rate for each deployment, and its goodput.

    Args:
        instance: one replica (:func:`serve`). deployments: e.g. 1P1D and its equal-GPU colocated 2C.
        rates: total request rates, requests/s, ascending. slo: the targets.
        prompt_lens, output_lens: each request's tokens (the same requests at every rate).
        kv_bytes_per_token, link_bandwidth: the transfer (:func:`transfer_s`).

    Returns:
        {"rates": [...], "deployments": [{"label", "gpus", "disaggregated", "attainment": {"ttft", "tpot", "both"}: a
        share per rate, "ttft_p90_s", "tpot_p90_s", "tpot_p99_s": per rate, "goodput" (requests/s),
        "goodput_per_gpu", "transfer_ms" (mean per request)}], "slo": {...}, "wall_s"}.
    """
    if not rates or any(b <= a for a, b in zip(rates, rates[1:])) or rates[0] <= 0:
        raise ValueError(f"rates must be ascending and > 0 requests/s, got {rates}")
    started = time.perf_counter()
    prompt_lens, output_lens = np.asarray(prompt_lens), np.asarray(output_lens)
    rows = []
    for d in deployments:
        row = {"label": d.label, "gpus": d.num_gpus, "disaggregated": d.disaggregated, "attainment": {"ttft": [], "tpot": [], "both": []},
               "ttft_p90_s": [], "tpot_p90_s": [], "tpot_p99_s": [], "transfer_ms": 0.0}
        for rate in rates:
            times = serve(poisson_requests(prompt_lens, output_lens, rate, seed), instance, d, kv_bytes_per_token, link_bandwidth)
            for k, v in attainment(times, slo).items():
                row["attainment"][k].append(v)
            for name, values, q in (("ttft_p90_s", times.ttft_s, 90), ("tpot_p90_s", times.tpot_s, 90), ("tpot_p99_s", times.tpot_s, 99)):
                row[name].append(_percentile(values, q))
            row["transfer_ms"] = 1e3 * float(times.transfer_s.mean())
        row["goodput"] = goodput(rates, row["attainment"]["both"], slo.target)
        row["goodput_per_gpu"] = row["goodput"] / d.num_gpus
        rows.append(row)
    return {"rates": list(rates), "deployments": rows, "slo": {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s, "target": slo.target},
            "wall_s": time.perf_counter() - started}


def unloaded(instance: SimulationConfig, prompt_len: int, output_len: int) -> dict[str, float]:
    """One request served alone on one colocated instance: its TTFT and TPOT (s), the floor under any
    SLO (DistServe scales its SLOs from such figures)."""
    times = serve([Request(0.0, prompt_len, output_len)], instance, Deployment(num_colocated=1))
    return {"ttft_s": float(times.ttft_s[0]), "tpot_s": float(times.tpot_s[0]) if output_len > 1 else math.nan}


def default_rates(instance: SimulationConfig, prompt_lens, output_lens, num_gpus: int, points: int = 10) -> list[float]:
    """``points`` rates from 1/8 to 3/2 of what ``num_gpus`` colocated replicas sustain: one replica's
    throughput with every request queued at once (the rate where its queue grows without bound) times
    ``num_gpus``, in three significant digits."""
    requests = [Request(0.0, int(p), int(o)) for p, o in zip(prompt_lens, output_lens)]
    capacity = serve(requests, instance, Deployment(num_colocated=1))
    rate = num_gpus * len(requests) / float(np.nanmax(capacity.e2el_s))
    return [float(f"{rate * f:.3g}") for f in np.linspace(1 / 8, 3 / 2, points)]


def _percentile(values: np.ndarray, q: float) -> float:
    values = values[~np.isnan(values)]
    return float(np.percentile(values, q)) if values.size else math.nan


def format_sweep(result: dict) -> str:
    """The sweep as a table: per deployment and rate, the shares meeting TTFT, TPOT and both; then each
    deployment's goodput, per GPU, and its transfer per request."""
    slo = result["slo"]
    lines = [f"SLOs: TTFT <= {1e3 * slo['ttft_s']:.4g} ms, TPOT <= {1e3 * slo['tpot_s']:.4g} ms, target {slo['target']:.0%} of requests",
             f"{'deployment':<11}{'GPUs':>5}{'rate/s':>9}{'TTFT ok':>9}{'TPOT ok':>9}{'both':>7}{'TTFT p90 ms':>13}{'TPOT p99 ms':>13}"]
    for row in result["deployments"]:
        for i, rate in enumerate(result["rates"]):
            a = row["attainment"]
            lines.append(f"{row['label']:<11}{row['gpus']:>5}{rate:>9.3g}{a['ttft'][i]:>9.0%}{a['tpot'][i]:>9.0%}{a['both'][i]:>7.0%}"
                         f"{1e3 * row['ttft_p90_s'][i]:>13.1f}{1e3 * row['tpot_p99_s'][i]:>13.1f}")
    lines.append("")
    lines.append(f"{'deployment':<11}{'GPUs':>5}{'goodput req/s':>15}{'per GPU':>9}{'KV transfer ms':>16}")
    for row in result["deployments"]:
        lines.append(f"{row['label']:<11}{row['gpus']:>5}{row['goodput']:>15.3g}{row['goodput_per_gpu']:>9.3g}{row['transfer_ms']:>16.2f}")
    lines.append(f"(simulated in {result['wall_s']:.2f} s)")
    return "\n".join(lines)
