"""The lesson notebooks: every one exists in English and Chinese with the same code, runs top to bottom,
and ends in an exercise whose check prints FAIL as handed out and PASS with the kept-apart solution.

Each notebook is executed once per language: cells run in order until the check cell (which must print
FAIL, the exercise still holding its ``None`` placeholders); then the solution from
``lessons/solutions/<name>.py`` runs in the same kernel, the check cell runs again and must print PASS,
and the remaining cells run. No cell may raise.

The kernel runs with ``OMP_NUM_THREADS=1``: on a small shared CI runner, torch's default of one
thread per core spins against the other jobs and a decode step that takes 0.1 s can take 5 s.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import jupytext
import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
LESSONS = ROOT / "lessons"
LANGS = ("en", "zh")
NAMES = sorted(p.stem for p in (LESSONS / "en").glob("*.ipynb"))
CELL_TIMEOUT_S = 600


def _tags(cell) -> list[str]:
    return list(cell.get("metadata", {}).get("tags", []))


# The one thing allowed to differ between languages: the value of LANG (figures' text and the check's
# messages); the rest of its line, a comment included, must be the same in both.
LANG_LINE = re.compile(r'^LANG = "(en|zh)"(?=\s|$)', re.MULTILINE)


def _code(nb) -> list[str]:
    return [LANG_LINE.sub('LANG = "<lang>"', c.source) for c in nb.cells if c.cell_type == "code"]


def _printed(cell) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.get("output_type") == "stream")


def _notebook(lang: str, name: str):
    return nbformat.read(LESSONS / lang / f"{name}.ipynb", as_version=4)


def test_there_are_lessons():
    assert NAMES, "no notebooks in lessons/en"


@pytest.mark.parametrize("name", NAMES)
def test_every_lesson_has_both_languages_a_source_and_a_solution(name):
    for lang in LANGS:
        assert (LESSONS / lang / f"{name}.ipynb").is_file(), f"lessons/{lang}/{name}.ipynb is missing"
        assert (LESSONS / lang / f"{name}.py").is_file(), f"lessons/{lang}/{name}.py (jupytext source) is missing"
    assert (LESSONS / "solutions" / f"{name}.py").is_file(), f"lessons/solutions/{name}.py is missing"


@pytest.mark.parametrize("name", NAMES)
def test_english_and_chinese_share_every_code_cell(name):
    en, zh = _code(_notebook("en", name)), _code(_notebook("zh", name))
    assert len(en) == len(zh), f"{name}: {len(en)} code cells in en, {len(zh)} in zh"
    for i, (a, b) in enumerate(zip(en, zh)):
        assert a == b, f"{name}: code cell {i} differs between en and zh"


@pytest.mark.parametrize("lang", LANGS)
@pytest.mark.parametrize("name", NAMES)
def test_notebook_matches_its_source_and_carries_no_outputs(lang, name):
    nb = _notebook(lang, name)
    source = jupytext.read(LESSONS / lang / f"{name}.py")
    for cell in nb.cells:
        if cell.cell_type == "code" and LANG_LINE.search(cell.source):
            assert LANG_LINE.search(cell.source).group(1) == lang, f"{lang}/{name}: LANG must be {lang!r}"
    assert [(c.cell_type, c.source) for c in nb.cells] == [(c.cell_type, c.source) for c in source.cells], (
        f"lessons/{lang}/{name}.ipynb is out of date: run `jupytext --to ipynb lessons/{lang}/{name}.py`"
    )
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, f"{lang}/{name}: committed with outputs"


@pytest.mark.parametrize("name", NAMES)
def test_exercise_is_handed_out_with_none_placeholders(name):
    nb = _notebook("en", name)
    exercise = [c for c in nb.cells if "exercise" in _tags(c)]
    check = [c for c in nb.cells if "check" in _tags(c)]
    assert len(exercise) == 1 and len(check) == 1, f"{name}: needs one cell tagged exercise and one tagged check"
    assert nb.cells.index(exercise[0]) < nb.cells.index(check[0])
    assert "None" in exercise[0].source and "TODO(student)" in exercise[0].source
    solution = (LESSONS / "solutions" / f"{name}.py").read_text()
    assert "TODO(student)" not in solution and solution.strip() != exercise[0].source.strip()


@pytest.mark.slow
@pytest.mark.parametrize("lang", LANGS)
@pytest.mark.parametrize("name", NAMES)
def test_notebook_runs_and_its_check_fails_as_handed_out_and_passes_when_solved(lang, name, record_property):
    from nbclient import NotebookClient

    path = LESSONS / lang / f"{name}.ipynb"
    nb = nbformat.read(path, as_version=4)
    solution = nbformat.v4.new_code_cell((LESSONS / "solutions" / f"{name}.py").read_text())
    client = NotebookClient(nb, kernel_name="python3", timeout=CELL_TIMEOUT_S, resources={"metadata": {"path": str(path.parent)}})
    checked = False
    start = time.perf_counter()
    with client.setup_kernel(env={**os.environ, "OMP_NUM_THREADS": "1"}):
        for index, cell in enumerate(nb.cells):
            if cell.cell_type != "code":
                continue
            client.execute_cell(cell, index)
            if "check" not in _tags(cell):
                continue
            handed_out = _printed(cell).strip()
            assert handed_out.startswith("FAIL"), f"{lang}/{name}: unsolved exercise printed {handed_out!r}, not FAIL"
            client.execute_cell(solution, index)
            client.execute_cell(cell, index)
            solved = _printed(cell).strip()
            assert solved.startswith("PASS"), f"{lang}/{name}: with the solution the check printed {solved!r}"
            checked = True
    seconds = time.perf_counter() - start
    record_property("seconds", round(seconds, 1))
    print(f"{lang}/{name}: {seconds:.1f} s")
    assert checked, f"{lang}/{name}: no check cell ran"
