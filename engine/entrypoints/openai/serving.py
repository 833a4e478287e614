"""/v1/completions and /v1/chat/completions over :class:`~engine.entrypoints.async_llm.AsyncLLM`:
tokenize, check lengths, generate, and shape the answer, whole or as server-sent events (vLLM's
``OpenAIServingCompletion`` and ``OpenAIServingChat``).
"""

from __future__ import annotations

import asyncio
import copy
import json
import time
import uuid
from typing import AsyncIterator, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse

from engine.entrypoints.async_llm import AsyncLLM, EngineStopping, RequestDelta
from engine.entrypoints.openai.protocol import APIError, GenerateRequest, error_body

DISCONNECT_POLL_S = 0.5  # how often a non-streaming request checks that its client is still there


class OpenAIServing:
    """The two generation endpoints of one served model.

    Args:
        llm: the running :class:`AsyncLLM`.
        model_name: the name clients give as ``model`` (``--served-model-name``).

    The server tokenizes with its own copy of the model's tokenizer, as vLLM's API server does in
    its own process: the engine's thread never waits for it.
    """

    def __init__(self, llm: AsyncLLM, model_name: str):
        self.llm = llm
        self.model_name = model_name
        self.tokenizer = copy.deepcopy(llm.engine.tokenizer)
        self.vocab_size = llm.engine.hf_config.vocab_size
        self.max_model_len = llm.engine.max_model_len
        # vLLM's words when max_model_len is as asked; the pool's when the pool caps it (a lone request must finish)
        self.context_limit = (llm.engine.max_model_len_limit() if llm.engine.max_model_len_capped_by_pool
                              else f"this model's maximum context length is {self.max_model_len} tokens")

    # ---- before the engine --------------------------------------------------------------------

    def prompt_token_ids(self, request: GenerateRequest, chat: bool) -> list[int]:
        """The prompt's token ids: text as ``LLMEngine.encode`` tokenizes it, chat messages through
        the model's chat template (with the generation prompt), token ids checked against the vocabulary.

        Raises:
            APIError: 400 naming ``prompt`` or ``messages``.
        """
        if chat:
            if not self.tokenizer.chat_template:
                raise APIError(400, "this model has no chat template: use /v1/completions", "messages")
            text = self.tokenizer.apply_chat_template(request.prompt, add_generation_prompt=True, tokenize=False)
            return self.tokenizer(text, add_special_tokens=False).input_ids
        if isinstance(request.prompt, str):
            return self.tokenizer(request.prompt).input_ids
        bad = [t for t in request.prompt if t >= self.vocab_size]
        if bad:
            raise APIError(400, f"'prompt' has token ids outside the vocabulary [0, {self.vocab_size}): {bad[:5]}", "prompt")
        return list(request.prompt)

    def max_tokens(self, request: GenerateRequest, num_prompt_tokens: int, chat: bool) -> int:
        """New tokens per choice: the request's ``max_tokens``, or (chat, not given) the room left.

        Raises:
            APIError: 400 naming the prompt when it leaves no room in ``max_model_len``, or
                ``max_tokens`` when prompt + max_tokens exceed it (vLLM's rule).
        """
        room = self.max_model_len - num_prompt_tokens
        if room < 1:
            field = "messages" if chat else "prompt"
            raise APIError(400, f"{self.context_limit}; the {field} has "
                           f"{num_prompt_tokens} tokens, which leaves no room to generate", field)
        if request.max_tokens is None:
            return room
        if request.max_tokens > room:
            name = request.max_tokens_name
            raise APIError(400, f"{self.context_limit}; you asked for "
                           f"{num_prompt_tokens + request.max_tokens} ({num_prompt_tokens} in the prompt, {request.max_tokens} "
                           f"in the completion): lower {name} to at most {room}", name)
        return request.max_tokens

    async def add(self, ids: list[int], request: GenerateRequest, max_tokens: int, client: str) -> int:
        """Queue the request in the engine; returns its request_id.

        Raises:
            APIError: 400 (the engine refused it: e.g. its n samples can never fit in the KV
                pool), 503 (shutting down).
        """
        params = request.sampling_params(max_tokens)
        try:
            return await self.llm.add_request(ids, params, client, request.kv_transfer_params)
        except EngineStopping as error:
            raise APIError(503, str(error)) from None
        except ValueError as error:
            field = "kv_transfer_params" if str(error).startswith("kv_transfer_params") else "n" if request.n > 1 else request.prompt_field
            raise APIError(400, str(error), field) from None

    # ---- whole answers ------------------------------------------------------------------------

    async def complete(self, raw: Request, request_id: int, num_prompt_tokens: int, n: int, chat: bool,
                       return_token_ids: bool = False) -> JSONResponse:
        """Wait for the request's end and answer with every choice. A client that goes away is
        noticed within DISCONNECT_POLL_S and its request aborted.

        Raises:
            APIError: 500 (the request failed in the engine), 503 (aborted at shutdown).
        """
        texts = [""] * n
        collect = asyncio.ensure_future(_collect(self.llm.stream(request_id), texts))
        try:
            while not collect.done():
                await asyncio.wait({collect}, timeout=DISCONNECT_POLL_S)
                if not collect.done() and await raw.is_disconnected():
                    collect.cancel()
                    self.llm.abort(request_id)
                    return JSONResponse(error_body("client disconnected", "client_closed", None, 499), 499)
            last = collect.result()
        finally:
            if not collect.done():
                collect.cancel()
            self.llm.abort(request_id)  # a no-op once it finished
        _raise_for(last)
        output = last.output
        choices = []
        for completion in output.outputs:
            text = texts[completion.index]
            if chat:
                choices.append({"index": completion.index, "message": {"role": "assistant", "content": text},
                                "logprobs": None, "finish_reason": completion.finish_reason})
            else:
                choices.append({"index": completion.index, "text": text, "logprobs": None, "finish_reason": completion.finish_reason})
            if return_token_ids:
                choices[-1]["token_ids"] = list(completion.token_ids)
        body = {"id": _id(chat, request_id), "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
                "model": self.model_name, "choices": choices, "usage": _usage(num_prompt_tokens, output)}
        if output.kv_transfer_params is not None:  # vLLM's field: where a decode instance reads this prefill's KV
            body["kv_transfer_params"] = output.kv_transfer_params
        return JSONResponse(body)

    # ---- streams ------------------------------------------------------------------------------

    def stream(self, request_id: int, num_prompt_tokens: int, n: int, chat: bool, include_usage: bool,
               on_close: Callable[[], None], return_token_ids: bool = False) -> StreamingResponse:
        """Server-sent events: one ``data:`` chunk per choice per step that gave it text, the
        finish reason in its last chunk, a usage chunk (``include_usage``), then ``data: [DONE]``.
        A failure ends the stream with an ``{"error": ...}`` event. A client that disconnects
        aborts the request: the engine frees its blocks at once. With ``return_token_ids`` (vLLM's
        field) each chunk also carries the ``token_ids`` it adds, and a step whose text is held back
        still sends its chunk (empty text, its token), as vLLM does."""
        llm = self.llm
        head = {"id": _id(chat, request_id), "object": "chat.completion.chunk" if chat else "text_completion",
                "created": int(time.time()), "model": self.model_name}
        extra = {"usage": None} if include_usage else {}

        def chunk(choices: list[dict], **more) -> str:
            return f"data: {json.dumps({**head, 'choices': choices, **extra, **more}, ensure_ascii=False)}\n\n"

        async def events() -> AsyncIterator[str]:
            try:
                if chat:
                    for i in range(n):
                        yield chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}])
                last = None
                async for delta in llm.stream(request_id):
                    last = delta
                    for i in sorted(set(delta.texts) | set(delta.finish_reasons)):
                        text, reason = delta.texts.get(i, ""), delta.finish_reasons.get(i)
                        tokens = {"token_ids": delta.token_ids.get(i, [])} if return_token_ids else {}
                        if not text and reason is None and not tokens.get("token_ids"):
                            continue  # text held back this step (a split character, the stop buffer)
                        if reason in ("abort", "error"):
                            continue  # said by the error event below
                        if chat:
                            yield chunk([{"index": i, "delta": {"content": text} if text else {}, "logprobs": None, "finish_reason": reason, **tokens}])
                        else:
                            yield chunk([{"index": i, "text": text, "logprobs": None, "finish_reason": reason, **tokens}])
                try:
                    _raise_for(last)
                except APIError as error:
                    yield f"data: {json.dumps(error.body())}\n\n"
                    yield "data: [DONE]\n\n"
                    return
                if include_usage:
                    yield chunk([], usage=_usage(num_prompt_tokens, last.output))
                yield "data: [DONE]\n\n"
            finally:
                llm.abort(request_id)  # a no-op once it finished: only a stream left early aborts

        def close() -> None:
            llm.abort(request_id)
            on_close()

        return _EventStream(events(), close, media_type="text/event-stream")


class _EventStream(StreamingResponse):
    """A StreamingResponse that runs ``on_close`` when the response ends however it ends: sent
    whole, or cut by a client that went away mid-stream (the request is then aborted at once, not
    when its event generator is garbage-collected)."""

    def __init__(self, content, on_close: Callable[[], None], **kwargs):
        super().__init__(content, **kwargs)
        self.on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_close()


async def _collect(stream: AsyncIterator[RequestDelta], texts: list[str]) -> RequestDelta:
    last = None
    async for delta in stream:
        for i, text in delta.texts.items():
            texts[i] += text
        last = delta
    return last


def _raise_for(last: RequestDelta | None) -> None:
    """The APIError a request's last delta stands for, if it did not complete."""
    if last is None or last.aborted:
        raise APIError(503, "the request was aborted: the server is shutting down")
    if last.error is not None:
        raise APIError(500, f"the request failed in the engine: {last.error}")


def _usage(num_prompt_tokens: int, output) -> dict:
    """OpenAI's usage object; ``prompt_tokens_details.cached_tokens``: the prompt tokens found in the
    prefix cache (``RequestOutput.num_cached_tokens``; vLLM reports it with ``--enable-prompt-tokens-details``)."""
    completion = sum(len(c.token_ids) for c in output.outputs)
    return {"prompt_tokens": num_prompt_tokens, "completion_tokens": completion, "total_tokens": num_prompt_tokens + completion,
            "prompt_tokens_details": {"cached_tokens": output.num_cached_tokens}}


def _id(chat: bool, request_id: int) -> str:
    return f"{'chatcmpl' if chat else 'cmpl'}-{request_id}-{uuid.uuid4().hex[:12]}"
