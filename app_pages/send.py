"""Send a request: a chat box for a student on a laptop or phone. The prompt goes to the class's
engine server through its OpenAI endpoint (/v1/chat/completions, streamed, ``user`` = the student's
name, read with httpx), the answer streams back, and the student's own blocks are outlined on the shared pool map.

Each request is the student's own, never the teacher's: it names the student's address in
``X-Forwarded-For`` (the server's per-address cap and its count of wrong keys), and on a server with
API keys the student types the key the teacher gave them, which labels and caps their requests. The
key the teacher attached with is only for reading the step stream.

The request runs on a thread of its own, so the page keeps redrawing (the pool map, the answer so far)
while the teacher steps the engine.
"""

from __future__ import annotations

import json
import threading

import httpx

import streamlit as st

from app_pages import live
from app_pages.classroom import browser_address, classroom, sampling_line
from app_pages.common import html_text
from visualize.classroom import blocks_of
from visualize.colors import request_color
from visualize.i18n import t

MAX_NAME_CHARS = 40
MAX_PROMPT_CHARS = 1000
DRAW_EVERY_S = 1.0  # a class of phones redraws this page: once a second each


def page() -> None:
    lang = st.session_state["lang"]
    room = classroom()
    st.title(t("page_send", lang))
    follower = room.follower
    if follower is None:
        st.info(t("send_no_server", lang))
        return
    sampling_line(follower.sampling, lang)
    if lang == "zh":  # a Chinese question to the default model often gets an English or made-up answer
        st.caption(t("send_model_language_note", lang))
    name = st.text_input(t("student_name", lang), key="student_name", max_chars=MAX_NAME_CHARS,
                         help=t("student_name_help", lang)).strip()
    key = None
    if follower.read_key:  # a server with API keys: each student sends with their own
        key = st.text_input(t("student_key", lang), type="password", key="student_key", help=t("student_key_help", lang)).strip()
    max_tokens = st.slider(t("send_max_tokens", lang), 8, 128, 48, step=8, key="send_max_tokens")
    chat = st.session_state.setdefault("send_chat", [])  # {"role", "content", "request_id", "error", "done"}
    prompt = st.chat_input(t("chat_placeholder", lang), max_chars=MAX_PROMPT_CHARS)
    if prompt:
        if not name:
            st.warning(t("name_first", lang))
        elif key == "":
            st.warning(t("key_first", lang))
        else:
            ask(follower.url, key, name, prompt, int(max_tokens), chat, browser_address())
    st.fragment(run_every=DRAW_EVERY_S)(conversation)()


def ask(url: str, key: str | None, name: str, prompt: str, max_tokens: int, chat: list, for_address: str | None = None) -> None:
    """Send the conversation so far and ``prompt`` with the student's ``key`` (None: a server without
    keys) on behalf of the browser at ``for_address`` (None: this machine); the reply streams into a
    new message on a thread."""
    messages = [{"role": m["role"], "content": m["content"]} for m in chat if not m.get("error")]
    messages.append({"role": "user", "content": prompt})
    chat.append({"role": "user", "content": prompt})
    reply = {"role": "assistant", "content": "", "request_id": None, "error": None, "done": False}
    chat.append(reply)
    threading.Thread(target=_stream, args=(url, key, name, messages, max_tokens, reply, for_address), daemon=True,
                     name="send-request").start()


def _stream(url: str, key: str | None, name: str, messages: list, max_tokens: int, reply: dict, for_address: str | None = None) -> None:
    """The chat completion, streamed (OpenAI's server-sent events, read with httpx) into ``reply``."""
    headers = {**({"Authorization": f"Bearer {key}"} if key else {}), **({"X-Forwarded-For": for_address} if for_address else {})}
    try:
        with httpx.Client(base_url=f"{url}/v1", headers=headers, timeout=httpx.Timeout(30, read=None)) as client:
            models = client.get("/models")
            if models.status_code != 200:  # a missing or wrong key: the server's own words
                reply["error"] = _error_text(models)
                return
            model = models.json()["data"][0]["id"]
            body = {"model": model, "messages": messages, "max_tokens": max_tokens, "user": name, "stream": True}
            with client.stream("POST", "/chat/completions", json=body) as response:
                if response.status_code != 200:
                    response.read()
                    reply["error"] = _error_text(response)
                    return
                for line in response.iter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        reply["error"] = chunk["error"].get("message", str(chunk["error"]))
                        return
                    if reply["request_id"] is None:  # "chatcmpl-<request id>-<random>": the engine's request id
                        reply["request_id"] = _request_id(chunk.get("id"))
                    for choice in chunk.get("choices", []):
                        reply["content"] += choice.get("delta", {}).get("content") or ""
    except (httpx.HTTPError, ValueError, KeyError, IndexError) as error:  # a lost connection: said in the chat
        reply["error"] = f"{type(error).__name__}: {error}"
    finally:
        reply["done"] = True


def _error_text(response: httpx.Response) -> str:
    try:
        return f"{response.status_code}: {response.json()['error']['message']}"
    except (ValueError, KeyError, TypeError):
        return f"{response.status_code}: {response.text[:200]}"


def _request_id(response_id: str | None) -> int | None:
    parts = (response_id or "").split("-")
    return int(parts[1]) if len(parts) >= 3 and parts[1].isdigit() else None


def conversation() -> None:
    lang = st.session_state["lang"]
    chat = st.session_state.get("send_chat", [])
    mine = {m["request_id"] for m in chat if m.get("request_id") is not None}
    for message in chat:
        with st.chat_message(message["role"]):
            if message.get("error"):
                st.error(t("send_failed", lang, error=message["error"]))
            elif message["role"] == "assistant" and message.get("request_id") is not None:
                color = request_color(message["request_id"])
                st.markdown(f'<b style="color:{color}">{t("request", lang)} {message["request_id"]}</b><br>'
                            f'<span data-testid="reply-text" style="white-space:pre-wrap">{html_text(message["content"])}</span>',
                            unsafe_allow_html=True)
                if not message.get("done") and not message["content"]:
                    st.caption(t("waiting_for_step", lang))
            elif message["role"] == "assistant":
                st.caption(t("waiting_for_step", lang))
            else:
                st.markdown(f'<span style="white-space:pre-wrap">{html_text(message["content"])}</span>', unsafe_allow_html=True)
    follower = classroom().follower
    if follower is None:
        return
    reports, _, engine, _ = follower.view()
    if not reports or not engine:
        return
    report = reports[-1]
    blocks = blocks_of(report, mine)
    st.caption(t("your_blocks", lang, blocks=t("sep_list", lang).join(map(str, blocks))) if blocks else t("your_blocks_none", lang))
    live.pool_view(report, engine["block_size"], lang, cache=None, highlight=mine)
