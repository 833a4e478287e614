"""The OpenAI API's request fields this server reads, checked one by one (vLLM's ``protocol.py``).

A field the server does not implement is refused with a 400 that names it, never silently
ignored; a field OpenAI defines but the server does not implement is accepted only at its neutral
value (e.g. ``presence_penalty: 0``), where it asks for nothing. Errors use OpenAI's JSON shape,
``{"error": {"message", "type", "param", "code"}}``, ``param`` naming the field.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from engine.sampling_params import SamplingParams


class APIError(Exception):
    """A request refused with an HTTP status and OpenAI's error body.

    Args:
        status_code: 400 (a bad field), 401, 403 (not the teacher token), 404 (unknown model), 409, 413, 415 (not
            JSON), 429, 500, 503.
        message: what is wrong, naming the field and the value.
        param: the request field at fault (None when none is).
        headers: extra response headers (429's ``Retry-After``, 401's ``WWW-Authenticate``).
    """

    TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error",
             409: "conflict_error", 413: "invalid_request_error", 415: "invalid_request_error",
             429: "rate_limit_error", 500: "server_error", 503: "server_error"}

    def __init__(self, status_code: int, message: str, param: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status_code, self.message, self.param, self.headers = status_code, message, param, headers or {}

    def body(self) -> dict:
        return error_body(self.message, self.TYPES.get(self.status_code, "invalid_request_error"), self.param, self.status_code)


def error_body(message: str, type_: str, param: str | None, code: int | str | None) -> dict:
    """OpenAI's error object."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


MAX_USER_CHARS = 128  # a `user` label: the classroom shows it on a projector and re-sends it to every viewer
MAX_STOP_STRINGS = 64  # the engine looks for every stop string in the text on every step (vLLM does not cap them)
MAX_STOP_CHARS = 4096  # all of a request's stop strings together
JSON_CONTENT_TYPES = ("application/json",)  # and any application/*+json

# Fields both endpoints read, then each endpoint's own.
COMMON_FIELDS = {"model", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "n", "stream", "stream_options",
                 "user", "ignore_eos", "return_token_ids", "kv_transfer_params"}
COMPLETION_FIELDS = COMMON_FIELDS | {"prompt"}
CHAT_FIELDS = COMMON_FIELDS | {"messages", "max_completion_tokens"}

# OpenAI fields this server does not implement, and the values at which they ask for nothing.
NEUTRAL_VALUES = {
    "frequency_penalty": (0, 0.0),
    "presence_penalty": (0, 0.0),
    "repetition_penalty": (1, 1.0),
    "logprobs": (False,),
    "top_logprobs": (0,),
    "logit_bias": ({},),
    "echo": (False,),
    "best_of": (1,),
    "suffix": ("",),
    "tools": ([],),
    "tool_choice": ("none",),
    "parallel_tool_calls": (False,),
    "response_format": ({"type": "text"},),
    "store": (False,),
    "metadata": ({},),
}


@dataclass
class GenerateRequest:
    """One /v1/completions or /v1/chat/completions request, checked.

    Attributes:
        model: the model asked for (None = the served one).
        prompt: text or token ids (completions) or chat messages (chat).
        max_tokens: new tokens per choice; None = the room left in ``max_model_len`` (chat, as vLLM).
        sampling: the SamplingParams fields, checked (``max_tokens`` and ``n`` apart).
        n: choices (parallel samples, paper §4.4).
        stream: send server-sent events; include_usage: end the stream with a usage chunk.
        user: the caller's end-user id (OpenAI's field): on a server without API keys, the request's
            client (its label in the classroom, its per-client limits); at most :data:`MAX_USER_CHARS`.
        max_tokens_name: the field ``max_tokens`` came from ("max_tokens" or "max_completion_tokens").
        return_token_ids: vLLM's extra field: each choice (each stream chunk) also carries its
            generated ``token_ids`` (a stream chunk: the ones it adds).
        kv_transfer_params: vLLM's extra field for prefill/decode disaggregation (an object, passed
            to the engine, which checks it; ``engine/kv_transfer/``); None without it.
    """

    model: str | None
    prompt: str | list[int] | list[dict]
    max_tokens: int | None
    sampling: dict = field(default_factory=dict)
    n: int = 1
    stream: bool = False
    include_usage: bool = False
    user: str | None = None
    max_tokens_name: str = "max_tokens"
    return_token_ids: bool = False
    kv_transfer_params: dict | None = None

    @property
    def prompt_field(self) -> str:
        """The field that carries the prompt: "messages" (chat) or "prompt"."""
        return "messages" if isinstance(self.prompt, list) and isinstance(self.prompt[0], dict) else "prompt"

    def sampling_params(self, max_tokens: int) -> SamplingParams:
        """The engine's :class:`~engine.SamplingParams` for this request.

        Raises:
            APIError: 400 naming the field SamplingParams refused.
        """
        try:
            return SamplingParams(max_tokens=max_tokens, n=self.n, **self.sampling)
        except ValueError as error:
            raise APIError(400, str(error), str(error).split(" ", 1)[0]) from None


def parse_completion(body, default_temperature: float = 1.0) -> GenerateRequest:
    """A /v1/completions body: ``prompt`` is a string, a list of token ids, or a list of one of them.
    ``max_tokens`` defaults to 16, OpenAI's and vLLM's default for completions; ``temperature`` to
    ``default_temperature`` (OpenAI's 1.0; the server passes its room's sampling, ``--default-temperature``).

    Raises:
        APIError: 400 naming the first bad field.
    """
    _check_fields(body, COMPLETION_FIELDS)
    if "prompt" not in body:
        raise APIError(400, "'prompt' is required", "prompt")
    prompt = body["prompt"]
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        raise APIError(400, f"'prompt' holds {len(prompt)} prompts: this server takes one prompt per request", "prompt")
    if isinstance(prompt, str):
        if not prompt:
            raise APIError(400, "'prompt' is empty", "prompt")
    elif not (isinstance(prompt, list) and prompt and all(_is_int(t) and t >= 0 for t in prompt)):
        raise APIError(400, "'prompt' must be a non-empty string or a non-empty list of token ids", "prompt")
    return _common(body, prompt, body.get("max_tokens", 16), "max_tokens", default_temperature)


def parse_chat(body, default_temperature: float = 1.0) -> GenerateRequest:
    """A /v1/chat/completions body: ``messages`` of ``{"role", "content"}``, content a string or a
    list of text parts. ``max_completion_tokens`` (OpenAI's newer name) or ``max_tokens``; neither
    = the room left in max_model_len. ``temperature`` defaults to ``default_temperature``.

    Raises:
        APIError: 400 naming the first bad field.
    """
    _check_fields(body, CHAT_FIELDS)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise APIError(400, "'messages' must be a non-empty list of {'role', 'content'} objects", "messages")
    checked = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise APIError(400, f"'{where}' must be an object with 'role' and 'content'", where)
        for key in message:
            if key not in ("role", "content") and not (key == "name" and message[key] is None):
                raise APIError(400, f"'{where}.{key}' is not supported by this server (only 'role' and 'content')", f"{where}.{key}")
        role = message.get("role")
        if role not in ("system", "user", "assistant"):
            raise APIError(400, f"'{where}.role' must be 'system', 'user' or 'assistant', got {role!r}", f"{where}.role")
        checked.append({"role": role, "content": _message_text(message.get("content"), f"{where}.content")})
    if "max_completion_tokens" in body and body.get("max_tokens") is not None:
        raise APIError(400, "give 'max_completion_tokens' or 'max_tokens', not both", "max_tokens")
    name = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    return _common(body, checked, body.get(name), name, default_temperature)


def _message_text(content, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise APIError(400, f"'{where}[{j}]' is not supported: only {{'type': 'text', 'text': ...}} parts (the model reads text)", f"{where}[{j}]")
            texts.append(part["text"])
        return "".join(texts)
    raise APIError(400, f"'{where}' must be a string or a list of text parts", where)


def _check_fields(body, supported: set[str]) -> None:
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object", None)
    for name, value in body.items():
        if name in supported or value is None:
            continue
        if name in NEUTRAL_VALUES:
            if any(value == v and isinstance(value, bool) == isinstance(v, bool) for v in NEUTRAL_VALUES[name]):
                continue
            raise APIError(400, f"'{name}' is not supported by this server (only {json.dumps(NEUTRAL_VALUES[name][0])}, which asks for nothing); got {json.dumps(value)}", name)
        raise APIError(400, f"unknown field '{name}': this server does not implement it", name)


def _common(body: dict, prompt, max_tokens, max_tokens_name: str, default_temperature: float = 1.0) -> GenerateRequest:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise APIError(400, f"'model' must be a string, got {model!r}", "model")
    if max_tokens is not None and (not _is_int(max_tokens) or max_tokens < 1):
        raise APIError(400, f"'{max_tokens_name}' must be an integer >= 1, got {max_tokens!r}", max_tokens_name)
    sampling = {}
    temperature = _get(body, "temperature", default_temperature)
    if not _is_number(temperature) or not 0 <= temperature < math.inf:
        raise APIError(400, f"'temperature' must be a number >= 0 (0 = greedy), got {temperature!r}", "temperature")
    sampling["temperature"] = float(temperature)
    top_p = _get(body, "top_p", 1.0)
    if not _is_number(top_p) or not 0 < top_p <= 1:
        raise APIError(400, f"'top_p' must be a number in (0, 1], got {top_p!r}", "top_p")
    sampling["top_p"] = float(top_p)
    top_k = _get(body, "top_k", -1)
    if not _is_int(top_k) or top_k < -1:
        raise APIError(400, f"'top_k' must be -1 or 0 (all tokens) or a positive integer, got {top_k!r}", "top_k")
    sampling["top_k"] = top_k
    seed = body.get("seed")
    if seed is not None and (not _is_int(seed) or not 0 <= seed < 2**63):
        raise APIError(400, f"'seed' must be an integer in [0, 2**63), got {seed!r}", "seed")
    sampling["seed"] = seed
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and not (isinstance(stop, list) and all(isinstance(s, str) and s for s in stop)):
        raise APIError(400, f"'stop' must be a string or a list of non-empty strings, got {stop!r}", "stop")
    if stop and len(stop) > MAX_STOP_STRINGS:
        raise APIError(400, f"'stop' holds {len(stop)} strings; this server takes at most {MAX_STOP_STRINGS}", "stop")
    if stop and sum(map(len, stop)) > MAX_STOP_CHARS:
        raise APIError(400, f"'stop' holds {sum(map(len, stop))} characters in all; this server takes at most {MAX_STOP_CHARS}", "stop")
    sampling["stop"] = stop or []
    ignore_eos = _get(body, "ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise APIError(400, f"'ignore_eos' must be true or false, got {ignore_eos!r}", "ignore_eos")
    sampling["ignore_eos"] = ignore_eos
    n = _get(body, "n", 1)
    if not _is_int(n) or n < 1:
        raise APIError(400, f"'n' must be an integer >= 1, got {n!r}", "n")
    stream = _get(body, "stream", False)
    if not isinstance(stream, bool):
        raise APIError(400, f"'stream' must be true or false, got {stream!r}", "stream")
    include_usage = False
    options = body.get("stream_options")
    if options is not None:
        if not stream:
            raise APIError(400, "'stream_options' is only allowed when 'stream' is true", "stream_options")
        if not isinstance(options, dict):
            raise APIError(400, "'stream_options' must be an object", "stream_options")
        for key, value in options.items():
            if key != "include_usage" and value is not None:
                raise APIError(400, f"'stream_options.{key}' is not supported by this server (only include_usage)", f"stream_options.{key}")
        include_usage = options.get("include_usage") or False
        if not isinstance(include_usage, bool):
            raise APIError(400, "'stream_options.include_usage' must be true or false", "stream_options.include_usage")
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise APIError(400, f"'user' must be a string, got {user!r}", "user")
    if user is not None and len(user) > MAX_USER_CHARS:
        raise APIError(400, f"'user' has {len(user)} characters; at most {MAX_USER_CHARS} (it labels the request)", "user")
    return_token_ids = _get(body, "return_token_ids", False)
    if not isinstance(return_token_ids, bool):
        raise APIError(400, f"'return_token_ids' must be true or false, got {return_token_ids!r}", "return_token_ids")
    kv_transfer_params = body.get("kv_transfer_params")
    if kv_transfer_params is not None and not isinstance(kv_transfer_params, dict):
        raise APIError(400, "'kv_transfer_params' must be an object", "kv_transfer_params")
    return GenerateRequest(model, prompt, max_tokens, sampling, n, stream, include_usage, user, max_tokens_name, return_token_ids,
                           kv_transfer_params)


def _get(body: dict, name: str, default):
    value = body.get(name)
    return default if value is None else value


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# ---- the body ---------------------------------------------------------------------------------------


async def read_json_body(raw, limit: int, empty=None):
    """The request body as JSON: a JSON content type, at most ``limit`` bytes, well-formed, and every
    string in it (keys included) encodable as UTF-8. Every endpoint that takes a body reads it here,
    so that nothing a request carries can break what the server later sends to others.

    Args:
        raw: the Starlette request.
        limit: the largest body, bytes.
        empty: what an empty body stands for (None: an empty body is not JSON, 400).

    Raises:
        APIError: 415 (a body whose ``Content-Type`` is not JSON: a browser sends JSON as
            ``text/plain`` cross-site without asking first, CORS' "simple request"), 413 beyond
            ``limit``, 400 naming ``body`` (not JSON, nested too deeply, an integer of more digits
            than Python parses) or the field whose text holds a lone UTF-16 surrogate.
    """
    declared = raw.headers.get("content-length")
    too_big = APIError(413, f"the request body is larger than {limit} bytes (--max-request-body-bytes)", "body")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_big
    chunks, size = [], 0
    async for chunk in raw.stream():
        size += len(chunk)
        if size > limit:
            raise too_big
        chunks.append(chunk)
    data = b"".join(chunks)
    if not data and empty is not None:
        return empty
    media_type = raw.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if not (media_type in JSON_CONTENT_TYPES or (media_type.startswith("application/") and media_type.endswith("+json"))):
        raise APIError(415, f"the request body must be JSON sent with 'Content-Type: application/json', got "
                       f"{media_type or 'no Content-Type'!r}", "body")
    try:
        body = json.loads(data)
    except (ValueError, RecursionError) as error:  # JSONDecodeError, UnicodeDecodeError, an integer of > 4300 digits
        what = "nested too deeply" if isinstance(error, RecursionError) else str(error)
        raise APIError(400, f"the request body is not valid JSON: {what}", "body") from None
    check_text(body)
    return body


def check_text(value, where: str = "") -> None:
    """Every string in a parsed JSON value (keys included) can be encoded as UTF-8.

    Python's ``json`` accepts an escaped lone UTF-16 surrogate (``"\\ud800"``), which no UTF-8
    encoder, tokenizer or JSON response takes later.

    Raises:
        APIError: 400 naming the field, e.g. ``user``, ``messages[0].content``, ``stop[2]``.
    """
    stack = [(value, where)]
    while stack:  # not recursive: the value may be as deep as the JSON parser allows
        item, path = stack.pop()
        if isinstance(item, str):
            _encodable(item, path or "body")
        elif isinstance(item, dict):
            for key, child in item.items():
                _encodable(key, path or "body")
                stack.append((child, f"{path}.{key}" if path else key))
        elif isinstance(item, list):
            stack.extend((child, f"{path}[{i}]") for i, child in enumerate(item))


def _encodable(text: str, path: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise APIError(400, f"'{path}' holds text that cannot be encoded as UTF-8 (a lone UTF-16 surrogate, "
                       f"{text[error.start]!r} at character {error.start})", path) from None
