"""Incremental detokenization (engine/detokenizer.py): after every token, the text is exactly what
decoding the whole output gives less a trailing incomplete character, including outputs that split a
character's bytes over tokens, special tokens, forks and stop strings; the streamed deltas join into
the final text with no character repeated and no U+FFFD; tokenizers whose decoding is not
concatenation decode whole."""

from __future__ import annotations

import pytest
import transformers
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.detokenizer import REPLACEMENT, Detokenizer, complete_text, concatenative
from engine.model_executor.model_loader import load_tokenizer

# Characters of 2-4 UTF-8 bytes, which byte-level BPE often cuts between tokens.
AWKWARD = "é中文字符😀🚀ĳ€ﬁ𝔘ñ日本語"


@pytest.fixture(scope="module")
def tokenizer(default_model_dir):
    return load_tokenizer(default_model_dir)


def test_the_default_tokenizer_is_concatenative(tokenizer):
    assert concatenative(tokenizer) and Detokenizer(tokenizer).incremental


def token_ids(tokenizer):
    """Any token id, biased towards pieces of multi-byte characters and special tokens."""
    pieces = sorted({i for ch in AWKWARD for i in tokenizer(ch, add_special_tokens=False).input_ids})
    byte_tokens = [i for i in range(len(tokenizer)) if len(tokenizer.convert_ids_to_tokens(i)) == 1][:300]
    special = tokenizer.all_special_ids
    return st.one_of(st.integers(0, len(tokenizer) - 1), st.sampled_from(pieces), st.sampled_from(byte_tokens), st.sampled_from(special))


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_every_step_equals_decoding_the_whole_output(tokenizer, data):
    ids = data.draw(st.lists(token_ids(tokenizer), min_size=1, max_size=40))
    steps = data.draw(st.lists(st.integers(1, 3), min_size=len(ids), max_size=len(ids)))
    detok = Detokenizer(tokenizer, incremental=True)
    detok.add(7)
    n = 0
    for k in steps:
        n = min(n + k, len(ids))
        assert detok.update(7, ids[:n]) == complete_text(tokenizer.decode(ids[:n], skip_special_tokens=True))
        if n == len(ids):
            break


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_a_fork_continues_from_its_parents_text(tokenizer, data):
    prefix = data.draw(st.lists(token_ids(tokenizer), min_size=1, max_size=15))
    a = data.draw(st.lists(token_ids(tokenizer), min_size=1, max_size=10))
    b = data.draw(st.lists(token_ids(tokenizer), min_size=1, max_size=10))
    detok = Detokenizer(tokenizer, incremental=True)
    detok.add(0)
    for n in range(1, len(prefix) + 1):
        detok.update(0, prefix[:n])
    detok.add(1, like=0)
    for n in range(1, max(len(a), len(b)) + 1):
        for seq_id, tail in ((0, a), (1, b)):
            ids = prefix + tail[:n]
            assert detok.update(seq_id, ids) == complete_text(tokenizer.decode(ids, skip_special_tokens=True))


def test_a_split_character_is_held_back_until_complete(tokenizer):
    ids = tokenizer("a 😀 b", add_special_tokens=False).input_ids
    assert any(tokenizer.decode(ids[:n]).endswith(REPLACEMENT) for n in range(1, len(ids))), "the emoji spans tokens"
    detok = Detokenizer(tokenizer, incremental=True)
    detok.add(0)
    texts = [detok.update(0, ids[:n]) for n in range(1, len(ids) + 1)]
    assert texts == [tokenizer.decode(ids[:n]).rstrip(REPLACEMENT) for n in range(1, len(ids) + 1)]
    assert texts[-1] == "a 😀 b" and not any(REPLACEMENT in t for t in texts)


# Answers of the kinds the default model gives, each with a character split over tokens (checked).
ANSWERS = ["你好！我很好，谢谢。", "Café à la mode, très élégant — ça va ?", "Hello 🌍🚀 👨\u200d🔬 👉🏿 bye"]


@pytest.mark.parametrize("answer", ANSWERS, ids=["chinese", "french", "emoji"])
def test_streamed_deltas_join_into_the_text_with_nothing_repeated_and_no_placeholder(tokenizer, answer):
    ids = tokenizer(answer, add_special_tokens=False).input_ids
    assert any(tokenizer.decode(ids[:n]).endswith(REPLACEMENT) for n in range(1, len(ids))), "a character spans tokens"
    detok = Detokenizer(tokenizer)
    detok.add(0)
    deltas = []
    for n in range(1, len(ids) + 1):
        detok.update(0, ids[:n])
        deltas.append(detok.delta(0))
        assert "".join(deltas) == detok.texts[0] == tokenizer.decode(ids[:n]).rstrip(REPLACEMENT)
    assert "".join(deltas) == answer and not any(REPLACEMENT in d for d in deltas)
    # A fork halfway continues from its parent's streamed text: its deltas complete the same answer.
    half = len(ids) // 2
    detok.add(1)
    parent = ""
    for n in range(1, half + 1):
        detok.update(1, ids[:n])
        parent += detok.delta(1)
    detok.add(2, like=1)
    child = ""
    for n in range(half + 1, len(ids) + 1):
        detok.update(2, ids[:n])
        child += detok.delta(2)
    assert parent + child == answer


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_deltas_held_back_or_not_join_into_the_final_text(tokenizer, data):
    ids = data.draw(st.lists(token_ids(tokenizer), min_size=1, max_size=30))
    holds = data.draw(st.lists(st.integers(0, 4), min_size=len(ids), max_size=len(ids)))
    detok = Detokenizer(tokenizer)
    detok.add(3)
    streamed = ""
    for n, hold in enumerate(holds, start=1):
        detok.update(3, ids[:n])
        streamed += detok.delta(3, hold=0 if n == len(ids) else hold)
        assert detok.texts[3].startswith(streamed)
    assert streamed == detok.texts[3] == complete_text(tokenizer.decode(ids, skip_special_tokens=True))


def test_text_already_streamed_cannot_be_cut(tokenizer):
    detok = Detokenizer(tokenizer)
    detok.add(0)
    detok.update(0, tokenizer("stop here", add_special_tokens=False).input_ids)
    assert detok.delta(0, hold=3) == "stop h"
    with pytest.raises(ValueError, match="already streamed"):
        detok.cut(0, 2)
    detok.cut(0, 6)
    assert detok.delta(0) == "" and detok.texts[0] == "stop h"


def test_other_decoders_decode_the_whole_output():
    vocab = {"[UNK]": 0, "play": 1, "##ing": 2, "run": 3}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.decoder = decoders.WordPiece()  # "##" joins a piece to the previous one: not concatenation
    wordpiece = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")
    assert not concatenative(wordpiece)
    detok = Detokenizer(wordpiece)
    assert not detok.incremental
    detok.add(0)
    assert [detok.update(0, [1, 2, 3][:n]) for n in (1, 2, 3)] == ["play", "playing", "playing run"]
    backend.decoder = decoders.Metaspace()  # drops the first token's leading space
    assert not concatenative(transformers.PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]"))


def test_the_engine_streams_the_same_text_and_cuts_at_a_stop_string(tiny_llama_dir):
    engine = LLMEngine(EngineConfig(model=str(tiny_llama_dir), num_gpu_blocks=64))
    assert engine.detokenizer.incremental
    free = engine.add_request("Paged attention", SamplingParams(max_tokens=24, ignore_eos=True))
    streamed = ""
    while engine.has_unfinished_requests():
        streamed += engine.step().new_text.get(free, "")
    out = engine.get_output(free)
    assert streamed == out.text == complete_text(engine.tokenizer.decode(out.token_ids, skip_special_tokens=True))
    stop = out.text[len(out.text) // 2 :][:3]
    assert stop.strip()
    # Streamed with the stop buffer: no character of a stop string (cut away) is ever streamed.
    # A stop at every place in the text; some start inside a token's text, so that streaming all
    # decoded text at once would have streamed their first characters.
    starts = [k for k in range(len(out.text) - 2) if out.text[k : k + 3].strip() and out.text.find(out.text[k : k + 3]) == k]
    bounds = {len(engine.tokenizer.decode(out.token_ids[:n], skip_special_tokens=True)) for n in range(1, len(out.token_ids))}
    assert any(k < b < k + 3 for k in starts for b in bounds), "some stop string must start inside a step's text"
    cuts = {engine.add_request("Paged attention", SamplingParams(max_tokens=24, ignore_eos=True, stop=["never seen", out.text[k : k + 3]])): k
            for k in starts}
    deltas = {rid: "" for rid in cuts}
    while engine.has_unfinished_requests():
        report = engine.step()
        for rid in cuts:
            deltas[rid] += report.new_text.get(rid, "")
    for rid, k in cuts.items():
        stopped = engine.get_output(rid)
        assert stopped.finish_reason == "stop" and stopped.text == out.text[:k] == deltas[rid]
