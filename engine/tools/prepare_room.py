"""``python -m engine prepare-room DIR``: what a classroom without a fast network needs, made once by the teacher.

``DIR/cache`` is a filled lab cache: the default model converted to float32 safetensors and the engine's CPU
kernels built for this machine's CPU. ``DIR/wheels`` is a wheelhouse: ``pip download`` of the project's
requirements (its ``lessons`` extra too), with torch's CPU-only build, for this machine's platform and Python.
A student then installs and starts with no network (docs/classroom.md, "A classroom without a fast network")::

    pip install --no-index --find-links DIR/wheels -e .
    cp -a DIR/cache ~/lab-cache && export PAGEDATTENTION_LAB_CACHE=~/lab-cache

The cached model is read on any machine; the built kernels only on one whose CPU runs their instruction set
(avx512, avx2, generic; PAGEDATTENTION_LAB_CPU_ISA=avx2 prepares the laptops' build on an AVX-512 machine), with
the same torch and kernel sources (elsewhere they are built there, 15-30 s on 2 cores).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from engine.user_cache import CACHE_ENV_VAR

# torch's CPU-only wheels (PyPI's Linux torch wheels bring CUDA's libraries, ~3 GB more).
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
EXTRAS = ("lessons",)  # the notebooks of lessons/ need jupyterlab
BUILD_REQUIREMENTS = ("setuptools>=68", "wheel")  # `pip install --no-index -e .` builds the project with them

ROOT = Path(__file__).resolve().parents[2]


def requirements() -> list[str]:
    """The project's requirements and those of :data:`EXTRAS`, from its pyproject.toml (markers kept)."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import importlib.metadata

        wanted = [r for r in importlib.metadata.requires("pagedattention-lab") or []
                  if "extra ==" not in r or any(f'extra == "{e}"' in r for e in EXTRAS)]
        return [r.split(";")[0].strip() if "extra ==" in r else r for r in wanted]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras = [r for extra in EXTRAS for r in project.get("optional-dependencies", {}).get(extra, [])]
    return list(dict.fromkeys([*project["dependencies"], *extras]))


def pip_download_command(wheels: Path, pip_args: list[str] | None = None) -> list[str]:
    """The ``pip download`` that fills the wheelhouse (torch from :data:`TORCH_CPU_INDEX`, the rest from PyPI)."""
    return [sys.executable, "-m", "pip", "download", "--dest", str(wheels), "--extra-index-url", TORCH_CPU_INDEX,
            *(pip_args or []), *requirements(), *BUILD_REQUIREMENTS]


def prepare_room(directory: Path, wheels: bool = True, pip_args: list[str] | None = None,
                 progress: Callable[[str, float], None] | None = None) -> dict:
    """Fill ``directory/cache`` (the default model converted, the CPU kernels built) and, with ``wheels``,
    ``directory/wheels``; write ``directory/README.txt`` with the students' commands.

    Returns:
        ``{"cache": path, "wheels": path or None, "kernels": True when they were built}``.

    Raises:
        engine.model_executor.model_loader.ModelLoadError: the model cannot be fetched or converted.
        OSError: pip download failed (its last lines), or the directory cannot be written.
    """
    from engine.cpu import ops as cpu_ops
    from engine.model_executor.model_loader import resolve_model

    directory = directory.expanduser().resolve()
    cache = directory / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    os.environ[CACHE_ENV_VAR] = str(cache)  # this process's model and kernels go there
    build = cpu_ops.load_kernel_in_background(progress)  # into cache/cpu_kernels, while the model is fetched and converted
    resolve_model(None, progress)
    if build is not None:
        build.join()
    built = cpu_ops.load_kernel()
    wheel_dir = None
    if wheels:
        wheel_dir = directory / "wheels"
        wheel_dir.mkdir(exist_ok=True)
        command = pip_download_command(wheel_dir, pip_args)
        if progress is not None:
            progress("Downloading the project's wheels with pip (about 1.5 GB with torch's CPU build)", 0.0)
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            said = "\n".join((result.stderr or result.stdout).strip().splitlines()[-5:])
            raise OSError(f"pip download failed ({' '.join(command[1:5])} ...):\n{said}")
        if progress is not None:
            progress("Downloading the project's wheels with pip (about 1.5 GB with torch's CPU build)", 1.0)
    (directory / "README.txt").write_text(_readme(directory, wheel_dir is not None), encoding="utf-8")
    return {"cache": cache, "wheels": wheel_dir, "kernels": built}


def _readme(directory: Path, wheels: bool) -> str:
    install = (f"pip install --no-index --find-links {directory / 'wheels'} -e .\n" if wheels
               else "(no wheelhouse here: install as README.md says, with the network)\n")
    return (
        "PagedAttention Lab, prepared for a classroom without a fast network (docs/classroom.md).\n\n"
        "On each student's machine, in a checkout of the lab, inside a fresh virtual environment:\n\n"
        f"  {install}"
        f"  cp -a {directory / 'cache'} ~/lab-cache\n"
        "  export PAGEDATTENTION_LAB_CACHE=~/lab-cache      (Windows: set PAGEDATTENTION_LAB_CACHE=%USERPROFILE%\\lab-cache)\n"
        "  python -m engine generate \"What is the capital of France?\" --max-tokens 12\n\n"
        "The wheels are for the teacher's platform and Python; the built CPU kernels are used where the CPU,\n"
        "torch and the kernel sources are the same (elsewhere they are built once, 15-30 s on 2 cores).\n"
    )
