"""Shared fixtures: tiny randomly initialised models in real Hugging Face format, built on the spot.

They carry the default model's tokenizer (so text and chat templates work) and load through the same
path as any local model directory; only their sizes are small, so a test runs in seconds.
"""

from __future__ import annotations

from pathlib import Path

import paged_kernels  # noqa: F401  first: without a GPU it sets TRITON_INTERPRET=1, which Triton reads once, on its import
import pytest
import torch
import transformers

from engine.config import GEMMA_MODEL
from engine.model_executor.model_loader import LoadedModel, load_model, load_tokenizer, resolve_model

TINY_SIZES = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=1024,
    rms_norm_eps=1e-6,
)


@pytest.fixture(scope="session")
def cpu_kernels_built() -> bool:
    """The engine's CPU kernels, built (or found built) once, before a test that times an app run.

    A fresh machine's first build takes 10-60 s, more on a busy one, and a checkout whose sources sit
    at another path rebuilds them (ninja sees new source paths); counted inside AppTest's timeout, that
    build failed the first app test. Returns whether they loaded (the app then says which path runs).
    """
    from engine.cpu import ops as cpu_ops

    return cpu_ops.load_kernel()


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    """The default model (SmolLM2-135M-Instruct), fetched and converted once per machine."""
    return resolve_model(None)


@pytest.fixture(scope="session")
def gemma_loaded() -> LoadedModel:
    """Gemma 3 270M (the extra "gemma"), converted once per machine and loaded once per test session in
    float32 (1.1 GB); engines built on it share its tensors (``LLMEngine(..., loaded_model=...)``)."""
    return load_model(GEMMA_MODEL)


@pytest.fixture(scope="session")
def gemma_hf(gemma_loaded):
    """transformers' own ``Gemma3ForCausalLM`` on the same converted folder, float32 on CPU, once per session."""
    return transformers.AutoModelForCausalLM.from_pretrained(gemma_loaded.path, dtype=torch.float32).eval()


def make_tiny_model(directory: Path, model_type: str, tokenizer_dir: Path, seed: int = 0, **overrides) -> Path:
    """Save a randomly initialised llama / qwen2 / qwen3 / gemma3_text model with the default tokenizer in ``directory``."""
    tokenizer = load_tokenizer(Path(tokenizer_dir))
    sizes = dict(TINY_SIZES, vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    sizes.update(overrides)
    config_class = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config, "qwen3": transformers.Qwen3Config,
                    "gemma3_text": transformers.Gemma3TextConfig}[model_type]
    if model_type in ("qwen3", "gemma3_text"):
        sizes.setdefault("head_dim", 32)  # Qwen3's and Gemma's head_dim is its own setting, not hidden / heads
    if model_type == "gemma3_text":  # a sliding-window layer, then a full one; a window short prompts cross
        sizes.update(layer_types=["sliding_attention", "full_attention"], sliding_window=8, query_pre_attn_scalar=24)
    config = config_class(**sizes)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config)
    model.save_pretrained(directory, safe_serialization=True)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory, default_model_dir) -> Path:
    """A 2-layer Llama (hidden 64, 4 query heads, 2 KV heads) with random weights, as a local HF directory."""
    return make_tiny_model(tmp_path_factory.mktemp("tiny-llama"), "llama", default_model_dir)


@pytest.fixture(scope="session")
def tiny_gemma_dir(tmp_path_factory, default_model_dir) -> Path:
    """A 2-layer Gemma 3 (a sliding-window layer of window 8, then a full one) with random weights, as a local HF directory."""
    return make_tiny_model(tmp_path_factory.mktemp("tiny-gemma"), "gemma3_text", default_model_dir)
