"""The engine's layers (engine/__init__.py, pyproject's [tool.importlinter]): the model-free part runs
without torch, importing the engine has no side effect, the import contracts hold, and no module
imports itself round a cycle (imports inside functions included)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

import engine

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "transformers", "triton", "matplotlib", "streamlit", "paged_kernels")


def _run(code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)


def test_a_simulation_through_the_public_api_loads_no_torch():
    code = (
        "import json, os, sys\n"
        "from engine import simulate\n"
        "result = simulate(workload='sharegpt', num_requests=1000)\n"
        f"heavy = sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})\n"
        "print(json.dumps([result.completed + result.rejected, heavy, os.environ.get('TRITON_INTERPRET')]))\n"
    )
    done = _run(code)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout) == [1000, [], None]


def test_importing_the_engine_sets_no_triton_interpreter_choosing_triton_does():
    code = (
        "import os, sys, engine, engine.llm_engine\n"
        "before = os.environ.get('TRITON_INTERPRET')\n"
        "import torch\n"
        "from engine.model_executor.model_runner import triton_backend\n"
        "backend = triton_backend()\n"
        "print(before, os.environ.get('TRITON_INTERPRET'), torch.cuda.is_available(), backend.name)\n"
    )
    done = _run(code)
    assert done.returncode == 0, done.stderr[-2000:]
    before, after, cuda, name = done.stdout.split()
    assert before == "None" and name == "triton"
    assert after == ("None" if cuda == "True" else "1")


def test_every_public_name_resolves_lazily():
    assert set(engine.__all__) <= set(dir(engine))
    for name in engine.__all__:
        value = getattr(engine, name)
        assert getattr(value, "__name__", name) == name, name
    with pytest.raises(AttributeError, match="no attribute 'simulator'"):
        getattr(engine, "simulator")  # the flat module paths are gone (the simulator is in engine/sim/)


def test_the_import_contracts_hold():
    """`lint-imports` with pyproject's contracts: the layers in order; core, baselines, sim and
    experiments without torch/transformers/Triton; no UI library in engine/; kernels free of serving."""
    done = subprocess.run([sys.executable, "-c", "from importlinter.cli import lint_imports_command; lint_imports_command()", "--no-cache"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "4 kept, 0 broken" in done.stdout, done.stdout[-3000:]


def test_no_import_cycles():
    """Strongly connected components of the module import graph (function-local imports count)."""
    sys.path.insert(0, str(ROOT))
    graph = grimp.build_graph("engine", "visualize", "paged_kernels", "app_pages", exclude_type_checking_imports=True)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(module: str) -> None:  # Tarjan
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in graph.find_modules_directly_imported_by(module):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    assert cycles == []
