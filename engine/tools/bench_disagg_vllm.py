"""``python -m engine.tools.bench_disagg --against vllm``: the lab's ``serve-disagg`` and vLLM's own
prefill/decode disaggregation on the same greedy requests.

vLLM's side is two ``vllm serve`` processes from vLLM's venv (engine/vllm_bridge/env.py), each with
``--kv-transfer-config '{"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_buffer_device": "cpu"}'``
(NIXL registers the CPU KV cache as DRAM and the decode instance pulls the lent blocks with a NIXL
READ over UCX; the ``nixl`` wheel in vLLM's venv, which runs without CUDA), each with its own
``VLLM_NIXL_SIDE_CHANNEL_PORT``, one OpenMP thread and core, and 1 GiB of KV space. Where NIXL cannot be
imported there, ``ExampleConnector`` (every prompt's KV written to files, read back by the decode
instance; no dependency) stands in, and one line says so. The lab's proxy
(:func:`engine.entrypoints.disagg.create_proxy_app`) makes vLLM's two calls to them, as it does to
the lab's instances: a prefill with ``max_tokens=1`` and ``kv_transfer_params={"do_remote_decode": true}``,
then a decode with the parameters the prefill returned.

Both sides get equal settings (block size 32, vLLM's CPU minimum; 64 usable blocks; prefix caching
off; float32; greedy, ``ignore_eos``) and the same prompts, one after the other; the two sides run
one after the other too (never four instances at once on a small machine). Compared: each request's
generated token ids, and each decode instance's KV reads: how many, how many blocks, how many bytes
(vLLM: ``vllm:nixl_xfer_time_seconds_count`` and ``vllm:nixl_bytes_transferred_sum`` of its
``/metrics``; the lab: ``num_loaded`` and ``num_loaded_bytes`` of ``/kv_transfer/status``).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from engine.tools.bench_serve_vllm import ServerProcess, vllm_cli_env

BLOCK_SIZE = 32  # vLLM's CPU attention takes multiples of 32 only
NUM_BLOCKS = 64  # usable blocks on each instance (vLLM gets one more: its null block)
MAX_MODEL_LEN = 1024
KV_CACHE_GIB = 1.0
STARTUP_TIMEOUT_S = 900.0
PROMPTS = (
    "The capital of France is",
    "Paged attention stores the KV cache in fixed-size blocks, so that " * 3,
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25",
    "A block table maps each sequence's logical blocks to physical blocks. Explain copy-on-write in two sentences:",
)


def why_no_nixl(python: str | Path) -> str | None:
    """Why vLLM's NixlConnector cannot start in that interpreter (NIXL does not import, or its UCX
    backend does not start), or None when it can."""
    code = ("from nixl._api import nixl_agent, nixl_agent_config\n"
            "nixl_agent('probe', nixl_agent_config(backends=['UCX']))")
    try:
        done = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=120, env=vllm_cli_env(python))
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"{type(error).__name__}: {error}"
    if done.returncode == 0:
        return None
    return (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]


def vllm_kv_transfer_config(connector: str, storage: Path) -> dict:
    """vLLM's ``--kv-transfer-config`` for one instance of its 1P1D (both ``kv_both``: the proxy's
    ``kv_transfer_params`` say which side a request is on)."""
    if connector == "NixlConnector":
        return {"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_buffer_device": "cpu"}
    return {"kv_connector": "ExampleConnector", "kv_role": "kv_both", "kv_connector_extra_config": {"shared_storage_path": str(storage)}}


def vllm_commands(python: Path, model_dir: Path, served_name: str, connector: str, storage: Path) -> dict[str, tuple[list[str], dict]]:
    """Each vLLM instance's command line and environment: its own core, one OpenMP thread, its own
    NIXL side-channel port."""
    from engine.entrypoints.disagg import free_port

    cores = sorted(os.sched_getaffinity(0))
    config = json.dumps(vllm_kv_transfer_config(connector, storage))
    lines = {}
    for i, role in enumerate(("prefill", "decode")):
        env = vllm_cli_env(python, KV_CACHE_GIB)
        env.update(OMP_NUM_THREADS="1", VLLM_CPU_OMP_THREADS_BIND=str(cores[i % len(cores)]),
                   VLLM_NIXL_SIDE_CHANNEL_HOST="127.0.0.1", VLLM_NIXL_SIDE_CHANNEL_PORT=str(free_port()))
        argv = [str(python), "-m", "vllm.entrypoints.cli.main", "serve", str(model_dir), "--served-model-name", served_name,
                *_common_flags(), "--num-gpu-blocks-override", str(NUM_BLOCKS + 1), "--enforce-eager", "--uvicorn-log-level", "warning", "--kv-transfer-config", config]
        lines[role] = (argv, env)
    return lines


def lab_command(kv_connector: str = "SharedMemoryConnector") -> list[str]:
    """The lab's ``serve-disagg`` with the same settings (its two instances on private ports)."""
    return [sys.executable, "-m", "engine", "serve-disagg", *_common_flags(), "--num-gpu-blocks-override", str(NUM_BLOCKS),
            "--kv-connector", kv_connector]


def _common_flags() -> list[str]:
    return ["--block-size", str(BLOCK_SIZE), "--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", "4",
            "--no-enable-prefix-caching", "--dtype", "float32", "--seed", "0"]


async def handovers(client: httpx.AsyncClient, model: str, prompts: list[str], max_tokens: int) -> list[list[int] | None]:
    """Each prompt through a proxy (the two calls), one at a time; its generated token ids (None: it failed)."""
    out = []
    for prompt in prompts:
        body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "return_token_ids": True}
        answer = await client.post("/v1/completions", json=body)
        out.append(answer.json()["choices"][0]["token_ids"] if answer.status_code == 200 and "x-disagg" not in answer.headers else None)
    return out


def vllm_reads(decode_url: str, connector: str, storage: Path) -> dict:
    """vLLM's decode instance's KV reads: {"num_reads", "num_bytes", "num_failed"}. NixlConnector:
    its Prometheus counters (one read per request, every layer's K and V of the prompt's blocks);
    ExampleConnector: the prompts whose KV its prefill instance wrote to files and their bytes
    (whole blocks only, safetensors headers included: the decode instance computes the rest)."""
    if connector == "ExampleConnector":
        folders = [d for d in storage.iterdir() if d.is_dir()]
        return {"num_reads": len(folders), "num_bytes": sum(f.stat().st_size for d in folders for f in d.glob("*.safetensors")), "num_failed": 0}
    text = httpx.get(f"{decode_url}/metrics", timeout=30).text

    def total(name: str) -> float:
        return sum(float(m) for m in re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M))

    return {"num_reads": int(total("vllm:nixl_xfer_time_seconds_count")), "num_bytes": int(total("vllm:nixl_bytes_transferred_sum")),
            "num_failed": int(total("vllm:nixl_num_failed_transfers_total"))}


def stop(*servers: ServerProcess) -> None:
    """SIGTERM to all at once (they shut down side by side), then, for each, SIGKILL of whatever is
    left of its process group (vLLM's engine core and worker) once it has exited or after 60 s."""
    for server in servers:
        if server.proc.poll() is None:
            server.proc.terminate()
    for server in servers:
        try:
            server.close()
        finally:
            try:
                os.killpg(server.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def run_lab(prompts: list[str], max_tokens: int, say, kv_connector: str = "SharedMemoryConnector") -> dict:
    """The lab's serve-disagg: its tokens and its decode instance's reads."""
    server = ServerProcess("serve-disagg", lab_command(kv_connector), dict(os.environ))
    try:
        say(f"the lab's serve-disagg: ready after {server.wait_ready(STARTUP_TIMEOUT_S):.0f} s")
        model = httpx.get(f"{server.base_url}/v1/models", timeout=30).json()["data"][0]["id"]

        async def go():
            async with httpx.AsyncClient(base_url=server.base_url, timeout=600) as client:
                return await handovers(client, model, prompts, max_tokens)

        tokens = asyncio.run(go())
        status = httpx.get(f"{server.base_url}/kv_transfer/status", timeout=30).json()["decode"]
    finally:
        stop(server)
    return {"connector": status["kv_connector"], "model": model, "token_ids": tokens, "reads": {"num_reads": status["num_loaded"], "num_blocks": status["num_loaded_blocks"],
                                                            "num_bytes": status["num_loaded_bytes"], "num_failed": status["num_recomputed"]}}


def run_vllm(python: Path, model: str, prompts: list[str], max_tokens: int, connector: str, say) -> dict:
    """vLLM's two instances on the default model (served as ``model``, the lab's name for it) behind
    the lab's proxy: its tokens and its decode instance's reads."""
    from engine.entrypoints.disagg import create_proxy_app
    from engine.model_executor.model_loader import resolve_model

    with tempfile.TemporaryDirectory(prefix="pagedattention-vllm-pd-") as storage:
        lines = vllm_commands(python, resolve_model(None), model, connector, Path(storage))
        servers = {}
        try:
            for role, (argv, env) in lines.items():
                servers[role] = ServerProcess(f"vllm-{role}", argv, env)
            ready = {role: s.wait_ready(STARTUP_TIMEOUT_S) for role, s in servers.items()}
            say(f"vLLM's prefill and decode instances ({connector}): ready after {max(ready.values()):.0f} s")
            app = create_proxy_app(servers["prefill"].base_url, servers["decode"].base_url)

            async def go():
                async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1", timeout=600) as client:
                    return await handovers(client, model, prompts, max_tokens)

            tokens = asyncio.run(go())
            time.sleep(0.5)  # the decode engine's last step's stats reach its API server's counters
            reads = vllm_reads(servers["decode"].base_url, connector, Path(storage))
        except RuntimeError as error:
            raise RuntimeError(f"vLLM's P/D ({connector}) did not run: {error}") from None
        finally:
            stop(*servers.values())
    return {"connector": connector, "token_ids": tokens, "reads": reads}


def compare(prompts: list[str], max_tokens: int, vllm_python: str | None = None, connector: str | None = None, say=print,
            lab_connector: str = "SharedMemoryConnector") -> dict:
    """Both sides on the same prompts; {"vllm_connector", "outputs" (``compare_token_ids``), "lab", "vllm"}.

    Raises:
        engine.vllm_bridge.env.VLLMUnavailable: vLLM cannot run here (says why).
        RuntimeError: a server did not start (with its last log lines).
    """
    from engine.tools.bench_serve_vllm import compare_token_ids
    from engine.vllm_bridge.env import resolve_python

    python = resolve_python(vllm_python)
    if connector is None:
        why = why_no_nixl(python)
        connector = "NixlConnector" if why is None else "ExampleConnector"
        say("vLLM's P/D transport: NixlConnector (NIXL over UCX, kv_buffer_device cpu)" if why is None else
            f"vLLM's P/D transport: ExampleConnector, because NIXL does not start in {python} ({why}; `{python} -m pip install nixl` adds it)")
    lab = run_lab(prompts, max_tokens, say, lab_connector)
    vllm = run_vllm(python, lab["model"], prompts, max_tokens, connector, say)
    return {"vllm_connector": connector, "num_prompts": len(prompts), "max_tokens": max_tokens, "block_size": BLOCK_SIZE,
            "outputs": compare_token_ids(lab["token_ids"], vllm["token_ids"]), "lab": lab, "vllm": vllm}


def format_comparison(r: dict) -> str:
    lines = [f"{r['num_prompts']} prompts, {r['max_tokens']} greedy tokens each, block size {r['block_size']}, float32; "
             f"transports: the lab's {r['lab']['connector']}, vLLM's {r['vllm_connector']}",
             f"{'decode instance reads':<24}{'lab':>14}{'vLLM':>14}"]
    for key, label in (("num_reads", "reads"), ("num_bytes", "bytes"), ("num_failed", "failed / recomputed")):
        lines.append(f"{label:<24}{r['lab']['reads'][key]:>14,}{r['vllm']['reads'][key]:>14,}")
    out = r["outputs"]
    lines.append(f"outputs: {out['num_identical']} of {out['num_requests']} requests token-identical" + ("" if out["identical"] else " — NOT IDENTICAL"))
    for m in out["mismatches"]:
        where = "failed on one side" if m["position"] is None else f"first difference at token {m['position']} (lab {m['lab']}, vLLM {m['vllm']})"
        lines.append(f"  request {m['request']}: {where}")
    return "\n".join(lines)


def run_cli(args) -> dict:
    """``--against vllm`` of ``python -m engine.tools.bench_disagg``."""
    prompts = list(PROMPTS[: args.num_prompts]) if args.num_prompts <= len(PROMPTS) else \
        [PROMPTS[i % len(PROMPTS)] + f" ({i})" for i in range(args.num_prompts)]
    say = (lambda *a: print(*a, file=sys.stderr, flush=True)) if args.json else (lambda *a: print(*a, flush=True))
    result = compare(prompts, args.output_len, args.vllm_python, args.vllm_kv_connector, say, args.lab_kv_connector)
    print(json.dumps(result, indent=2) if args.json else format_comparison(result))
    return result

