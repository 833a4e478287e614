"""Text from an opened file reaches the page as text: a saved run's model name, file name, prompts and
replies, and the errors that quote a file, are never Markdown (no image fetched, no link, no HTML)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from streamlit.testing.v1 import AppTest

from app_pages.common import html_text, plain

APP = str(Path(__file__).resolve().parent.parent / "app.py")
IMAGE = "![pixel](https://attacker.example/p.png)"
LINK = "[click](javascript:alert(1))"
HOSTILE = f"{IMAGE} {LINK} <img src=x onerror=alert(1)> :red[red] \n\n# heading"


def _markdown_would_act(source: str) -> list[str]:
    """Markdown constructs left unescaped in a Markdown source: images, links, raw tags, Streamlit colour
    directives (the source as a reader's browser would receive it)."""
    found = []
    for pattern in (r"(?<!\\)!(?<!\\)\[", r"(?<!\\)\]\((?!\\)", r"(?<!\\)<(img|script|a)\b", r"(?<!\\):red(?<!\\)\[",
                    r"(?m)^# heading", r"javascript:"):
        if re.search(pattern, source):
            found.append(pattern)
    return found


def test_plain_leaves_nothing_for_markdown_to_act_on():
    assert _markdown_would_act(HOSTILE)  # the check can fail
    assert _markdown_would_act(plain(HOSTILE)) == []
    assert "\n" not in plain(HOSTILE)
    assert "<" not in html_text(HOSTILE) and "\n\n" not in html_text(HOSTILE)  # a blank line would end the HTML block


def _run_bytes() -> bytes:
    step = {"step": 0, "phase": "prefill",
            "scheduled": [{"request_id": 0, "phase": "prefill", "num_tokens": 3, "context_len": 3}],
            "new_token_ids": {"0": [5]}, "new_text": {"0": f"reply {HOSTILE}"}, "finished": {"0": "stop"}, "preempted": [],
            "events": [{"kind": "allocate", "request_id": 0, "block_id": 1, "logical_index": 0}],
            "block_tables": [{"request_id": 0, "block_table": [1], "filled": [3]}],
            "memory": {"capacity": 16, "token_states": 3, "reserved": 0, "internal_fragmentation": 1,
                       "external_fragmentation": 0, "free": 12, "bytes_per_slot": 2}}
    data = {"format": "pagedattention-lab/run", "version": 1, "requests": [{"prompt": f"prompt {HOSTILE}", "max_tokens": 3}],
            "engine": {"model_name": f"model {HOSTILE}", "block_size": 4, "num_blocks": 4, "bytes_per_slot": 2},
            "prompts": {"0": f"prompt {HOSTILE}"}, "steps": [step]}
    return json.dumps(data).encode()


def _markdown_sources(at: AppTest) -> list[str]:
    elements = [*at.markdown, *at.caption, *at.info, *at.warning, *at.error, *at.success]
    return [e.value for e in elements]


def test_a_saved_run_with_markdown_in_its_text_is_shown_as_text():
    from engine.runfile import load_run

    run = load_run(_run_bytes(), name=f"{IMAGE}.json")
    at = AppTest.from_file(APP, default_timeout=120)
    at.session_state["loaded_run"] = run
    at.session_state["loaded_run_name"] = f"{IMAGE}.json"
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    sources = _markdown_sources(at)
    banner = [s for s in sources if "model" in s and "pixel" in s]
    assert banner, sources  # the model name and file name are on the page ...
    texts = [s for s in sources if "prompt" in s and "reply" in s]
    assert texts  # ... so are the prompt and the reply
    for source in sources:
        assert _markdown_would_act(source) == [], source  # ... as text


def test_an_error_quoting_a_file_is_shown_as_text():
    """A bad setting's value is quoted in the error: with an image in it, the image is not fetched."""
    from app_pages.saved import open_error
    from engine.runfile import RunFileError, load_workload

    bad = {"format": "pagedattention-lab/workload", "version": 1, "requests": [{"prompt": "a", "max_tokens": 3}],
           "settings": {"allocator": IMAGE}}
    try:
        load_workload(json.dumps(bad).encode(), name="w.json")
    except RunFileError as error:
        message = str(error)
    assert IMAGE in message  # the error quotes the file
    for lang in ("en", "zh"):
        shown = open_error(RunFileError(message), lang)
        assert "pixel" in shown and _markdown_would_act(shown) == []
