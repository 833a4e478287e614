"""The server's Prometheus metrics, under vLLM's names where vLLM has the metric (``vllm:...``;
vLLM v1's ``PrometheusStatLogger``), and ``lab:...`` for the lab's own.

Every server has its own :class:`prometheus_client.CollectorRegistry`, so that one process (a test)
can run several servers. Counters are exposed with Prometheus' ``_total`` suffix, as vLLM's are
(``vllm:num_preemptions`` is read as ``vllm:num_preemptions_total``).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from engine.entrypoints.async_llm import EngineSnapshot

# vLLM's histogram buckets, in seconds.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)


class ServerMetrics:
    """The metrics of one server, fed by :class:`~engine.entrypoints.async_llm.AsyncLLM` (it is its
    ``StatLogger``) and by the HTTP layer (rejected requests).

    Args:
        model_name: the served model's name, the ``model_name`` label of every vLLM metric.
    """

    def __init__(self, model_name: str):
        self.registry = registry = CollectorRegistry()
        labels = {"model_name": model_name}
        self._labels = labels

        def gauge(name, doc):
            return Gauge(name, doc, list(labels), registry=registry).labels(**labels)

        def counter(name, doc):
            return Counter(name, doc, list(labels), registry=registry).labels(**labels)

        def histogram(name, doc, buckets):
            return Histogram(name, doc, list(labels), buckets=buckets, registry=registry).labels(**labels)

        self.num_requests_running = gauge("vllm:num_requests_running", "Requests in the scheduler's running queue (scheduled each step).")
        self.num_requests_waiting = gauge("vllm:num_requests_waiting", "Requests waiting for their (re)prefill.")
        self.num_requests_swapped = gauge("vllm:num_requests_swapped", "Requests whose KV blocks are swapped out to CPU memory.")
        self.kv_cache_usage = gauge("vllm:kv_cache_usage_perc", "KV-cache usage: the share of the pool's slots in use, 0..1 (1 = full).")
        self.gpu_cache_usage = gauge("vllm:gpu_cache_usage_perc", "Older name of vllm:kv_cache_usage_perc, 0..1.")
        self.free_blocks = gauge("lab:kv_cache_free_blocks", "Free blocks of the KV pool (cached-and-free prefix blocks included).")
        self.num_blocks = gauge("lab:kv_cache_blocks", "Usable blocks of the KV pool.")
        self.prefix_cache_queries = counter("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache (first prefills).")
        self.prefix_cache_hits = counter("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache (first prefills).")
        self.num_preemptions = counter("vllm:num_preemptions", "Preemptions (recompute or swap) since the server started.")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Prompt tokens of the requests that ended.")
        self.generation_tokens = counter("vllm:generation_tokens", "Generated tokens of the requests that ended.")
        self.request_success = Counter("vllm:request_success", "Requests that ended, by finish reason (stop, length, abort, error).",
                                       ["model_name", "finished_reason"], registry=registry)
        self.ttft = histogram("vllm:time_to_first_token_seconds", "Time to first token, s: arrival to the first token's delta.", TTFT_BUCKETS)
        self.itl = histogram("vllm:inter_token_latency_seconds", "Inter-token latency, s: between two deltas of one request.", ITL_BUCKETS)
        self.e2e = histogram("vllm:e2e_request_latency_seconds", "End-to-end request latency, s: arrival to the end.", E2E_BUCKETS)
        self.client_requests = Counter("lab:client_requests", "Requests that ended, by client (the API key's name) and finish reason.",
                                       ["client", "finished_reason"], registry=registry)
        self.client_rejected = Counter("lab:client_rejected", "Requests refused before reaching the engine, by client and HTTP status.",
                                       ["client", "status_code"], registry=registry)
        self._prefix_seen = (0, 0)

    # ---- StatLogger -------------------------------------------------------------------------

    def record_step(self, snapshot: EngineSnapshot) -> None:
        self.num_requests_running.set(snapshot.num_running)
        self.num_requests_waiting.set(snapshot.num_waiting)
        self.num_requests_swapped.set(snapshot.num_swapped)
        self.kv_cache_usage.set(snapshot.kv_cache_usage)
        self.gpu_cache_usage.set(snapshot.kv_cache_usage)
        self.free_blocks.set(snapshot.num_free_blocks)
        self.num_blocks.set(snapshot.num_blocks)
        if snapshot.num_preemptions:
            self.num_preemptions.inc(snapshot.num_preemptions)
        stats = snapshot.prefix_cache
        if stats is not None:
            queries, hits = self._prefix_seen
            self.prefix_cache_queries.inc(max(stats.queries - queries, 0))
            self.prefix_cache_hits.inc(max(stats.hits - hits, 0))
            self._prefix_seen = (stats.queries, stats.hits)

    def record_first_token(self, seconds: float) -> None:
        self.ttft.observe(seconds)

    def record_inter_token(self, seconds: float) -> None:
        self.itl.observe(seconds)

    def record_finished(self, reason: str, e2e_seconds: float, num_prompt_tokens: int, num_generation_tokens: int, client: str) -> None:
        self.e2e.observe(e2e_seconds)
        self.prompt_tokens.inc(num_prompt_tokens)
        self.generation_tokens.inc(num_generation_tokens)
        self.request_success.labels(finished_reason=reason, **self._labels).inc()
        self.client_requests.labels(client=client, finished_reason=reason).inc()

    # ---- the HTTP layer ---------------------------------------------------------------------

    def record_rejected(self, client: str, status_code: int) -> None:
        self.client_rejected.labels(client=client, status_code=str(status_code)).inc()

    def render(self) -> bytes:
        """The registry in Prometheus' text exposition format."""
        return generate_latest(self.registry)
