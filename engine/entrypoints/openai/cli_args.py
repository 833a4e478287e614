"""The ``serve`` sub-command's flags: every :class:`~engine.EngineConfig` field under vLLM serve's
flag name where vLLM has one, then the server's own (vLLM's ``cli_args.py``)."""

from __future__ import annotations

import argparse
import json

from engine.config import (ALLOCATORS, ATTENTION_BACKENDS, DTYPES, DEVICES, KV_CACHE_DTYPES, PLACEMENTS, PREEMPTION_MODES, RESERVATIONS,
                           EngineConfig, add_prefix_cache_args, prefix_cache_kwargs)

GIB = 1 << 30


def register_cli(sub) -> None:
    """Add ``serve`` to ``python -m engine``'s sub-commands."""
    p = sub.add_parser("serve", help="an OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions, /metrics)")
    p.add_argument("model_tag", nargs="?", default=None, help="the model (as --model)")
    add_engine_args(p)
    add_server_args(p)
    p.set_defaults(func=serve)


def add_engine_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("engine (vLLM's names)")
    g.add_argument("--model", default=None, help="local HF directory, .gguf file or hub id (default: SmolLM2-135M-Instruct)")
    g.add_argument("--block-size", type=int, default=16, help="token slots per KV block (default: 16)")
    g.add_argument("--num-gpu-blocks-override", type=int, default=None, help="KV pool size in blocks (default: 512)")
    g.add_argument("--kv-cache-memory-bytes", type=int, default=None, help="KV pool size in bytes, instead of a number of blocks")
    g.add_argument("--max-num-seqs", type=int, default=32, help="most requests running in one step (default: 32)")
    g.add_argument("--max-num-batched-tokens", type=int, default=None,
                   help="token budget of one step (default: max(max_model_len, 2048); 512 with chunked prefill)")
    g.add_argument("--max-model-len", type=int, default=None, help="most tokens (prompt + output) per request (default: min(model limit, 2048))")
    g.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None,
                   help="automatic prefix caching (default: on with the paged allocator)")
    add_prefix_cache_args(g)
    g.add_argument("--preemption-mode", choices=PREEMPTION_MODES, default="recompute",
                   help="how a request gives its KV up when the pool runs out (paper §4.5; default: recompute)")
    g.add_argument("--swap-space", type=float, default=None, help="CPU swap space in GiB (default: as many blocks as the KV pool)")
    g.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=False,
                   help="cut prompts into chunks that fit the step's token budget, decodes first")
    g.add_argument("--dtype", choices=DTYPES, default="auto", help="auto: float32 on CPU, bfloat16 on CUDA")
    g.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES, default="auto",
                   help="the KV pool's element type: auto (the model's dtype), fp8 / fp8_e4m3, fp8_e5m2 (one byte per element)")
    g.add_argument("--device", choices=DEVICES, default="auto", help="where the model runs; auto: CUDA when present, else the CPU")
    g.add_argument("--seed", type=int, default=0, help="seeds requests that give no seed (default: 0)")
    g.add_argument("--attention-backend", choices=ATTENTION_BACKENDS, default="auto",
                   help="torch (gather + softmax; the C++ kernel on CPU), triton (paged_kernels/); auto: triton on CUDA, torch on CPU")
    g.add_argument("--cpu-kernels", action=argparse.BooleanOptionalAction, default=True, help="the engine's C++ CPU kernels (default: on)")
    g.add_argument("--allocator", choices=ALLOCATORS, default="paged", help="paged (PagedAttention) or contiguous (before vLLM)")
    g.add_argument("--reservation", choices=RESERVATIONS, default="max", help="contiguous allocator: how much it reserves per request")
    g.add_argument("--placement", choices=PLACEMENTS, default="first-fit", help="contiguous allocator: where a range goes")
    g.add_argument("--shuffle-blocks", action="store_true", help="hand out physical blocks in a seeded random order")
    g.add_argument("--reserve-null-block", action="store_true", help="keep block 0 out of the pool, as vLLM v1 does")
    g.add_argument("--kv-transfer-config", type=_json_object, default=None, metavar="JSON",
                   help="prefill/decode disaggregation, vLLM's flag: e.g. '{\"kv_connector\": \"SharedMemoryConnector\", "
                        "\"kv_role\": \"kv_producer\"}' (kv_role: kv_producer, kv_consumer or kv_both; docs/disaggregation.md)")


def add_server_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1, this machine only)")
    g.add_argument("--port", type=int, default=8000, help="default: 8000")
    g.add_argument("--served-model-name", default=None, help="the model name clients use (default: the model's)")
    g.add_argument("--api-key", action="append", default=[], metavar="NAME=KEY",
                   help="accept 'Authorization: Bearer KEY' and call its client NAME; repeat for several clients "
                        "(a bare KEY is named 'default'). Without any, no authentication")
    g.add_argument("--max-concurrent-requests-per-client", type=int, default=64, help="requests in flight per client (429 beyond; default: 64)")
    g.add_argument("--max-concurrent-requests-per-address", type=int, default=64,
                   help="without API keys, requests in flight per address whatever 'user' they give (429 beyond; default: 64)")
    g.add_argument("--max-waiting-requests", type=int, default=256,
                   help="requests the whole server holds that are not running yet (429 beyond; default: 256)")
    g.add_argument("--max-tokens-per-client", type=int, default=None,
                   help="max_tokens x n over a client's requests in flight (429 beyond; default: no cap)")
    g.add_argument("--max-request-body-bytes", type=int, default=1 << 20, help="largest request body (413 beyond; default: 1 MiB)")
    g.add_argument("--shutdown-timeout", type=float, default=30.0,
                   help="on SIGTERM/SIGINT, seconds the running requests get to finish before they are aborted (default: 30)")
    g.add_argument("--uvicorn-log-level", default="info", choices=["critical", "error", "warning", "info", "debug", "trace"],
                   help="how much uvicorn, the HTTP server, logs")
    g = p.add_argument_group("classroom (the lab endpoints under /lab)")
    g.add_argument("--teacher-token", default=None,
                   help="the token the lab's control endpoint asks for (Step, Run); default: a random one, printed at start")
    g.add_argument("--lab-mode", choices=("run", "step"), default="run",
                   help="run: the engine steps while there is work; step: only when the teacher presses Step (default: run)")
    g.add_argument("--lab-max-steps-per-s", type=float, default=None,
                   help="run mode's speed cap, steps a second, 0.1 to 1000 (default: full speed)")
    g.add_argument("--lab-viewer-buffer", type=int, default=256,
                   help="step-stream events a viewer may be behind before it is cut off (default: 256)")
    g.add_argument("--default-temperature", type=float, default=0.0,
                   help="the room's sampling: the temperature of a request that sets none (default: 0, greedy, so that "
                        "answers repeat; OpenAI's own default is 1.0). A request's own temperature wins")


def engine_config(args) -> EngineConfig:
    """The EngineConfig the flags describe.

    Raises:
        ValueError: a bad value (EngineConfig names the field).
    """
    return EngineConfig(
        model=args.model or args.model_tag, block_size=args.block_size, num_gpu_blocks=args.num_gpu_blocks_override,
        kv_cache_memory=args.kv_cache_memory_bytes, max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len, dtype=args.dtype, device=args.device, attention_backend=args.attention_backend,
        allocator=args.allocator, reservation=args.reservation, placement=args.placement, shuffle_blocks=args.shuffle_blocks,
        seed=args.seed, cpu_kernels=args.cpu_kernels, enable_prefix_caching=args.enable_prefix_caching,
        preemption_mode=args.preemption_mode, swap_space=None if args.swap_space is None else int(args.swap_space * GIB),
        enable_chunked_prefill=args.enable_chunked_prefill, reserve_null_block=args.reserve_null_block,
        **prefix_cache_kwargs(args),
        kv_cache_dtype=args.kv_cache_dtype, kv_transfer_config=args.kv_transfer_config,
    )


def _json_object(text: str) -> dict:
    """A flag's JSON object (argparse turns the ValueError into a usage error naming the flag)."""
    value = json.loads(text)
    if not isinstance(value, dict):
        raise ValueError("not a JSON object")
    return value


def parse_api_keys(values: list[str]) -> dict[str, str]:
    """``NAME=KEY`` flags as key -> name (a bare KEY is named "default").

    Raises:
        ValueError: an empty key or name, or one key given twice.
    """
    keys: dict[str, str] = {}
    for value in values:
        name, sep, key = value.partition("=")
        if not sep:
            name, key = "default", value
        if not name or not key:
            raise ValueError(f"--api-key must be NAME=KEY with both non-empty, got {value!r}")
        if key in keys:
            raise ValueError(f"--api-key: the same key is given for '{keys[key]}' and '{name}'")
        keys[key] = name
    return keys


def serve(args) -> None:
    from engine.entrypoints.openai.api_server import ServerSettings, run_server

    settings = ServerSettings(
        served_model_name=args.served_model_name, api_keys=parse_api_keys(args.api_key),
        max_concurrent_requests_per_client=args.max_concurrent_requests_per_client,
        max_concurrent_requests_per_address=args.max_concurrent_requests_per_address, max_waiting_requests=args.max_waiting_requests,
        max_tokens_per_client=args.max_tokens_per_client, max_request_body_bytes=args.max_request_body_bytes,
        teacher_token=args.teacher_token, lab_mode=args.lab_mode, lab_max_steps_per_s=args.lab_max_steps_per_s,
        lab_viewer_buffer=args.lab_viewer_buffer, default_temperature=args.default_temperature,
    )
    # a config, not an engine: the engine is built on the thread that steps it (engine/entrypoints/async_llm.py)
    run_server(engine_config(args), settings, host=args.host, port=args.port, shutdown_timeout_s=args.shutdown_timeout, log_level=args.uvicorn_log_level)
