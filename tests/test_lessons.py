"""The lesson notebooks: each is built from one source (``lessons/src/NN_name.py``: the code once, the
prose in English and Chinese) into ``lessons/en/`` and ``lessons/zh/``; the committed notebooks are what
the source builds today, share every code cell, run top to bottom, and end in an exercise whose check
prints FAIL as handed out and PASS with the kept-apart solution.
The Chinese text itself (Markdown cells, checked without running) keeps no English words beside the field's
loan words, names and code (``visualize.i18n.english_words``), renders each term as the glossary says
(``visualize.i18n.GLOSSARY``: 提示词, 分块, 空闲列表, 访存受限...) and puts each paragraph on one line.

Each notebook is executed once per language, both languages side by side: cells run in order until the
check cell (which must print FAIL, the exercise still holding its ``None`` placeholders); then the
solution from ``lessons/solutions/<name>.py`` runs in the same kernel, the check cell runs again and
must print PASS, and the remaining cells run. No cell may raise. In the Chinese notebooks, the text of every chart drawn
(titles, axis and tick labels, legends, annotations) is read back at the end and must not be English,
nor may the lines its code cells print (their data aside: quoted model text, token ids, block tables).

Lesson 9 starts ``python -m engine serve`` as a subprocess; its last cell stops it, and so does the
kernel's end after an error in any cell, a crash included (checked on its own: a killed kernel).

The kernel runs with ``OMP_NUM_THREADS=1``: on a small shared CI runner, torch's default of one
thread per core spins against the other jobs and a decode step that takes 0.1 s can take 5 s.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `lessons` is not an installed package: the build lives in the repository
    sys.path.insert(0, str(ROOT))

from lessons.build import LANGS, LESSONS, LessonSourceError, notebook_path, render, sources, stale  # noqa: E402

NAMES = [s.stem for s in sources()]
CELL_TIMEOUT_S = 600
# A plausible wrong answer per lesson, run after the solution: the check must print FAIL again, so its
# last part cannot pass on anything. Lesson 3: the saturation rate from the paged batch, not Orca (Max)'s.
WRONG_ANSWERS = {"03_memory_problem": "orca_max_saturation_rate = decode_tokens_per_s(paged_batch, 16) / mean_output",
                 # Lesson 9: Little's law with one request in the server instead of a full batch.
                 "09_serving": "ttft_explodes_at = 1 / (output_tokens * step_s)",
                 # Lesson 10: every draft judged (1 + alpha * k), as if a rejection did not end the verification.
                 "10_speculative": "tokens_per_step = 1 + alpha * k",
                 # Lesson 14: the bytes of the prompt's tokens, as if a handover moved tokens rather than whole blocks.
                 "14_disaggregation": "predicted_bytes = len(EXERCISE_PROMPT) * kv_bytes_per_token"}


def _tags(cell) -> list[str]:
    return list(cell.get("metadata", {}).get("tags", []))


# The one thing allowed to differ between languages: the value of LANG (figures' text and the check's
# messages); the rest of its line, a comment included, must be the same in both.
LANG_LINE = re.compile(r'^LANG = "(en|zh)"(?=\s|$)', re.MULTILINE)


def _code(nb) -> list[str]:
    return [LANG_LINE.sub('LANG = "<lang>"', c.source) for c in nb.cells if c.cell_type == "code"]


def _printed(cell) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.get("output_type") == "stream")


# Charts drawn inside the lessons: every figure is kept open (the inline backend closes each one after its
# cell), and after the last cell their titles, axis labels, tick labels, legends and annotations are read back.
KEEP_FIGURES = "import matplotlib.pyplot\n%config InlineBackend.close_figures = False"
READ_CHART_TEXTS = """
import json as _json
import matplotlib.pyplot as _plt
_texts = []
for _n in _plt.get_fignums():
    _fig = _plt.figure(_n)
    _texts += [x.get_text() for x in _fig.texts]
    for _ax in _fig.axes:
        _legend = _ax.get_legend()
        _texts += [_ax.get_title(), _ax.get_xlabel(), _ax.get_ylabel(), *(x.get_text() for x in _ax.texts),
                   *(x.get_text() for x in _ax.get_xticklabels() + _ax.get_yticklabels()),
                   *((x.get_text() for x in _legend.get_texts()) if _legend else ())]
print(_json.dumps([x for x in _texts if x.strip()]))
"""
# Words a Chinese chart may keep: names and the terms the Chinese text itself uses.
NEUTRAL_WORDS = {"token", "tokens", "logits", "logit", "FLOP", "SmolLM", "Llama", "mathdefault",
                 "vLLM", "Orca", "Oracle"}  # the paper's system names
CHARTS_LEFT_IN_ENGLISH: set[str] = set()


def _english_chart_texts(texts: list[str]) -> list[str]:
    """The chart texts of a Chinese notebook that are English: catalogue English, or words of 4+ letters
    in a text without any Chinese character (names and NEUTRAL_WORDS aside)."""
    from visualize.i18n import untranslated

    found = untranslated("\n".join(texts))
    for text in texts:
        words = set(re.findall(r"[A-Za-z]{4,}", text)) - NEUTRAL_WORDS
        if words and not re.search(r"[\u4e00-\u9fff]", text):
            found.append(text)
    return found


# A printed value quoted as Python writes it (model text, decoded tokens, event kinds in a tuple) is data.
QUOTED = re.compile(r"'(?:[^'\\\n]|\\.)*'|\"(?:[^\"\\\n]|\\.)*\"")


def _english_printed(stdout: str) -> list[str]:
    """Catalogue English in what a Chinese notebook's code cells printed, and English words inside its
    Chinese lines (``max |full - cached|``), quoted data left out (a line without Chinese is data)."""
    from visualize.i18n import english_words, untranslated

    stdout = QUOTED.sub("", stdout)
    words = [w for line in stdout.splitlines() if re.search(r"[\u4e00-\u9fff]", line) for w in english_words(line)]
    return untranslated(stdout) + sorted(set(words))


# Chinese typesetting: a full-width punctuation mark carries its own space, so none follows it ("，  " or
# "： x" comes from a padded {value:6.1f} or print's separator); an engine constant (COPY_ON_WRITE) is English.
SPACE_AFTER_FULL_WIDTH = re.compile(r"[，。：；、！？（）] ")
CONSTANT_NAME = re.compile(r"(?<![\w.])[A-Z][A-Z0-9]*_[A-Z0-9_]*[A-Z0-9](?![\w.])")


def _chinese_typesetting(stdout: str) -> list[str]:
    """Lines of a Chinese notebook's output (quoted data aside) with a space after full-width punctuation
    or an ALL_CAPS constant name."""
    return [line for line in QUOTED.sub("", stdout).splitlines()
            if SPACE_AFTER_FULL_WIDTH.search(line) or CONSTANT_NAME.search(line)]


def test_chinese_typesetting_finds_the_old_output():
    old = ["第 1 步：解码  计算的 token 数 =  1", "COPY_ON_WRITE：序列 1，逻辑块 2", "块：  12.0", "节省  25.0%，   3"]
    assert _chinese_typesetting("\n".join(old)) == old[1:]
    assert _chinese_typesetting("写时复制：序列 1；块 [3, 4]，'FORK_X： a'") == []


def _notebook(lang: str, name: str):
    return nbformat.read(LESSONS / lang / f"{name}.ipynb", as_version=4)


def test_there_are_lessons():
    assert NAMES, "no notebooks in lessons/en"


@pytest.mark.parametrize("name", NAMES)
def test_every_lesson_has_a_source_both_notebooks_and_a_solution(name):
    for lang in LANGS:
        assert (LESSONS / lang / f"{name}.ipynb").is_file(), f"lessons/{lang}/{name}.ipynb is missing: run `python -m lessons build`"
    assert (LESSONS / "solutions" / f"{name}.py").is_file(), f"lessons/solutions/{name}.py is missing"


@pytest.mark.parametrize("lang", LANGS)
@pytest.mark.parametrize("name", NAMES)
def test_committed_notebook_is_what_its_source_builds(lang, name):
    """Regenerate and compare, byte for byte: no outputs, no hand edit, no stale notebook."""
    source = LESSONS / "src" / f"{name}.py"
    committed = notebook_path(source, lang).read_text(encoding="utf-8")
    assert committed == render(source, lang), (
        f"lessons/{lang}/{name}.ipynb is not what lessons/src/{name}.py builds: run `python -m lessons build {name[:2]}`"
    )
    nb = nbformat.reads(committed, as_version=4)
    assert [LANG_LINE.search(c.source).group(1) for c in nb.cells if c.cell_type == "code" and LANG_LINE.search(c.source)] == [lang]
    assert all(not c.outputs and c.execution_count is None for c in nb.cells if c.cell_type == "code")


def test_no_notebook_without_a_source():
    assert stale() == [], "notebooks out of date or without a source in lessons/src: run `python -m lessons build`"


@pytest.mark.parametrize("name", NAMES)
def test_english_and_chinese_share_every_code_cell(name):
    en, zh = _code(_notebook("en", name)), _code(_notebook("zh", name))
    assert len(en) == len(zh), f"{name}: {len(en)} code cells in en, {len(zh)} in zh"
    for i, (a, b) in enumerate(zip(en, zh)):
        assert a == b, f"{name}: code cell {i} differs between en and zh"


# The build refuses a source that would give the languages different code or leave prose untranslated.
BAD_SOURCES = {
    "a Markdown cell without a language": ('# %% [markdown]\n# Hello\n\n# %%\nLANG = "en"\n', 'needs lang="en" or lang="zh"'),
    "prose in one language only": ('# %% [markdown] lang="en"\n# Hello\n\n# %%\nLANG = "en"\n', "has no zh version"),
    "a code cell for one language": ('# %% lang="zh"\nLANG = "en"\n', "take no lang"),
    "no LANG line": ('# %% [markdown] lang="en"\n# A\n\n# %% [markdown] lang="zh"\n# 甲\n\n# %%\nx = 1\n', "found 0 times"),
}


@pytest.mark.parametrize("case", BAD_SOURCES)
def test_the_build_names_what_is_wrong_with_a_source(case, tmp_path):
    text, message = BAD_SOURCES[case]
    source = tmp_path / "99_bad.py"
    source.write_text(text)
    with pytest.raises(LessonSourceError, match=re.escape(message)):
        render(source, "en")


def test_the_build_gives_each_language_its_own_prose():
    source = LESSONS / "src" / f"{NAMES[0]}.py"
    en, zh = (nbformat.reads(render(source, lang), as_version=4) for lang in LANGS)
    assert en.cells[0].source.startswith("# Lesson 1") and zh.cells[0].source.startswith("# 第 1 课")
    han = re.compile(r"[\u4e00-\u9fff]")
    assert not any(han.search(c.source) for c in en.cells if c.cell_type == "markdown")
    assert all(han.search(c.source) for c in zh.cells if c.cell_type == "markdown")
    assert [c.id for c in en.cells] == [f"cell-{i:02d}" for i in range(len(en.cells))]
    assert not any("lang" in c.metadata or "lines_to_next_cell" in c.metadata for c in en.cells + zh.cells)


def _markdown(lang: str, name: str) -> list[str]:
    return [c.source for c in _notebook(lang, name).cells if c.cell_type == "markdown"]


@pytest.mark.parametrize("name", NAMES)
def test_chinese_text_has_no_english_words_and_keeps_the_glossary(name):
    from visualize.i18n import english_words, gloss_mismatches

    for cell in _markdown("zh", name):
        assert english_words(cell) == [], f"zh/{name}: English words {english_words(cell)} in {cell[:80]!r}"
        assert gloss_mismatches(cell) == [], f"zh/{name}: terms off the glossary {gloss_mismatches(cell)}"


def test_the_chinese_readme_keeps_the_glossary():
    from visualize.i18n import gloss_mismatches

    chinese = (LESSONS / "README.md").read_text().split("# 课程（中文说明）", 1)[1]
    assert gloss_mismatches(chinese) == []


# A line break inside a Markdown paragraph renders as a space, a stray one inside a Chinese sentence.
@pytest.mark.parametrize("name", NAMES)
def test_chinese_paragraphs_are_single_lines(name):
    for cell in _markdown("zh", name):
        for paragraph in re.split(r"\n\s*\n", cell):
            lines = paragraph.split("\n")
            breaks = [f"{a[-20:]!r} / {b[:20]!r}" for a, b in zip(lines, lines[1:])
                      if not a.startswith(("#", "|", "$$")) and re.search(r"[\u4e00-\u9fff]", a + b)
                      and not re.match(r"\s*(?:[-*+] |\d+\. |\||\$\$)", b)]
            assert breaks == [], f"zh/{name}: a Chinese paragraph broken over lines at {breaks}"


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
@pytest.mark.parametrize("name", NAMES)
def test_notebook_runs_and_its_check_fails_as_handed_out_and_passes_when_solved(name, record_property):
    """Both languages' notebooks at once, a kernel each: each kernel runs on one thread (OMP_NUM_THREADS=1),
    so side by side they take the time of one. A failure names its language."""
    with ThreadPoolExecutor(max_workers=len(LANGS)) as pool:
        runs = {lang: pool.submit(_run_notebook, lang, name) for lang in LANGS}
    failures = []
    for lang, run in runs.items():
        try:
            record_property(f"seconds_{lang}", run.result())
        except BaseException as error:  # noqa: BLE001 - each language's failure is reported, then raised
            failures.append(error)
    if len(failures) == 1:
        raise failures[0]
    if failures:
        raise AssertionError("\n".join(f"{type(e).__name__}: {e}" for e in failures))


def _run_notebook(lang: str, name: str) -> float:
    """Run one lesson notebook top to bottom with its exercise as handed out, solved and (where one is
    kept) answered wrongly; the checks described in this module's docstring. Returns its seconds."""
    from nbclient import NotebookClient

    path = LESSONS / lang / f"{name}.ipynb"
    nb = nbformat.read(path, as_version=4)
    solution = nbformat.v4.new_code_cell((LESSONS / "solutions" / f"{name}.py").read_text())
    client = NotebookClient(nb, kernel_name="python3", timeout=CELL_TIMEOUT_S, resources={"metadata": {"path": str(path.parent)}})
    checked = False
    start = time.perf_counter()
    reader = nbformat.v4.new_code_cell(READ_CHART_TEXTS)
    nb.cells = [nbformat.v4.new_code_cell(KEEP_FIGURES), *nb.cells, reader]
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
            if name in WRONG_ANSWERS:
                client.execute_cell(nbformat.v4.new_code_cell(WRONG_ANSWERS[name]), index)
                client.execute_cell(cell, index)
                wrong = _printed(cell).strip()
                assert wrong.startswith("FAIL"), f"{lang}/{name}: a wrong answer printed {wrong!r}, not FAIL"
                client.execute_cell(solution, index)
            client.execute_cell(cell, index)
            solved = _printed(cell).strip()
            assert solved.startswith("PASS"), f"{lang}/{name}: with the solution the check printed {solved!r}"
            checked = True
    chart_texts = json.loads(_printed(reader))
    printed = "".join(_printed(c) for c in nb.cells if c.cell_type == "code" and c is not reader)
    seconds = time.perf_counter() - start
    print(f"{lang}/{name}: {seconds:.1f} s")
    assert checked, f"{lang}/{name}: no check cell ran"
    if lang == "zh" and name not in CHARTS_LEFT_IN_ENGLISH:
        if "plt.show()" in "".join(_code(nb)):  # it draws charts: their text was read back
            assert any(re.search(r"[\u4e00-\u9fff]", x) for x in chart_texts), f"zh/{name}: no chart text read back"
        english = _english_chart_texts(chart_texts)
        assert english == [], f"zh/{name}: English text in its charts: {english}"
    if lang == "zh":
        english = _english_printed(printed)
        assert english == [], f"zh/{name}: English in its printed output: {english}"
        badly_set = _chinese_typesetting(printed)
        assert badly_set == [], f"zh/{name}: a space after full-width punctuation, or a constant's name, in: {badly_set}"
    return round(seconds, 1)


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="the lesson asks Linux to end its server with the kernel (PR_SET_PDEATHSIG)")
def test_the_serving_lesson_server_does_not_outlive_a_crashed_kernel():
    """Lesson 9 run up to its server's start, then a cell that raises (the cell that stops the server
    never runs), then the kernel process is killed outright: no atexit, no shutdown request. The server
    must still end, before Jupyter's own clean-up of the dead kernel could do it."""
    import signal

    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    path = LESSONS / "en" / "09_serving.ipynb"
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    start = next(i for i, c in enumerate(code) if "subprocess.Popen(" in c.source)
    client = NotebookClient(nb, kernel_name="python3", timeout=CELL_TIMEOUT_S, resources={"metadata": {"path": str(path.parent)}})
    probe = nbformat.v4.new_code_cell("import os\nprint(os.getpid(), server.pid, server.poll())")
    with client.setup_kernel(env={**os.environ, "OMP_NUM_THREADS": "1"}):
        for index, cell in enumerate(code[:start + 1]):
            client.execute_cell(cell, index)
        client.execute_cell(probe, start + 1)
        kernel_pid, server_pid, status = _printed(probe).split()
        assert status == "None", "the server is not running after its cell"
        with pytest.raises(CellExecutionError):
            client.execute_cell(nbformat.v4.new_code_cell("raise RuntimeError('a mistake in a cell')"), start + 2)
        os.kill(int(kernel_pid), signal.SIGKILL)
        deadline = time.monotonic() + 60
        while _process_exists(int(server_pid)):
            assert time.monotonic() < deadline, f"the lesson's server (pid {server_pid}) outlived its kernel"
            time.sleep(0.2)


def _process_exists(pid: int) -> bool:
    """True while ``pid`` runs; an exited process that no one has reaped yet (a zombie) counts as gone."""
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process is there
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] == "Z")
