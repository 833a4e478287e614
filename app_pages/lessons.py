"""Lessons page: the lesson notebooks found at run time, each with its goal and path."""

from __future__ import annotations

import json
import re
from pathlib import Path

import streamlit as st

from visualize.i18n import t

LESSONS_DIR = Path(__file__).resolve().parent.parent / "lessons"
GOAL_LABEL = re.compile(r"^[*_ ]*(goal|目标)[*_ ]*[:：][*_ ]*", re.IGNORECASE)  # "**Goal:** ", "**目标：**"


def notebook_summary(path: Path) -> tuple[str, str]:
    """(title, goal) of a notebook: its first Markdown heading, and the paragraph that starts with
    "Goal" / "目标" (without that word: the page puts its own label), else the first paragraph after it."""
    try:
        cells = json.loads(path.read_text(encoding="utf-8")).get("cells", [])
    except (OSError, ValueError):
        return path.stem, ""
    text = "\n\n".join("".join(c.get("source", [])) for c in cells if c.get("cell_type") == "markdown")
    # Paragraphs (blank-line separated), each joined onto one line: a goal may wrap over several lines.
    paragraphs = [" ".join(line.strip() for line in p.splitlines()) for p in text.split("\n\n") if p.strip()]
    title = next((p.lstrip("# ") for p in paragraphs if p.startswith("#")), path.stem)
    goal = next((p for p in paragraphs if p.lstrip("*_ ").lower().startswith(("goal", "目标"))), None)
    if goal is None:
        goal = next((p for p in paragraphs if not p.startswith("#")), "")
    return title, GOAL_LABEL.sub("", goal, count=1)


def page() -> None:
    lang = st.session_state["lang"]
    st.title(t("page_lessons", lang))
    st.caption(t("lessons_intro", lang))
    folder = LESSONS_DIR / lang
    notebooks = sorted(folder.glob("*.ipynb"))
    if not notebooks:
        st.info(t("no_lessons", lang, path=str(folder)))
        return
    for path in notebooks:
        title, goal = notebook_summary(path)
        with st.container(border=True):
            st.markdown(f"**{title}**")
            if goal:
                st.markdown(t("goal_line", lang, goal=goal))
            st.code(str(path.relative_to(LESSONS_DIR.parent)), language=None)
