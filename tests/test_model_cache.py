"""The converted model cache (engine/model_executor/model_loader.py): a damaged cache is noticed and converted again from
the checksummed GGUF, and a model directory that cannot be loaded is one line naming the file."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.model_executor import model_loader
from engine.model_executor.model_loader import CACHE_RECORD, DEFAULT_MODEL, ModelLoadError, cache_problem, load_model


def _flip_bit(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x01]))


@pytest.fixture(scope="module")
def fresh_cache(tmp_path_factory, default_model_dir) -> Path:
    """A cache directory of its own, holding the default GGUF (no download) and its conversion."""
    cache = tmp_path_factory.mktemp("cache")
    gguf = model_loader.default_gguf_path()
    (cache / "downloads").mkdir()
    shutil.copyfile(gguf, cache / "downloads" / gguf.name)
    old = os.environ.get(model_loader.CACHE_ENV_VAR)
    os.environ[model_loader.CACHE_ENV_VAR] = str(cache)
    try:
        model_loader.resolve_model(None, progress=lambda *_: None)
    finally:
        if old is None:
            del os.environ[model_loader.CACHE_ENV_VAR]
        else:
            os.environ[model_loader.CACHE_ENV_VAR] = old
    return cache


@pytest.mark.slow
def test_the_conversion_records_its_files_and_the_check_is_cheap(fresh_cache):
    out = fresh_cache / "models" / DEFAULT_MODEL
    record = json.loads((out / CACHE_RECORD).read_text())["files"]
    assert record["model.safetensors"]["size"] == (out / "model.safetensors").stat().st_size > 500_000_000
    assert {"config.json", "tokenizer.json", "model.safetensors"} <= set(record)
    start = time.perf_counter()
    assert cache_problem(out) is None
    elapsed = time.perf_counter() - start
    print(f"\ncache check of an intact cache: {elapsed * 1000:.2f} ms")
    assert elapsed < 0.05  # sizes and times only: nothing is hashed


@pytest.mark.slow
def test_each_kind_of_damage_is_named(fresh_cache, tmp_path):
    out = fresh_cache / "models" / DEFAULT_MODEL
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)  # copy2: the same modification times
    assert cache_problem(copy) is None

    os.utime(copy / "config.json")  # touched, not changed: hashed once, then trusted again
    assert cache_problem(copy) is None
    assert json.loads((copy / CACHE_RECORD).read_text())["files"]["config.json"]["mtime_ns"] == (copy / "config.json").stat().st_mtime_ns

    _flip_bit(copy / "model.safetensors", 300_000_000)
    start = time.perf_counter()
    assert cache_problem(copy) == "model.safetensors changed since it was converted (another SHA-256)"
    print(f"\ncache check that hashes model.safetensors: {time.perf_counter() - start:.2f} s")
    _flip_bit(copy / "model.safetensors", 300_000_000)  # back as it was (a newer time: hashed, accepted)
    assert cache_problem(copy) is None

    with open(copy / "model.safetensors", "r+b") as f:
        f.truncate(1000)
    assert cache_problem(copy) == "model.safetensors has 1,000 bytes, not the 538,090,408 it was converted with"
    (copy / "model.safetensors").unlink()  # a cache with a config but no weights
    assert cache_problem(copy) == "model.safetensors is missing"
    (copy / CACHE_RECORD).unlink()
    assert "has no record of its files" in cache_problem(copy)
    assert cache_problem(tmp_path / "nothing") == "it has not been converted yet"


@pytest.mark.slow
def test_a_flipped_bit_is_converted_again_and_generate_answers(fresh_cache):
    """The reported failure: one flipped bit in the cached weights made `generate` print an empty answer."""
    out = fresh_cache / "models" / DEFAULT_MODEL
    weights = out / "model.safetensors"
    good = json.loads((out / CACHE_RECORD).read_text())["files"]["model.safetensors"]["sha256"]
    _flip_bit(weights, 123_456_789)
    env = dict(os.environ, **{model_loader.CACHE_ENV_VAR: str(fresh_cache)})
    result = subprocess.run([sys.executable, "-m", "engine", "generate", "What is 2 + 2?", "--max-tokens", "8", "--no-cpu-kernels",
                             "--quiet"], capture_output=True, text=True, timeout=900, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "is damaged (model.safetensors changed since it was converted (another SHA-256)); converting it again" in result.stderr
    assert "2 + 2" in result.stdout and "The answer" in result.stdout  # the greedy answer, as from an intact cache
    assert model_loader.sha256_of(weights, lambda *_: None) == good
    assert cache_problem(out) is None


# ---- local directories that cannot be loaded: one line naming the file -------------------------------


def _tiny_copy(tiny_llama_dir: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "model"
    shutil.copytree(tiny_llama_dir, copy)
    return copy


@pytest.mark.parametrize("damage, message", [
    ("empty", "model.safetensors is not a readable safetensors file"),
    ("truncated", "model.safetensors is not a readable safetensors file"),
    ("random", "model.safetensors is not a readable safetensors file"),
])
def test_an_unreadable_safetensors_file_is_named(tiny_llama_dir, tmp_path, damage, message):
    model = _tiny_copy(tiny_llama_dir, tmp_path)
    weights = model / "model.safetensors"
    size = weights.stat().st_size
    if damage == "empty":
        weights.write_bytes(b"")
    elif damage == "truncated":
        with open(weights, "r+b") as f:
            f.truncate(size // 2)
    else:
        weights.write_bytes(os.urandom(4096))
    with pytest.raises(ModelLoadError) as error:
        load_model(str(model), progress=lambda *_: None)
    assert message in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize("field, value, message", [
    ("hidden_size", "64", "hidden_size is \"64\", not a positive integer"),
    ("num_hidden_layers", 0, "num_hidden_layers is 0, not a positive integer"),
    ("rms_norm_eps", "small", "rms_norm_eps is \"small\", not a positive number"),
    ("num_key_value_heads", 3, "num_attention_heads 4 is not a multiple of num_key_value_heads 3"),
    ("vocab_size", [1], "vocab_size is [1], not a positive integer"),
])
def test_a_config_field_of_the_wrong_type_is_named(tiny_llama_dir, tmp_path, field, value, message):
    model = _tiny_copy(tiny_llama_dir, tmp_path)
    config = json.loads((model / "config.json").read_text())
    config[field] = value
    (model / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError) as error:
        load_model(str(model), progress=lambda *_: None)
    assert message in str(error.value) and str(model / "config.json") in str(error.value)


def test_the_cli_says_one_line_for_each(tiny_llama_dir, tmp_path):
    model = _tiny_copy(tiny_llama_dir, tmp_path)
    (model / "model.safetensors").write_bytes(b"\0" * 7)
    result = subprocess.run([sys.executable, "-m", "engine", "generate", "hi", "--model", str(model), "--no-cpu-kernels"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(f"error: {model / 'model.safetensors'} is not a readable safetensors file")
