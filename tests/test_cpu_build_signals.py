"""A start killed during the first CPU-kernel build leaves no compiler running (engine/cpu/ops.py).

SIGTERM is what a closed terminal or ``kill`` sends: unlike a terminal's Ctrl-C it reaches one process,
not its process group, so a build's ninja and cc1plus would live on as orphans and the next start
would build beside them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
COMPILERS = ("ninja", "cc1plus", "c++", "g++", "gcc", "cc")


def _processes() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command name) of every process."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                found[int(entry.name)] = (int(fields[1]), (entry / "comm").read_text().strip())
            except (OSError, IndexError, ValueError):
                pass
    return found


def _descendants(pid: int) -> dict[int, str]:
    table = _processes()
    out, frontier = {}, [pid]
    while frontier:
        parent = frontier.pop()
        for child, (ppid, name) in table.items():
            if ppid == parent and child not in out:
                out[child] = name
                frontier.append(child)
    return out


def _alive(pid: int, name: str) -> bool:
    try:
        return (Path("/proc") / str(pid) / "comm").read_text().strip() == name and \
            (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL])
def test_a_killed_build_leaves_no_compiler_running(tmp_path, how):
    code = "import sys; from engine.cpu import ops as cpu_ops; cpu_ops.load_kernel(build_root=sys.argv[1])"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    start = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    compilers: dict[int, str] = {}
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not any(n == "cc1plus" for n in compilers.values()):
        assert start.poll() is None, start.stderr.read()
        compilers.update({p: n for p, n in _descendants(start.pid).items() if n in COMPILERS})
        time.sleep(0.1)
    assert any(n == "cc1plus" for n in compilers.values()), "the build never reached the compiler"
    time.sleep(0.5)
    compilers.update({p: n for p, n in _descendants(start.pid).items() if n in COMPILERS})
    start.send_signal(how)  # to the process alone, as a closed terminal's SIGHUP/SIGTERM or `kill` does
    start.wait(timeout=30)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and any(_alive(p, n) for p, n in compilers.items()):
        time.sleep(0.2)
    survivors = {p: n for p, n in compilers.items() if _alive(p, n)}
    assert survivors == {}, f"still running after the start was killed: {survivors}"
