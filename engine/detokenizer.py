"""Incremental detokenization: each step decodes only a sequence's newest tokens, and streams only
the text no later token can change (vLLM's incremental detokenizer).

What: :class:`Detokenizer` keeps each sequence's text, ``texts[seq_id]``: the decoding of its output
token ids (``tokenizer.decode(output_ids, skip_special_tokens=True)``) less a trailing incomplete
character, and how much of it was already streamed. :meth:`Detokenizer.delta` hands out the text
past that point, once: joined, the deltas of a sequence are its final text, with no character
repeated and no placeholder in it.

Why hold text back: byte-level BPE (GPT-2's scheme, used by SmolLM2, Llama 3, Qwen) cuts a
character's UTF-8 bytes over tokens: '🌍' is often two or three tokens, and the decoding of the
first alone ends in U+FFFD, the replacement character. Streaming that placeholder and then the
character would show both (and a reader joining the deltas would keep both). So a trailing U+FFFD
is never part of the text: it waits until the character completes (vLLM's ``detokenize_incrementally``
does the same with its prefix and read offsets). A U+FFFD followed by more text is kept: those
bytes were not UTF-8 and no later token changes them. A character still incomplete when the
sequence ends is dropped. Stop strings are the engine's part: it holds back the last
``len(longest stop) - 1`` characters while a sequence runs (see ``engine/output_processor.py``), so that no text
that a stop string then cuts away is ever streamed.

Why decode only the newest tokens: decoding the whole output every step costs O(length) per step,
O(length^2) per request: ~35 us for 128 tokens here, paid by every running sequence in every step
(0.4 ms of a 16-request step). Where decoding is concatenation (byte-level BPE without space
clean-up) the text of ``a + b`` is the text of ``a`` plus the text of ``b`` whenever ``a``'s bytes
end at a character boundary, so only the tokens after the last such *stable* point are decoded.
Other decoders (SentencePiece's, which drops the first token's leading space; WordPiece's "##";
the clean-up of spaces before punctuation) are not concatenative, and get the whole output decoded.
"""

from __future__ import annotations

REPLACEMENT = "\ufffd"


def concatenative(tokenizer) -> bool:
    """True where ``tokenizer``'s decoding is concatenation of the tokens' bytes (byte-level BPE, no
    clean-up of spaces): :class:`Detokenizer` may then decode only the newest tokens."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    decoder = getattr(backend, "decoder", None)
    return type(decoder).__name__ == "ByteLevel" and not getattr(tokenizer, "clean_up_tokenization_spaces", False)


def complete_text(text: str) -> str:
    """``text`` less its trailing U+FFFD characters: the placeholders of a character whose bytes
    are not all decoded yet."""
    return text.rstrip(REPLACEMENT)


class Detokenizer:
    """The texts of the engine's sequences, kept up to date one token at a time.

    Args:
        tokenizer: the model's (transformers) tokenizer.
        incremental: decode only the tokens after each sequence's stable point; None: where
            :func:`concatenative` says it is exact, else the whole output every time.

    Attributes:
        texts: seq_id -> its text so far: the decoding of its output less a trailing incomplete
            character (and less what a stop string cut, after :meth:`cut`).
        emitted: seq_id -> characters of ``texts[seq_id]`` already handed out by :meth:`delta`.
    """

    def __init__(self, tokenizer, incremental: bool | None = None):
        self.tokenizer = tokenizer
        self.incremental = concatenative(tokenizer) if incremental is None else incremental
        self.texts: dict[int, str] = {}
        self.emitted: dict[int, int] = {}
        self._stable: dict[int, tuple[int, int]] = {}  # seq_id -> (tokens, characters) no later token changes

    def add(self, seq_id: int, like: int | None = None) -> None:
        """Start ``seq_id`` with no text, or as a copy of sequence ``like`` (a fork): its text, what
        of it was streamed, and its stable point. The child's deltas then continue from there."""
        self.texts[seq_id] = "" if like is None else self.texts[like]
        self.emitted[seq_id] = 0 if like is None else self.emitted[like]
        if like is not None and like in self._stable:
            self._stable[seq_id] = self._stable[like]

    def update(self, seq_id: int, output_ids: list[int]) -> str:
        """The text of ``output_ids`` (``seq_id``'s output so far, one token longer than at the last
        call, or more), less a trailing incomplete character; stored as ``texts[seq_id]`` and returned."""
        if not self.incremental:
            text = complete_text(self.tokenizer.decode(output_ids, skip_special_tokens=True))
        else:
            tokens, chars = self._stable.get(seq_id, (0, 0))
            tail = self.tokenizer.decode(output_ids[tokens:], skip_special_tokens=True)
            text = self.texts[seq_id][:chars] + complete_text(tail)
            if not tail.endswith(REPLACEMENT):
                self._stable[seq_id] = (len(output_ids), len(text))
        self.texts[seq_id] = text
        return text

    def delta(self, seq_id: int, hold: int = 0) -> str:
        """The text of ``seq_id`` not handed out before, less its last ``hold`` characters (the
        engine's stop-string buffer; 0 once the sequence is finished), marked as handed out.

        Joined over a sequence's life (forks: from the parent's, as :meth:`add` copied it), the
        deltas equal its final ``texts[seq_id]``. Never negative: text once handed out stays."""
        text, start = self.texts[seq_id], self.emitted[seq_id]
        end = max(start, len(text) - hold)
        self.emitted[seq_id] = end
        return text[start:end]

    def cut(self, seq_id: int, length: int) -> None:
        """Keep the first ``length`` characters of ``seq_id``'s text (a stop string found).

        Raises:
            ValueError: ``length`` is shorter than what was already handed out (the engine's stop
                buffer prevents it).
        """
        if length < self.emitted[seq_id]:
            raise ValueError(f"sequence {seq_id}: cannot cut its text to {length} characters, {self.emitted[seq_id]} were already streamed")
        self.texts[seq_id] = self.texts[seq_id][:length]
        self._stable.pop(seq_id, None)

    def forget(self, seq_id: int) -> None:
        """Drop ``seq_id``'s stable point (its text stays, for its request's outputs)."""
        self._stable.pop(seq_id, None)

    def remove(self, seq_id: int) -> None:
        """Drop everything kept for ``seq_id`` (its request's output was handed over)."""
        self.texts.pop(seq_id, None)
        self.emitted.pop(seq_id, None)
        self._stable.pop(seq_id, None)
