"""``python -m engine``: generate, bench, bench-cpu, bench-prefix, simulate, reproduce-paper, calibrate, serve and bench-serve from the command line."""

from __future__ import annotations

import argparse
import json
import sys

from engine.config import PREFIX_CACHES, SCHEDULING_POLICIES

from tqdm.auto import tqdm


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m engine", description="PagedAttention Lab's step-through inference engine")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_generate(sub)
    _add_bench(sub)
    _add_bench_cpu(sub)
    _add_simulator(sub)
    _add_vllm(sub)
    _add_calibrate(sub)
    _add_serve(sub)
    _add_bench_prefix(sub)
    args = parser.parse_args(argv)
    try:
        args.func(args)
    except (ValueError, OSError) as error:  # bad input or a missing file: one readable line, no traceback
        parser.exit(2, f"error: {error}\n")
    except KeyboardInterrupt:  # Ctrl-C: one line; the model download and the kernel build clean up after themselves
        parser.exit(130, "interrupted\n")
    except RuntimeError as error:
        from engine.vllm_bridge.env import VLLMUnavailable

        if not isinstance(error, VLLMUnavailable):
            raise
        parser.exit(3, f"vLLM unavailable: {error}\n")


def _add_generate(sub) -> None:
    p = sub.add_parser("generate", help="generate completions, printing one line per engine step")
    p.add_argument("prompts", nargs="+", help="one or more prompts (sent through the chat template unless --raw)")
    p.add_argument("--model", default=None, help="local HF directory, .gguf file or hub id (default: SmolLM2-135M-Instruct)")
    p.add_argument("--block-size", type=int, default=16, help="token slots per KV block")
    p.add_argument("--num-blocks", type=int, default=None, help="KV pool size in blocks (default 512)")
    p.add_argument("--max-tokens", type=int, default=64, help="new tokens per request")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--allocator", choices=["paged", "contiguous"], default="paged")
    p.add_argument("--reservation", choices=["max", "pow2", "oracle"], default="max")
    p.add_argument("--attention-backend", choices=["auto", "torch", "triton"], default="auto")
    p.add_argument("--prefix-cache", choices=PREFIX_CACHES, default="hash",
                   help="prefix caching: hash = vLLM v1's hash chain, radix = SGLang's radix tree (default: hash)")
    p.add_argument("--scheduling-policy", choices=SCHEDULING_POLICIES, default="fcfs",
                   help="fcfs = first come first served; lpm = longest cached prefix first, with a starvation guard (SGLang)")
    p.add_argument("--kv-offload-blocks", type=int, default=0,
                   help="blocks of a CPU tier for evicted cached blocks, loaded back on a hit (default: 0, none)")
    _add_cpu_kernels(p)
    p.add_argument("--raw", action="store_true", help="send prompts as plain text, not through the chat template")
    p.add_argument("--quiet", action="store_true", help="a progress bar only, no per-step lines")
    p.add_argument("--json", action="store_true", help="print results as JSON")
    p.set_defaults(func=_generate)


def _generate(args) -> None:
    from engine.llm_engine import LLMEngine
    from engine.config import EngineConfig
    from engine.sampling_params import SamplingParams

    config = EngineConfig(
        model=args.model, block_size=args.block_size, num_gpu_blocks=args.num_blocks, seed=args.seed,
        allocator=args.allocator, reservation=args.reservation, attention_backend=args.attention_backend,
        cpu_kernels=args.cpu_kernels, prefix_cache=args.prefix_cache, scheduling_policy=args.scheduling_policy,
        kv_offload_blocks=args.kv_offload_blocks,
    )
    engine = LLMEngine(config)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed)
    chat = not args.raw and engine.tokenizer.chat_template
    ids = [engine.add_request([{"role": "user", "content": p}] if chat else p, params) for p in args.prompts]
    pool = engine.num_blocks * args.block_size
    why = f"the whole KV pool: {engine.num_blocks} blocks x {args.block_size} slots" if engine.max_model_len == pool else "the engine's limit"
    for request_id in ids:
        prompt_len = len(engine.get_output(request_id).prompt_token_ids)
        if prompt_len + args.max_tokens > engine.max_model_len:
            print(f"note: request {request_id} ({prompt_len} prompt tokens) stops at max_model_len = {engine.max_model_len} "
                  f"tokens ({why}), i.e. after {engine.max_model_len - prompt_len} new tokens, finish_reason=length", file=sys.stderr)
    steps = []
    with tqdm(total=len(ids), disable=not args.quiet or args.json, desc="requests") as bar:
        while engine.has_unfinished_requests():
            report = engine.step()
            bar.update(len(report.finished))
            steps.append(_step_summary(report))
            if not args.quiet and not args.json:
                print(_step_line(report), file=sys.stderr)
    outputs = [engine.get_output(i) for i in ids]
    if args.json:
        print(json.dumps({
            "outputs": [{"request_id": o.request_id, "text": o.text, "token_ids": o.token_ids, "finish_reason": o.finish_reason} for o in outputs],
            "steps": steps,
        }, ensure_ascii=False))
        return
    for prompt, out in zip(args.prompts, outputs):
        print(f"\n### {prompt}\n{out.text}\n[{len(out.token_ids)} tokens, finish_reason={out.finish_reason}, preemptions={out.num_preemptions}]")


def _step_summary(report) -> dict:
    m = report.memory
    return {
        "step": report.step, "phase": report.phase, "num_tokens": report.num_tokens,
        "scheduled": [s.request_id for s in report.scheduled], "preempted": report.preempted,
        "finished": report.finished, "memory": m.as_dict(), "ms": round(report.timings_ms["total"], 2),
    }


def _step_line(report) -> str:
    m = report.memory
    pre = f" preempted={report.preempted}" if report.preempted else ""
    return (
        f"step {report.step:4d} {report.phase:7s} reqs={len(report.scheduled):2d} tokens={report.num_tokens:5d} "
        f"token_states={m.token_states}/{m.capacity} internal_frag={m.internal_fragmentation} "
        f"free={m.free} {report.timings_ms['total']:.0f} ms{pre}"
    )


def _add_bench(sub) -> None:
    p = sub.add_parser("bench", help="engine vs transformers generate: tokens/s and identical outputs")
    p.add_argument("--model", default=None, help="local HF directory, .gguf file or hub id (default: SmolLM2-135M-Instruct)")
    p.add_argument("--workload", choices=["mixed"], default="mixed", help="chat prompts with max_tokens spread evenly (default: mixed)")
    p.add_argument("--num-prompts", type=int, default=16, help="requests in the workload (default: 16)")
    p.add_argument("--min-tokens", type=int, default=8, help="smallest max_tokens of a request (default: 8)")
    p.add_argument("--max-tokens", type=int, default=128, help="largest max_tokens of a request (default: 128)")
    p.add_argument("--block-size", type=int, default=None,
                   help="token slots per KV block (default: 16; with --against vllm, vLLM's is 32 unless this is given)")
    p.add_argument("--seed", type=int, default=0, help="default: 0")
    p.add_argument("--against", choices=["vllm"], default=None, help="add real vLLM as a third side (see `python -m engine vllm setup`)")
    p.add_argument("--vllm-python", default=None, help="with --against vllm: a Python that imports vLLM (default: the one `vllm setup` built)")
    p.add_argument("--repeats", type=int, default=3, help="alternating runs of each side; medians are reported (default: 3)")
    p.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], default="auto",
                   help="auto: float32 on CPU, bfloat16 on CUDA; not float32: also the agreement with float32's tokens")
    p.add_argument("--prefix-caching", action=argparse.BooleanOptionalAction, default=False,
                   help="automatic prefix caching on the engine and vLLM alike (default: off on both; transformers has none)")
    _add_cpu_kernels(p)
    p.add_argument("--speculative", choices=["ngram", "draft_layers"], default=None,
                   help="instead: the engine with and without speculative decoding, batch by batch (engine/tools/bench_spec.py)")
    p.add_argument("--num-speculative-tokens", type=int, default=4, help="with --speculative: k draft tokens per step (default: 4)")
    p.add_argument("--num-draft-layers", type=int, default=None,
                   help="with --speculative draft_layers: L layers that draft (default: half the model's)")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 2, 4, 8, 16], help="with --speculative (default: 1 2 4 8 16); --max-tokens then caps each request at 48 tokens at most")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.set_defaults(func=_bench)


def _add_cpu_kernels(p) -> None:
    p.add_argument(
        "--cpu-kernels", action=argparse.BooleanOptionalAction, default=True,
        help="CPU, fp32: decode-sized matmuls, residual add + RMSNorm and RoPE through the engine's C++ kernels "
        "(default), or with --no-cpu-kernels through torch (F.linear, like transformers)",
    )


def _bench(args) -> None:
    if args.speculative:
        from engine.tools.bench_spec import format_spec_bench, run_spec_bench

        result = run_spec_bench(args.speculative, model=args.model, batches=tuple(args.batch_sizes), k=args.num_speculative_tokens,
                                num_draft_layers=args.num_draft_layers, max_tokens=min(args.max_tokens, 48),
                                block_size=args.block_size or 16, progress=lambda line: print(line, file=sys.stderr, flush=True))
        print(json.dumps(result) if args.json else format_spec_bench(result))
        return
    from engine.tools.bench import format_result, run_bench

    if args.against == "vllm":
        print("vLLM loads in its own process while the engine and transformers load; it compiles the model at "
              "every start (1-2 min, more on a busy machine), which is not measured", file=sys.stderr, flush=True)
    result = run_bench(
        model=args.model, num_prompts=args.num_prompts, min_tokens=args.min_tokens,
        max_tokens=args.max_tokens, block_size=args.block_size or 16, seed=args.seed, repeats=args.repeats,
        cpu_kernels=args.cpu_kernels, dtype=args.dtype, against_vllm=args.against == "vllm", vllm_python=args.vllm_python,
        vllm_block_size=args.block_size, prefix_caching=args.prefix_caching,
    )
    print(json.dumps(result) if args.json else format_result(result))


def _add_bench_cpu(sub) -> None:
    p = sub.add_parser("bench-cpu", help="the engine's CPU kernels vs the torch code they replace, per decode step")
    p.add_argument("--model", default=None, help="local HF directory, .gguf file or hub id (default: SmolLM2-135M-Instruct)")
    p.add_argument("--rows", type=int, nargs="+", default=[1, 4, 8, 16, 32, 64], help="batch sizes (requests per step), at least 1")
    p.add_argument("--repeats", type=int, default=7, help="alternating passes of each side; medians are reported (default: 7)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.set_defaults(func=_bench_cpu)


def _bench_cpu(args) -> None:
    from engine.tools.bench_cpu import format_cpu_bench, run_cpu_bench

    try:
        result = run_cpu_bench(model=args.model, rows=tuple(args.rows), repeats=args.repeats)
    except RuntimeError as error:  # no compiler here: one line, after the warning that says why
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    print(json.dumps(result) if args.json else format_cpu_bench(result))


def _add_simulator(sub) -> None:
    from engine.experiments.cli import register_cli as add_reproduce_paper
    from engine.sim.simulator import register_cli as add_simulate

    add_simulate(sub)
    add_reproduce_paper(sub)


def _add_bench_prefix(sub) -> None:
    from engine.tools.bench_prefix import register_cli

    register_cli(sub)


def _add_serve(sub) -> None:
    from engine.entrypoints.openai.cli_args import register_cli  # adds "serve"

    register_cli(sub)
    from engine.tools.bench_serve import register_cli as register_bench_serve  # adds "bench-serve"

    register_bench_serve(sub, _bench_serve)


def _bench_serve(args) -> dict:
    """bench-serve: one server (``engine/tools/bench_serve.py``), or the lab's and vLLM's side by side."""
    if args.against:
        from engine.tools import bench_serve_vllm as tool
    else:
        from engine.tools import bench_serve as tool
    return tool.run_cli(args)


def _add_vllm(sub) -> None:
    p = sub.add_parser("vllm", help="real vLLM beside the lab: `vllm setup` builds its own environment")
    p.add_argument("action", choices=["setup"], help="setup: create (or check) vLLM's venv in the user cache")
    p.set_defaults(func=_vllm)
    p = sub.add_parser("replay", help="one saved workload through the engine and real vLLM, side by side")
    p.add_argument("workload", help="a saved workload file (format pagedattention-lab/workload, see engine/runfile.py)")
    p.add_argument("--against", choices=["vllm"], required=True, help="what to replay against (vllm)")
    p.add_argument("--vllm-python", default=None, help="a Python that imports vLLM (default: the one `vllm setup` built)")
    p.add_argument("--block-size", type=int, default=None, help="both sides' block size (default: the file's, raised to a multiple of 32)")
    p.add_argument("--max-num-batched-tokens", type=int, default=None, help="token budget per step (default: the engine's, max(max_model_len, 2048); 512 with --chunked-prefill)")
    p.add_argument("--prefix-caching", action="store_true", help="both sides with automatic prefix caching (off by default in a replay)")
    p.add_argument("--chunked-prefill", action="store_true", help="both sides chunk prompts under the token budget (their orders differ: a known difference)")
    p.add_argument("--ignore-eos", action="store_true", help="every request runs its max_tokens")
    p.add_argument("--json", action="store_true", help="print the comparison as JSON")
    p.set_defaults(func=_replay)


def _vllm(args) -> None:
    from engine.vllm_bridge.env import setup

    setup(progress=lambda line: print(line, file=sys.stderr, flush=True))


def _replay(args) -> None:
    from engine.vllm_bridge.replay import format_replay, run_replay

    result = run_replay(
        args.workload, vllm_python=args.vllm_python, progress=lambda line: print(line, file=sys.stderr, flush=True), block_size=args.block_size, max_num_batched_tokens=args.max_num_batched_tokens,
        prefix_caching=args.prefix_caching, chunked_prefill=args.chunked_prefill, ignore_eos=args.ignore_eos,
    )
    print(json.dumps(result) if args.json else format_replay(result))
    if result["unexplained"] or not (result["outputs"]["identical"] or result["differences"]):
        sys.exit(1)


def _add_calibrate(sub) -> None:
    p = sub.add_parser("calibrate", help="fit the simulator's step-time model to this machine (runs the real engine)")
    p.add_argument("--model", default=None, help="local HF directory, .gguf file or hub id (default: SmolLM2-135M-Instruct)")
    p.add_argument("--no-validate", action="store_true", help="skip predicting the mixed and preemption workloads")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: half the cores)")
    p.add_argument("--server", default=None, metavar="URL",
                   help="fit on the steps of the lab server at URL (python -m engine serve) while it serves a calibration load, "
                        "instead of timing the engine alone (what bench-serve --predict should use)")
    p.add_argument("--api-key", default=None, help="with --server: a key the server accepts")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.set_defaults(func=_calibrate)


def _calibrate(args) -> None:
    progress = (lambda _: None) if args.json else (lambda line: print(line, file=sys.stderr))
    if args.server:
        from engine.tools.calibrate_server import calibrate_server, format_server_calibration

        result = calibrate_server(args.server, api_key=args.api_key, progress=progress)
        print(json.dumps(result, indent=2) if args.json else format_server_calibration(result))
        return
    from engine.tools.calibrate import calibrate, format_calibration

    result = calibrate(model=args.model, validate=not args.no_validate, threads=args.threads, progress=progress)
    print(json.dumps(result, indent=2) if args.json else format_calibration(result))
