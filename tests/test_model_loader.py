"""Tests for engine.model_executor.model_loader: the default model, local HF directories, and every refusal.

The first run converts SmolLM2-135M-Instruct from GGUF (5-10 s, once per cache);
later runs read the cached safetensors in about a second.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
import torch
import transformers

from engine.model_executor.model_loader import (
    DEFAULT_GGUF_SHA256,
    DEFAULT_MODEL,
    LoadedModel,
    ModelLoadError,
    default_gguf_path,
    load_model,
    resolve_model,
    verify_sha256,
)

# SmolLM2-135M: 30 layers, hidden size 576, 9 query heads and 3 KV heads of size 64, MLP 1536.
NUM_LAYERS, HIDDEN, NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, MLP, VOCAB = 30, 576, 9, 3, 64, 1536, 49152


@pytest.fixture(scope="session")
def default_model() -> LoadedModel:
    start = time.perf_counter()
    loaded = load_model()
    print(f"\nfirst load_model() in this session: {time.perf_counter() - start:.1f} s")
    return loaded


@pytest.mark.slow
def test_default_model_config(default_model: LoadedModel) -> None:
    config = default_model.config
    assert default_model.name == DEFAULT_MODEL
    assert isinstance(config, transformers.LlamaConfig)
    assert config.model_type == "llama"
    assert (config.num_hidden_layers, config.hidden_size) == (NUM_LAYERS, HIDDEN)
    assert (config.num_attention_heads, config.num_key_value_heads) == (NUM_HEADS, NUM_KV_HEADS)
    assert config.vocab_size == VOCAB
    assert not hasattr(config, "quantization_config"), "the cached copy is plain float32, not GGUF-quantized"


@pytest.mark.slow
def test_default_model_directory(default_model: LoadedModel) -> None:
    path = resolve_model()
    assert path == default_model.path
    assert (path / "config.json").is_file()
    assert list(path.glob("*.safetensors"))
    assert not list(path.glob("*.bin"))


@pytest.mark.slow
def test_default_model_tensor_names_and_shapes(default_model: LoadedModel) -> None:
    weights = default_model.state_dict
    kv = NUM_KV_HEADS * HEAD_DIM
    expected_per_layer = {
        "input_layernorm.weight": (HIDDEN,),
        "self_attn.q_proj.weight": (NUM_HEADS * HEAD_DIM, HIDDEN),
        "self_attn.k_proj.weight": (kv, HIDDEN),
        "self_attn.v_proj.weight": (kv, HIDDEN),
        "self_attn.o_proj.weight": (HIDDEN, NUM_HEADS * HEAD_DIM),
        "post_attention_layernorm.weight": (HIDDEN,),
        "mlp.gate_proj.weight": (MLP, HIDDEN),
        "mlp.up_proj.weight": (MLP, HIDDEN),
        "mlp.down_proj.weight": (HIDDEN, MLP),
    }
    expected = {f"model.layers.{i}.{k}": v for i in range(NUM_LAYERS) for k, v in expected_per_layer.items()}
    expected["model.embed_tokens.weight"] = (VOCAB, HIDDEN)
    expected["model.norm.weight"] = (HIDDEN,)
    expected["lm_head.weight"] = (VOCAB, HIDDEN)
    assert {name: tuple(t.shape) for name, t in weights.items()} == expected
    assert all(t.dtype == torch.float32 for t in weights.values())
    # SmolLM2 ties the output projection to the embedding matrix.
    assert default_model.config.tie_word_embeddings
    assert weights["lm_head.weight"] is weights["model.embed_tokens.weight"]
    # Dequantized weights are real numbers, not zeros or garbage.
    q = weights["model.layers.0.self_attn.q_proj.weight"]
    assert torch.isfinite(q).all() and q.abs().mean() > 1e-3


@pytest.mark.slow
def test_default_tokenizer_round_trips_and_has_chat_template(default_model: LoadedModel) -> None:
    tokenizer = default_model.tokenizer
    text = "PagedAttention stores the KV cache in fixed-size blocks."
    ids = tokenizer(text).input_ids
    assert 0 < len(ids) < len(text)
    assert tokenizer.decode(ids, skip_special_tokens=True) == text
    assert tokenizer.chat_template
    messages = [{"role": "user", "content": "Hi!"}]
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert "<|im_start|>user\nHi!<|im_end|>" in prompt
    assert prompt.endswith("<|im_start|>assistant\n")


@pytest.mark.slow
def test_second_load_reads_the_cache(default_model: LoadedModel) -> None:
    start = time.perf_counter()
    again = load_model(DEFAULT_MODEL, dtype=torch.bfloat16)
    print(f"\ncached load_model() in bfloat16: {time.perf_counter() - start:.2f} s")
    assert again.path == default_model.path
    embed = again.state_dict["model.embed_tokens.weight"]
    assert embed.dtype == torch.bfloat16
    assert torch.equal(embed, default_model.state_dict["model.embed_tokens.weight"].to(torch.bfloat16))


@pytest.mark.slow
def test_hash_check_rejects_a_changed_byte(tmp_path: Path) -> None:
    copy = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    shutil.copyfile(default_gguf_path(), copy)
    verify_sha256(copy, DEFAULT_GGUF_SHA256)  # the intact copy passes
    with open(copy, "r+b") as f:
        f.seek(1234)
        byte = f.read(1)
        f.seek(1234)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(ModelLoadError) as caught:
        verify_sha256(copy, DEFAULT_GGUF_SHA256)
    message = str(caught.value)
    assert DEFAULT_GGUF_SHA256 in message
    actual = [word for word in message.replace(".", " ").split() if len(word) == 64 and word != DEFAULT_GGUF_SHA256]
    assert actual, "the message names the actual hash too"
    assert not copy.exists(), "the corrupted file is deleted"


def test_unknown_local_path_fails_fast(tmp_path: Path) -> None:
    missing = str(tmp_path / "no" / "such" / "model")
    start = time.perf_counter()
    with pytest.raises(ModelLoadError, match="neither a local path"):
        resolve_model(missing)
    with pytest.raises(ModelLoadError, match="neither a local path"):
        resolve_model(missing + ".gguf")
    assert time.perf_counter() - start < 60


def test_unreachable_hub_id_fails_fast() -> None:
    repo_id = "pagedattention-lab/this-model-does-not-exist"
    start = time.perf_counter()
    with pytest.raises(ModelLoadError) as caught:
        load_model(repo_id)
    elapsed = time.perf_counter() - start
    print(f"\nhub failure reported after {elapsed:.1f} s")
    assert repo_id in str(caught.value)
    assert "neither a local path nor reachable" in str(caught.value)
    assert elapsed < 60


def _write_config(directory: Path, model_type: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps({"model_type": model_type}))


def test_pickled_weights_only_are_refused(tmp_path: Path) -> None:
    _write_config(tmp_path, "llama")
    torch.save({"w": torch.zeros(2)}, tmp_path / "pytorch_model.bin")
    with pytest.raises(ModelLoadError, match="safetensors") as caught:
        load_model(str(tmp_path))
    assert "pytorch_model.bin" in str(caught.value)


def test_unsupported_model_type_is_refused(tmp_path: Path) -> None:
    _write_config(tmp_path, "gpt2")
    with pytest.raises(ModelLoadError) as caught:
        load_model(str(tmp_path))
    message = str(caught.value)
    assert "gpt2" in message and "llama" in message and "qwen3" in message


def test_directory_without_config_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="config.json"):
        resolve_model(str(tmp_path))


@pytest.mark.parametrize("text", ['{"model_type": "llama",\n', "[1, 2]"])
def test_a_broken_config_json_is_named(tmp_path: Path, text: str) -> None:
    (tmp_path / "config.json").write_text(text)
    with pytest.raises(ModelLoadError) as caught:
        load_model(str(tmp_path))
    assert str(tmp_path / "config.json") in str(caught.value) and "is not valid" in str(caught.value)


def test_a_broken_config_json_is_named_by_the_cli(tmp_path: Path) -> None:
    import subprocess
    import sys

    (tmp_path / "config.json").write_text('{"model_type": "llama",\n')
    result = subprocess.run([sys.executable, "-m", "engine", "generate", "hi", "--model", str(tmp_path)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    assert f"{tmp_path / 'config.json'} is not valid JSON" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_tiny_local_llama_directory_loads_as_is(tmp_path: Path, default_model: LoadedModel) -> None:
    config = transformers.LlamaConfig(
        vocab_size=len(default_model.tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    torch.manual_seed(0)
    reference = transformers.LlamaForCausalLM(config)
    reference.save_pretrained(tmp_path)
    default_model.tokenizer.save_pretrained(tmp_path)

    stages: list[tuple[str, float]] = []
    loaded = load_model(str(tmp_path), progress=lambda stage, fraction: stages.append((stage, fraction)))

    assert loaded.path == tmp_path and loaded.name == str(tmp_path)
    assert loaded.config.num_hidden_layers == 2 and loaded.config.num_key_value_heads == 2
    expected = reference.state_dict()
    assert set(loaded.state_dict) == set(expected)
    for name, tensor in expected.items():
        assert torch.equal(loaded.state_dict[name], tensor), name
    assert loaded.tokenizer("hello world").input_ids == default_model.tokenizer("hello world").input_ids
    assert stages and all(0.0 <= fraction <= 1.0 for _, fraction in stages)
    assert stages[-1][1] == 1.0


def test_ctrl_c_in_the_cli_is_one_line(tiny_llama_dir: Path) -> None:
    import signal
    import subprocess
    import sys

    cmd = [sys.executable, "-u", "-m", "engine", "generate", "Tell me a long story.", "--model", str(tiny_llama_dir),
           "--max-tokens", "1000", "--num-gpu-blocks-override", "128"]
    # SIGINT as a terminal's Ctrl-C delivers it (a shell's background job would inherit it ignored).
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    for line in proc.stderr:  # the per-step lines go to stderr
        if line.startswith("step    1"):  # the engine is running
            break
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130
    assert err.strip().splitlines()[-1] == "interrupted" and "Traceback" not in err


@pytest.mark.parametrize("failure", ["OSError", "SafetensorError"])
def test_a_full_disk_during_the_conversion_is_one_line_naming_the_cache(tmp_path: Path, monkeypatch, failure: str) -> None:
    """The conversion's writes fail as a full disk fails them: an OSError with ENOSPC, or safetensors'
    own error wrapping it. The loader says so in one line (the CLI prints a ModelLoadError as one
    line) naming the cache directory and the space needed, and leaves no half-written directory."""
    import errno

    import safetensors

    from engine.model_executor import model_loader

    def write_until_full(gguf_path: Path, out_dir: Path) -> None:
        (out_dir / "model.safetensors").write_bytes(b"\0" * 1024)
        if failure == "OSError":
            raise OSError(errno.ENOSPC, "No space left on device")
        raise safetensors.SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(model_loader, "_save_gguf_as_hf", write_until_full)
    out_dir = tmp_path / "cache" / "SmolLM2-135M-Instruct"
    with pytest.raises(ModelLoadError) as caught:
        model_loader._convert_gguf(default_gguf_path(), out_dir, None)
    message = str(caught.value)
    assert "\n" not in message and "no space left" in message and str(out_dir.parent) in message and "MB free" in message
    assert "about 543 MB" in message, "4 bytes for each of the model's 135 M weights, and the tokenizer"
    assert list((tmp_path / "cache").iterdir()) == [], "the temporary directory is removed"
