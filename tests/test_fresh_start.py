"""A fresh machine's first start (engine/model_executor/model_loader.py, engine/cpu/ops.py): the GGUF is converted
by the gguf package to exactly what transformers' own GGUF loading gives; a module that fails to import is named
with its distribution and version; the load needs no network, with Hugging Face's `kernels` installed or not."""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import safetensors.torch
import torch

from engine.model_executor import model_loader

ROOT = Path(__file__).resolve().parent.parent

# Prepended to a subprocess's code: modules named in BROKEN are found but fail to import (a broken installation);
# those in ABSENT are not installed at all (importlib.util.find_spec returns None for them).
HOOKS = '''
import importlib.abc, importlib.util, sys
class _Broken(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        return importlib.util.spec_from_loader(name, self) if name in BROKEN else None
    def create_module(self, spec):
        return None
    def exec_module(self, module):
        raise ImportError(f"{module.__name__} is broken (the test's import hook)", name=module.__name__)
sys.meta_path.insert(0, _Broken())
for name in ABSENT:
    sys.modules[name] = None
'''


def _run(code: str, cache: Path, broken=(), absent=(), **env) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter at the repository root, with the hooks above and ``cache`` as the lab cache."""
    full = f"BROKEN = {list(broken)!r}\nABSENT = {list(absent)!r}\n{HOOKS}\n{code}"
    environ = {**os.environ, model_loader.CACHE_ENV_VAR: str(cache), "PYTHONPATH": str(ROOT), **env}
    return subprocess.run([sys.executable, "-c", full], cwd=ROOT, env=environ, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def gguf_cache(tmp_path_factory, default_model_dir) -> Path:
    """A lab cache holding only the default model's GGUF (as if downloaded): a start converts it."""
    cache = tmp_path_factory.mktemp("cache")
    gguf = model_loader.default_gguf_path(progress=lambda *_: None)
    (cache / "downloads").mkdir()
    shutil.copyfile(gguf, cache / "downloads" / gguf.name)
    return cache


def _convert_with_transformers(gguf: Path, out: Path) -> None:
    """The conversion through a transformers model (from_pretrained with gguf_file, then save_pretrained): the oracle."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out, safe_serialization=True)
    transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(out)


@pytest.mark.slow
def test_the_gguf_conversion_is_transformers_bit_for_bit(tmp_path, gguf_cache, monkeypatch):
    monkeypatch.setenv("USE_HUB_KERNELS", "0")  # the oracle's from_pretrained would ask the Hub for a GGUF kernel
    gguf = next((gguf_cache / "downloads").glob("*.gguf"))
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    ours.mkdir()
    model_loader._save_gguf_as_hf(gguf, ours)
    _convert_with_transformers(gguf, theirs)
    a, b = safetensors.torch.load_file(ours / "model.safetensors"), safetensors.torch.load_file(theirs / "model.safetensors")
    assert sorted(a) == sorted(b) and len(a) == 272  # 30 layers x 9 + embedding and final norm (tied lm_head)
    for name in b:
        assert a[name].dtype == b[name].dtype == torch.float32 and a[name].shape == b[name].shape, name
        assert torch.equal(a[name].view(torch.int32), b[name].view(torch.int32)), f"{name} differs"  # bits, NaNs too
    # llama.cpp permutes llama's q and k rows, which the conversion undoes: without that, q would differ
    q = a["model.layers.0.self_attn.q_proj.weight"]
    assert not torch.equal(torch.from_numpy(model_loader._unpermute_rows(q.numpy(), 9)), q)
    assert json.loads((ours / "config.json").read_text()) == json.loads((theirs / "config.json").read_text())
    for name in ("tokenizer.json", "generation_config.json", "chat_template.jinja"):
        assert (ours / name).read_bytes() == (theirs / name).read_bytes(), name


def test_a_module_that_fails_to_import_is_named_with_its_distribution_and_version(default_model_dir):
    module = "transformers.models.llama.configuration_llama"
    code = """
from engine.model_executor.model_loader import load_model, ModelLoadError
try:
    load_model(None, progress=lambda *_: None)
except ModelLoadError as error:
    print("ERROR:", error)
"""
    result = _run(code, default_model_dir.parent.parent, broken=[module])
    message = next(line for line in result.stdout.splitlines() if line.startswith("ERROR:"))
    version = importlib.metadata.version("transformers")
    assert module in message and f"transformers {version}" in message, message
    assert "cannot be read as a model configuration" not in message
    assert len(message.splitlines()) == 1


@pytest.mark.slow
def test_a_broken_gguf_package_is_named_when_a_model_is_converted(tmp_path, gguf_cache):
    gguf = next((gguf_cache / "downloads").glob("*.gguf"))
    code = f"""
from engine.model_executor.model_loader import load_model, ModelLoadError
try:
    load_model({str(gguf)!r}, progress=lambda *_: None)
except ModelLoadError as error:
    print("ERROR:", error)
"""
    result = _run(code, tmp_path, broken=["gguf"])
    assert "ERROR:" in result.stdout, result.stderr[-2000:]
    message = next(line for line in result.stdout.splitlines() if line.startswith("ERROR:"))
    assert "the module gguf failed to import" in message and f"gguf {importlib.metadata.version('gguf')}" in message, message


OFFLINE_LOAD = """
import socket, sys
asked = []
def refuse(self, address, *args):  # no network: any connection is recorded and refused
    asked.append(repr(address))
    raise OSError("no network in this test")
socket.socket.connect = refuse
try:
    import transformers.integrations.hub_kernels as hub_kernels  # transformers 5: Hugging Face's kernels, from the Hub
    def fetch(*args, **kwargs):
        asked.append(f"hub kernel {args}")
        raise OSError("no network in this test")
    hub_kernels.get_kernel = fetch
except ImportError:  # transformers 4
    pass
import transformers
def build(cls, *args, **kwargs):  # from_pretrained of a model is where transformers 5 turns use_kernels on
    asked.append(f"{cls.__name__}.from_pretrained")
    raise RuntimeError("no transformers model in this test")
transformers.PreTrainedModel.from_pretrained = classmethod(build)
from engine.model_executor.model_loader import load_model
loaded = load_model(None, progress=lambda *_: None)
ids = loaded.tokenizer("What is the capital of France?").input_ids
print("ASKED", asked)
print("LOADED", len(loaded.state_dict), len(ids))
"""
# Any request to the Hub fails at once: offline, and an endpoint where nothing listens.
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"}


@pytest.mark.slow
def test_the_default_model_converts_and_loads_offline_with_or_without_hugging_faces_kernels(gguf_cache):
    """transformers 5's PreTrainedModel.from_pretrained turns use_kernels on when it is not given and USE_HUB_KERNELS
    is not set, and its GGUF loading may then ask the Hub for a ggml kernel (through Hugging Face's `kernels`);
    the lab builds no transformers model (no from_pretrained of a model), so none of that runs, and no connection
    is opened."""
    converted = _run(OFFLINE_LOAD, gguf_cache, **OFFLINE)  # `kernels` installed (transformers 5 brings it)
    assert "LOADED 273 " in converted.stdout, converted.stderr[-3000:]  # 272 tensors + the tied lm_head
    assert "ASKED []" in converted.stdout, converted.stdout
    absent = _run(OFFLINE_LOAD, gguf_cache, absent=["kernels"], **OFFLINE)  # converted now: the load alone
    assert "LOADED 273 " in absent.stdout and "ASKED []" in absent.stdout, absent.stderr[-3000:]


@pytest.mark.slow
def test_prepare_room_fills_a_cache_with_which_a_later_start_converts_and_builds_nothing(tmp_path, gguf_cache, cpu_kernels_built):
    from engine.cpu import ops as cpu_ops

    room = tmp_path / "room"
    (room / "cache").mkdir(parents=True)
    shutil.copytree(gguf_cache / "downloads", room / "cache" / "downloads")  # the GGUF, as if fetched from PyPI
    if cpu_kernels_built:  # this machine's build (the fixture's) stands in for the command's own, saving 30 s
        built = cpu_ops.build_directory()
        shutil.copytree(built, cpu_ops.build_directory(room / "cache" / "cpu_kernels"), ignore=shutil.ignore_patterns("*lock"))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    made = subprocess.run([sys.executable, "-m", "engine", "prepare-room", str(room), "--no-wheels"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert made.returncode == 0, made.stderr[-3000:]
    assert "Converting" in made.stderr and (room / "cache" / "models" / model_loader.DEFAULT_MODEL / "model.safetensors").is_file()
    assert "PAGEDATTENTION_LAB_CACHE" in (room / "README.txt").read_text()
    student = tmp_path / "student-cache"
    shutil.copytree(room / "cache", student)  # cp -a: what docs/classroom.md tells a student to do
    started = subprocess.run([sys.executable, "-m", "engine", "generate", "What is the capital of France?", "--max-tokens", "12",
                              "--json"], cwd=ROOT, env={**env, model_loader.CACHE_ENV_VAR: str(student)},
                             capture_output=True, text=True, timeout=900)
    assert started.returncode == 0, started.stderr[-3000:]
    for stage in ("Downloading", "Converting", "Building the engine's CPU kernels"):
        assert stage not in started.stderr, started.stderr[-3000:]
    assert "first token" in started.stderr  # the CLI's stage lines, with their seconds
    assert "Paris" in json.loads(started.stdout)["outputs"][0]["text"]


def test_prepare_room_downloads_torchs_cpu_build_and_the_projects_requirements(tmp_path):
    result = subprocess.run([sys.executable, "-m", "engine", "prepare-room", str(tmp_path), "--print-pip-command"],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    line = result.stdout.strip()
    assert " -m pip download --dest " in line and "https://download.pytorch.org/whl/cpu" in line
    for requirement in ("'torch>=", "'transformers>=", "'gguf>=", "'streamlit>=", "'jupyterlab>=", "'setuptools>="):
        assert requirement in line, requirement


GENERATE = """
import runpy, sys
sys.argv = ["engine", "generate", "What is the capital of France?", "--max-tokens", "4", "--json"]
runpy.run_module("engine", run_name="__main__")
"""

KERNEL_LAB = """
from streamlit.testing.v1 import AppTest
import paged_kernels
assert paged_kernels.unavailable_reason() is not None
PAGE = '''
import streamlit as st
st.session_state["lang"] = {lang!r}
from app_pages import kernel_lab
kernel_lab.page()
'''
for lang in ("en", "zh"):
    at = AppTest.from_string(PAGE.format(lang=lang), default_timeout=120).run()
    assert not at.exception, at.exception
    print("WARNING", lang, [w.value for w in at.warning])
"""


@pytest.mark.slow
def test_without_triton_or_a_compiler_the_engine_runs_and_the_kernel_lab_says_so_in_one_line(tmp_path, default_model_dir):
    cache = tmp_path / "cache"
    (cache / "models").mkdir(parents=True)
    (cache / "models" / default_model_dir.name).symlink_to(default_model_dir)  # the model, but no built CPU kernels
    bare = tmp_path / "bin"  # a PATH with no compiler on it
    bare.mkdir()
    no_compiler = {"PATH": str(bare), "CXX": str(bare / "c++"), "CC": str(bare / "cc")}
    generated = _run(GENERATE, cache, absent=["triton"], **no_compiler)
    assert generated.returncode == 0, generated.stderr[-3000:]
    assert json.loads(generated.stdout)["outputs"][0]["token_ids"], generated.stdout
    assert "could not be built" in generated.stderr  # the one warning: torch runs the steps instead
    assert not list((cache / "cpu_kernels").glob("*/*.so"))
    lab = _run(KERNEL_LAB, cache, absent=["triton"], **no_compiler)
    assert lab.returncode == 0, lab.stderr[-3000:]
    from visualize.i18n import t

    for lang in ("en", "zh"):
        line = next(line for line in lab.stdout.splitlines() if line.startswith(f"WARNING {lang}"))
        assert t("kernel_no_triton", lang) in line and "\\n" not in t("kernel_no_triton", lang)
    assert "Triton" in t("kernel_no_triton", "en") and "Triton" in t("kernel_no_triton", "zh")
