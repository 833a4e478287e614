"""The lab's handle on one running vLLM: a subprocess in vLLM's own Python (engine/vllm_bridge/runner.py).

vLLM loads once (it compiles the model with torch.compile at every start: 60-100 s on 2 cores) and
then answers commands, so the bench can alternate engine and vLLM runs in one session.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path

from engine.vllm_bridge.env import RUNNER, VLLMUnavailable, runtime_env

STDERR_TAIL_LINES = 15


class VLLMProcess:
    """vLLM's ``LLMEngine`` in a subprocess, loaded with one job's settings and requests.

    Args:
        python: an interpreter that imports vLLM (:func:`engine.vllm_bridge.env.resolve_python`).
        job: the runner's job (see engine/vllm_bridge/runner.py): model directory, block_size,
            num_gpu_blocks (null block included), max_num_seqs, max_num_batched_tokens,
            max_model_len, enable_prefix_caching, and ``requests`` with prompt token ids.
        kv_cache_gib: VLLM_CPU_KVCACHE_SPACE in GiB.

    Start-up begins at once; :meth:`wait_ready` blocks until vLLM has loaded. Use as a context
    manager, or call :meth:`close`.

    Raises:
        VLLMUnavailable: vLLM exits or answers nonsense; the message ends with the last lines vLLM
            wrote to stderr.
    """

    def __init__(self, python: str | Path, job: dict, kv_cache_gib: float = 1.0):
        self._dir = tempfile.TemporaryDirectory(prefix="pagedattention-vllm-")
        job_path = Path(self._dir.name) / "job.json"
        job_path.write_text(json.dumps(job))
        self._stderr = open(Path(self._dir.name) / "stderr.log", "w+")
        self._proc = subprocess.Popen(
            [str(python), str(RUNNER), str(job_path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self._stderr, text=True, env=runtime_env(kv_cache_gib),
        )
        self.ready: dict | None = None

    def wait_ready(self) -> dict:
        """Block until vLLM has loaded; returns {"load_s", "vllm_version", "settings" (as vLLM took them)}."""
        if self.ready is None:
            self.ready = self._read()
        return self.ready

    def generate(self, max_tokens: list[int] | None = None, logprobs: bool = False) -> dict:
        """Run every request of the job once (all at time 0); {"seconds", "token_ids" per request}, and
        with ``logprobs`` "logprobs": each chosen token's log-probability per request.
        ``max_tokens`` overrides each request's (e.g. a short warm-up)."""
        return self._ask({"cmd": "generate", "max_tokens": max_tokens, "logprobs": logprobs})

    def replay(self) -> dict:
        """Run the job's requests with per-step stats: {"seconds", "token_ids", "steps", "metrics"}."""
        return self._ask({"cmd": "replay"})

    def close(self) -> None:
        if self._proc.poll() is None:
            try:
                self._proc.stdin.write('{"cmd": "quit"}\n')
                self._proc.stdin.flush()
                self._proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self._proc.kill()
                self._proc.wait()
        self._stderr.close()
        self._dir.cleanup()

    def __enter__(self) -> "VLLMProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _ask(self, cmd: dict) -> dict:
        self.wait_ready()
        try:
            self._proc.stdin.write(json.dumps(cmd) + "\n")
            self._proc.stdin.flush()
        except OSError:
            pass  # it died: _read says why
        return self._read()

    def _read(self) -> dict:
        line = self._proc.stdout.readline()
        try:
            return json.loads(line)
        except json.JSONDecodeError:
            self._proc.wait(timeout=30)
            self._stderr.seek(0)
            tail = "\n".join(self._stderr.read().strip().splitlines()[-STDERR_TAIL_LINES:])
            raise VLLMUnavailable(f"vLLM stopped (exit {self._proc.returncode}); its last words:\n{tail}") from None
