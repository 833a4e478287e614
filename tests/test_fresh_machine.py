"""A fresh machine: the README's first example answers, and no top-level name of this project is
owned by another installed distribution.

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
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUR_DISTRIBUTION = "pagedattention-lab"


def _our_top_level_names() -> set[str]:
    """Every top-level name this project installs or puts on ``sys.path`` from its root.

    The packages pyproject installs (``[tool.setuptools.packages.find] include``), and every importable
    name in the repository root (packages and modules: app_pages, lessons, app), since the root is first
    on ``sys.path`` for the app, the tests and the lessons.
    """
    include = re.search(r"\[tool\.setuptools\.packages\.find\]\s*include\s*=\s*\[([^\]]*)\]", (ROOT / "pyproject.toml").read_text())
    names = {pattern.strip().strip('"').rstrip("*") for pattern in include.group(1).split(",") if pattern.strip()}
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


def test_the_readme_question_is_answered_from_the_repository_root():
    """The README's first example, as a new user types it, from the repository root: the default model
    loads (converted once per machine) and greedy decoding answers the question."""
    result = subprocess.run(
        [sys.executable, "-m", "engine", "generate", "What is the capital of France?", "--max-tokens", "12"],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Paris" in result.stdout, result.stdout[-2000:]


def test_a_tokenizer_saved_under_a_class_name_this_transformers_lacks_still_loads(tiny_llama_dir, tmp_path):
    """One lab cache serves every environment on a machine (the floors job's transformers 4 and the
    newest transformers 5 among them): transformers 5 saves ``tokenizer_class: TokenizersBackend``,
    which transformers 4 cannot resolve. The loader reads tokenizer.json then, and tokenizes the same."""
    import json
    import shutil

    from engine.model_executor.model_loader import load_model

    copy = tmp_path / "model"
    shutil.copytree(tiny_llama_dir, copy)
    config_file = copy / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["tokenizer_class"] = "TokenizerClassFromAnotherRelease"
    config_file.write_text(json.dumps(config))
    original = load_model(str(tiny_llama_dir)).tokenizer
    loaded = load_model(str(copy)).tokenizer
    text = "What is the capital of France?"
    assert loaded(text)["input_ids"] == original(text)["input_ids"]
    assert loaded.decode(original(text)["input_ids"]) == original.decode(original(text)["input_ids"])
