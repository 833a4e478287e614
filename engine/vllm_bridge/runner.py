"""Drive real vLLM for the lab: run in vLLM's own Python, never imported by the lab.

``<vllm python> engine/vllm_bridge/runner.py JOB.json`` loads one vLLM ``LLMEngine`` with the job's
settings, says ``{"event": "ready", ...}``, then answers one command per line on stdin with one JSON
line on stdout (everything vLLM itself prints goes to stderr):

    {"cmd": "generate", "max_tokens": [..] | null, "logprobs": bool}
                                                   -> {"seconds", "token_ids": [[..], ..], "logprobs": [[..], ..] if asked}
    {"cmd": "replay"}                              -> {"seconds", "token_ids", "steps": [..], "metrics": {..}}
    {"cmd": "quit"}

The job: ``model`` (a local HF directory), ``dtype``, ``block_size``, ``num_gpu_blocks`` (vLLM's
``num_gpu_blocks_override``, the null block included) or null, ``max_num_seqs``,
``max_num_batched_tokens``, ``max_model_len``, ``enable_prefix_caching``, ``enable_chunked_prefill``,
``seed``, ``kv_cache_dtype`` ("auto" when absent; "fp8", "fp8_e4m3", "fp8_e5m2": vLLM's, with its default
scales of 1.0), and ``requests``: ``prompt_token_ids``, ``max_tokens``, ``temperature``, ``ignore_eos``, ``seed``.

A replay records, per engine-core step, what vLLM's own stats say (a custom ``StatLoggerBase``
receives each step's ``SchedulerStats`` and ``IterationStats``): requests running and waiting,
KV cache usage (fraction of usable blocks), prefix-cache queries and hits (tokens), preemptions.
"""

from __future__ import annotations

import json
import os
import sys
import time


def main(job_path: str) -> None:
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # vLLM's prints and its engine-core process's go to stderr, not into our JSON
    job = json.loads(open(job_path).read())
    t0 = time.perf_counter()
    steps: list[dict] = []
    engine = _make_engine(job, steps)
    _say(out, {"event": "ready", "load_s": time.perf_counter() - t0, "vllm_version": _version(), "settings": _effective(engine)})
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["cmd"] == "quit":
            break
        steps.clear()
        t0 = time.perf_counter()
        token_ids, logprobs = _run(engine, job["requests"], cmd.get("max_tokens"), cmd.get("prefix", "r"), cmd.get("logprobs", False))
        reply = {"seconds": time.perf_counter() - t0, "token_ids": token_ids}
        if cmd.get("logprobs"):
            reply["logprobs"] = logprobs
        if cmd["cmd"] == "replay":
            reply.update(steps=list(steps), metrics=_metrics(steps))
        _say(out, reply)


def _make_engine(job: dict, steps: list[dict]):
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.engine.llm_engine import LLMEngine
    from vllm.v1.metrics.loggers import StatLoggerBase

    class StepRecorder(StatLoggerBase):
        """Keeps each step's scheduler and iteration stats as plain numbers."""

        def __init__(self, vllm_config, engine_index: int = 0):
            pass

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0):
            if scheduler_stats is None:
                return
            generated = iteration_stats.num_generation_tokens if iteration_stats else 0
            if scheduler_stats.num_running_reqs == 0 and not generated:
                return  # an idle engine core's report, not a step
            prefix = scheduler_stats.prefix_cache_stats
            steps.append({
                "num_running": scheduler_stats.num_running_reqs,
                "num_waiting": scheduler_stats.num_waiting_reqs,
                "kv_cache_usage": scheduler_stats.kv_cache_usage,
                "prefix_cache_queries": prefix.queries if prefix else 0,
                "prefix_cache_hits": prefix.hits if prefix else 0,
                "num_preempted": iteration_stats.num_preempted_reqs if iteration_stats else 0,
                "num_generation_tokens": generated,
                "num_prompt_tokens": iteration_stats.num_prompt_tokens if iteration_stats else 0,
            })

        def log_engine_initialized(self):
            pass

    args = EngineArgs(
        model=job["model"], tokenizer=job["model"], dtype=job.get("dtype", "float32"), seed=job.get("seed", 0),
        block_size=job["block_size"], num_gpu_blocks_override=job.get("num_gpu_blocks"),
        max_num_seqs=job["max_num_seqs"], max_num_batched_tokens=job.get("max_num_batched_tokens"),
        max_model_len=job.get("max_model_len"), enable_prefix_caching=job.get("enable_prefix_caching", False),
        enable_chunked_prefill=job.get("enable_chunked_prefill"), disable_log_stats=False,
        kv_cache_dtype=job.get("kv_cache_dtype", "auto"),
    )
    return LLMEngine.from_engine_args(args, stat_loggers=[StepRecorder])


def _run(engine, requests: list[dict], max_tokens: list[int] | None, prefix: str,
         logprobs: bool = False) -> tuple[list[list[int]], list[list[float]] | None]:
    """Add every request (all arrive at once), step until done; token ids in request order, and with
    ``logprobs`` each chosen token's log-probability (vLLM's ``logprobs=0``)."""
    from vllm import SamplingParams

    _run.calls = getattr(_run, "calls", 0) + 1
    ids = []
    # vLLM's engine core steps in its own process as soon as a request arrives; paused, it queues
    # them, so that all requests are there at step 0, as in the lab's engine.
    _utility(engine, "pause_scheduler", "keep", False)
    for i, r in enumerate(requests):
        params = SamplingParams(
            max_tokens=max_tokens[i] if max_tokens else r["max_tokens"], temperature=r.get("temperature", 0.0),
            ignore_eos=r.get("ignore_eos", False), seed=r.get("seed"), logprobs=0 if logprobs else None,
        )
        request_id = f"{prefix}{_run.calls}-{i}"
        engine.add_request(request_id, {"prompt_token_ids": r["prompt_token_ids"]}, params)
        ids.append(request_id)
    _utility(engine, "resume_scheduler")
    done: dict[str, list[int]] = {}
    chosen: dict[str, list[float]] = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                completion = output.outputs[0]
                done[output.request_id] = list(completion.token_ids)
                if logprobs:  # one {token_id: Logprob} per position; the chosen token is always in it
                    chosen[output.request_id] = [step[t].logprob for t, step in zip(completion.token_ids, completion.logprobs)]
    return [done[i] for i in ids], ([chosen[i] for i in ids] if logprobs else None)


def _utility(engine, name: str, *args) -> None:
    call = getattr(engine.engine_core, "call_utility", None)
    if call is not None:  # an in-process engine core steps only when asked: nothing to pause
        call(name, *args)


def _metrics(steps: list[dict]) -> dict:
    usage = [s["kv_cache_usage"] for s in steps]
    return {
        "num_steps": len(steps),
        "num_preemptions": sum(s["num_preempted"] for s in steps),
        "peak_kv_usage": max(usage, default=0.0),
        "mean_kv_usage": sum(usage) / len(usage) if usage else 0.0,
        "prefix_cache_queries": sum(s["prefix_cache_queries"] for s in steps),
        "prefix_cache_hits": sum(s["prefix_cache_hits"] for s in steps),
    }


def _effective(engine) -> dict:
    config = engine.vllm_config
    return {
        "block_size": config.cache_config.block_size, "num_gpu_blocks": config.cache_config.num_gpu_blocks,
        "max_num_seqs": config.scheduler_config.max_num_seqs,
        "max_num_batched_tokens": config.scheduler_config.max_num_batched_tokens,
        "enable_chunked_prefill": config.scheduler_config.enable_chunked_prefill,
        "enable_prefix_caching": config.cache_config.enable_prefix_caching,
        "async_scheduling": getattr(config.scheduler_config, "async_scheduling", None),
    }


def _version() -> str:
    import vllm

    return vllm.__version__


def _say(out, obj: dict) -> None:
    out.write(json.dumps(obj) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
