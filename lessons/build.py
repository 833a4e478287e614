"""Build the lesson notebooks from their one source each.

A lesson is one jupytext percent-format file, ``lessons/src/NN_name.py``. Its code cells are written
once; each Markdown cell names its language in the cell header::

    # %% [markdown] lang="en"
    # ## 1. A small pool
    # %% [markdown] lang="zh"
    # ## 1. 一个小池子
    # %%
    llm = LLM(block_size=4, num_gpu_blocks=24)

``build`` writes ``lessons/en/NN_name.ipynb`` and ``lessons/zh/NN_name.ipynb``: every code cell, the
Markdown cells of that language, no outputs, cell ids numbered in order (so that a rebuild of an
unchanged source gives the same bytes). The one line that differs between the two notebooks is the
code's ``LANG = "en"`` (the language of the charts, printed lines and check messages), which the build
sets to each notebook's language.

The notebooks carry no jupytext pairing: Jupyter opens them as plain notebooks, and an edit made there
does not flow back; edit the source and rebuild.

Usage (from the repository root; needs ``jupytext``, in the ``test`` extra)::

    python -m lessons build            # every lesson
    python -m lessons build 04         # the lessons whose name starts with 04
    python -m lessons check            # exit 1, naming them, if a committed notebook is out of date
"""

from __future__ import annotations

import re
from pathlib import Path

LESSONS = Path(__file__).resolve().parent
SRC = LESSONS / "src"
SOLUTIONS = LESSONS / "solutions"
LANGS = ("en", "zh")
# The line the build sets per notebook; the rest of the line (its comment) is shared.
LANG_LINE = re.compile(r'^LANG = "(en|zh)"(?=\s|$)', re.MULTILINE)
KERNELSPEC = {"display_name": "Python 3", "language": "python", "name": "python3"}
# Cell metadata that only the source's text form needs (jupytext's round-trip marks) stays out of the notebooks.
SOURCE_ONLY_METADATA = {"lang", "lines_to_next_cell", "lines_to_end_of_cell_marker", "cell_marker", "title", "region_name"}


class LessonSourceError(ValueError):
    """A lesson source that cannot be built; the message names the file and the cell."""


def sources() -> list[Path]:
    """The lesson sources, in lesson order."""
    return sorted(SRC.glob("[0-9][0-9]_*.py"))


def notebook_path(source: Path, lang: str) -> Path:
    return LESSONS / lang / f"{source.stem}.ipynb"


def _shown(path: Path) -> str:
    return str(path.relative_to(LESSONS.parent)) if path.is_relative_to(LESSONS.parent) else str(path)


def _where(source: Path, cell) -> str:
    first = cell.source.strip().splitlines()[0] if cell.source.strip() else "(empty)"
    return f"{_shown(source)}: the {cell.cell_type} cell starting {first[:60]!r}"


def _check(source: Path, nb) -> None:
    """Raise LessonSourceError unless every Markdown cell names a known language, no code cell does,
    each stretch of prose between two code cells exists in every language, and the code sets LANG once."""
    pending: set[str] = set()
    stretch_start = None
    for cell in [*nb.cells, None]:
        if cell is not None and cell.cell_type == "markdown":
            lang = cell.metadata.get("lang")
            if lang not in LANGS:
                raise LessonSourceError(f'{_where(source, cell)} needs lang="en" or lang="zh" in its header, not {lang!r}')
            pending.add(lang)
            stretch_start = stretch_start or cell
            continue
        if pending and pending != set(LANGS):
            missing = ", ".join(sorted(set(LANGS) - pending))
            raise LessonSourceError(f"{_where(source, stretch_start)}: this prose has no {missing} version before the next code cell")
        pending, stretch_start = set(), None
        if cell is not None and cell.cell_type == "code" and "lang" in cell.metadata:
            raise LessonSourceError(f"{_where(source, cell)}: code cells are shared by every language and take no lang")
    found = sum(len(LANG_LINE.findall(c.source)) for c in nb.cells if c.cell_type == "code")
    if found != 1:
        raise LessonSourceError(f'{_shown(source)}: the code must set LANG = "en" once, found {found} times')


def render(source: Path, lang: str) -> str:
    """The text of ``source``'s notebook in ``lang`` (.ipynb JSON, no outputs, ending in a newline)."""
    import jupytext
    import nbformat

    if lang not in LANGS:
        raise ValueError(f"lang must be one of {LANGS}, not {lang!r}")
    nb = jupytext.read(source, fmt="py:percent")
    _check(source, nb)
    cells = []
    for cell in nb.cells:
        metadata = {k: v for k, v in cell.metadata.items() if k not in SOURCE_ONLY_METADATA}
        if cell.cell_type == "code":
            code = LANG_LINE.sub(f'LANG = "{lang}"', cell.source)
            cells.append(nbformat.v4.new_code_cell(code, metadata=metadata))
        elif cell.metadata["lang"] == lang:
            cells.append(nbformat.v4.new_markdown_cell(cell.source, metadata=metadata))
    for index, cell in enumerate(cells):
        cell.id = f"cell-{index:02d}"
    out = nbformat.v4.new_notebook(cells=cells, metadata={"kernelspec": nb.metadata.get("kernelspec", KERNELSPEC)})
    nbformat.validate(out)
    return nbformat.writes(out) + "\n"


def _select(prefixes: list[str] | None) -> list[Path]:
    chosen = [s for s in sources() if not prefixes or s.stem.startswith(tuple(prefixes))]
    if prefixes and not chosen:
        raise LessonSourceError(f"no lesson in {_shown(SRC)} starts with {' or '.join(prefixes)}")
    return chosen


def build(prefixes: list[str] | None = None) -> list[Path]:
    """Write the notebooks of the chosen lessons (all by default); returns the paths that changed."""
    written = []
    for source in _select(prefixes):
        for lang in LANGS:
            path, text = notebook_path(source, lang), render(source, lang)
            if not path.is_file() or path.read_text(encoding="utf-8") != text:
                path.write_text(text, encoding="utf-8")
                written.append(path)
    return written


def stale(prefixes: list[str] | None = None) -> list[Path]:
    """The committed notebooks that differ from what their source builds (or are missing), and
    notebooks in ``en/`` or ``zh/`` without a source."""
    out = []
    for source in _select(prefixes):
        for lang in LANGS:
            path = notebook_path(source, lang)
            if not path.is_file() or path.read_text(encoding="utf-8") != render(source, lang):
                out.append(path)
    if not prefixes:
        names = {s.stem for s in sources()}
        out += [p for lang in LANGS for p in sorted((LESSONS / lang).glob("*.ipynb")) if p.stem not in names]
    return out
