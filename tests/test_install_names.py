"""Import names: no top-level name of this project is owned by another installed distribution.

Python has one namespace for top-level imports. When two distributions install the same top-level name,
the one found first on ``sys.path`` wins: from the repository root (``streamlit run app.py``,
``python -m pytest``) our folder shadows the other distribution's package, and from anywhere else theirs
shadows ours. transformers depends on Hugging Face's ``kernels`` distribution, which is why the lab's
Triton package is ``paged_kernels`` (README, "Layout").
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUR_DISTRIBUTION = "pagedattention-lab"


def _our_top_level_names() -> set[str]:
    """Every top-level name this project installs or puts on ``sys.path`` from its root.

    The packages pyproject installs (``[tool.setuptools.packages.find] include``), and every importable
    name in the repository root (packages and modules: app_pages, lessons, app), since the root is first
    on ``sys.path`` for the app, the tests and the lessons.
    """
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    names = {pattern.rstrip("*") for pattern in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]}
    for entry in ROOT.iterdir():
        if entry.name.startswith((".", "_")) or entry.name == "tests":
            continue
        if entry.is_dir() and (entry / "__init__.py").is_file():
            names.add(entry.name)
        elif entry.suffix == ".py":
            names.add(entry.stem)
    return names


def _owners(name: str) -> set[str]:
    """The installed distributions that provide top-level ``name``, ours left out (names normalised as pip does)."""
    owners = importlib.metadata.packages_distributions().get(name, [])
    return {owner for owner in owners if owner.lower().replace("_", "-") != OUR_DISTRIBUTION}


def test_the_project_installs_the_packages_it_names():
    names = _our_top_level_names()
    assert {"engine", "paged_kernels", "visualize", "app_pages", "lessons", "app"} <= names, names
    assert "kernels" not in names, "the Triton package must not be called plain `kernels` (see the module docstring)"


def test_no_top_level_name_is_shared_with_another_installed_distribution():
    clashes = {name: sorted(_owners(name)) for name in sorted(_our_top_level_names()) if _owners(name)}
    assert not clashes, (
        f"these top-level names are also installed by other distributions, so one shadows the other: {clashes}. "
        "Rename ours (the import name and every reference to it)."
    )


def test_the_clash_check_sees_a_real_clash():
    """The check above reads real metadata: a name that an installed distribution owns is found."""
    owners = importlib.metadata.packages_distributions()
    assert "torch" in owners and owners["torch"], "packages_distributions() should list torch's top-level name"
    assert _owners("torch"), "torch's top-level name should be owned by the torch distribution"


def test_transformers_model_classes_import_with_the_repository_root_first_on_sys_path():
    """As `streamlit run app.py` and `python -m pytest` import them: the repository root first on sys.path.

    transformers imports optional integrations at import time (its hub kernels among them); none of our
    folders may stand in for one of them.
    """
    code = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "import transformers\n"
        "from transformers import LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, AutoModelForCausalLM\n"
        "import transformers.activations, transformers.modeling_utils\n"
        "import engine, paged_kernels, visualize\n"
        "print(LlamaForCausalLM.__module__, Qwen3ForCausalLM.__module__, paged_kernels.__file__)\n"
    )
    result = subprocess.run([sys.executable, "-c", code, str(ROOT)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "transformers.models.llama" in result.stdout and str(ROOT / "paged_kernels") in result.stdout, result.stdout
