"""The graded labs (lessons/labs.py, lessons/grade.py, engine/core/lab_impl.py, labs/).

- the committed starters are what the engine's modules cut today, keep each part's interface, and
  carry no line of a solution region;
- the seam: a file's parts replace the engine's own where they sit; a file that lacks one, or a
  ``LAB_IMPL`` that names nothing, is a clear error; through the seam, with every lab's model answer
  plugged in from files, the engine generates the same greedy text as with its own parts;
- the grader: the model answer scores full on every lab and exits 0; the starters score below full on
  every lab and exit 1; a crash, an endless loop and an import error cost their own lab only; hidden
  tests count; Gradescope's results.json is well formed;
- the handout carries no model answer; a week's handout cuts only its labs, which reach full marks
  alone, and a later week adds to it; the autograder zip carries its two scripts.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `lessons` is not an installed package
    sys.path.insert(0, str(ROOT))

from engine.core import lab_impl  # noqa: E402
from engine.core.lab_impl import LabImplError, lab_modules, lab_parts, solution_regions  # noqa: E402
from lessons import labs  # noqa: E402


def _run(args: list[str], env: dict | None = None, timeout: int = 900) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in ("LAB_IMPL", "LAB_ONLY")}
    full.update(env or {}, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=full, capture_output=True, text=True, timeout=timeout)


def test_there_are_at_least_twelve_labs_each_with_tests_and_a_starter():
    assert len(labs.LABS) >= 12
    for lab in labs.LABS:
        assert (labs.TESTS / f"test_lab_{lab.part_lab}.py").is_file(), lab.name
        assert labs.starter_path(lab).is_file(), lab.name
        assert all(lab.title) and all(lab.goal), f"{lab.name}: a title and a goal in English and Chinese"
    assert set(lab_modules()) == {lab.name for lab in labs.LABS if lab.base is None}, "every marked lab is registered, and back"


def test_committed_starters_are_up_to_date():
    assert labs.stale() == [], "run `python -m lessons labs build`"


def _signatures(tree: ast.Module) -> dict[str, str]:
    out = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            out[node.name] = ast.unparse(node.args) + " -> " + (ast.unparse(node.returns) if node.returns else "")
        elif isinstance(node, ast.ClassDef):
            for f in node.body:
                if isinstance(f, ast.FunctionDef):
                    decorators = ",".join(ast.unparse(d) for d in f.decorator_list)
                    out[f"{node.name}.{f.name}"] = f"{decorators} {ast.unparse(f.args)} -> {ast.unparse(f.returns) if f.returns else ''}"
    return out


@pytest.mark.parametrize("lab", labs.LABS, ids=lambda lab: lab.name)
def test_a_starter_keeps_the_model_answers_interface(lab):
    module = labs.module_of(lab)
    engine_sigs = _signatures(ast.parse(module.read_text(encoding="utf-8")))
    starter = labs.starter_path(lab).read_text(encoding="utf-8")
    starter_sigs = _signatures(ast.parse(starter))
    parts = [p.qualname for p in lab_parts(module.read_text(encoding="utf-8"))[lab.part_lab]]
    for qualname in parts:
        assert starter_sigs.get(qualname) == engine_sigs[qualname], f"{lab.name}: {qualname} differs from the engine's"
    assert f'LAB = "{lab.part_lab}"' in starter


@pytest.mark.parametrize("lab", [lab for lab in labs.LABS if lab.base is None], ids=lambda lab: lab.name)
def test_no_solution_line_reaches_a_starter(lab):
    source = labs.module_of(lab).read_text(encoding="utf-8")
    lines = source.splitlines()
    inside = set()
    for region in solution_regions(source):
        inside.update(range(region.begin, region.end - 1))  # 0-based indexes of the lines between the markers
    outside = {line.strip() for i, line in enumerate(lines) if i not in inside}
    answer = {lines[i].strip() for i in inside if lab.name == next(r.lab for r in solution_regions(source) if r.begin <= i < r.end)}
    leaked = [line for line in answer if line and line not in outside and len(line) > 8]
    starter = {line.strip() for line in labs.starter_path(lab).read_text(encoding="utf-8").splitlines()}
    assert leaked, f"{lab.name}: no solution line found to check"
    assert not [line for line in leaked if line in starter], f"{lab.name}: a solution line is in the starter"
    assert "raise NotImplementedError" in "\n".join(starter)


MODULE = '''
class Pool:
    def __init__(self):
        self.n = 0

    def take(self) -> int:
        """One more."""
        # BEGIN SOLUTION toy
        self.n += 1
        return self.n
        # END SOLUTION


def double(x):
    # BEGIN SOLUTION toy
    return 2 * x
    # END SOLUTION
'''


def test_the_seam_replaces_the_parts_where_they_sit(tmp_path, monkeypatch):
    engine_file = tmp_path / "toy_engine.py"
    engine_file.write_text(MODULE)
    assert [p.qualname for p in lab_parts(MODULE)["toy"]] == ["Pool.take", "double"]
    student = tmp_path / "toy.py"
    student.write_text('LAB = "toy"\n\nclass Pool:\n    def take(self):\n        return helper() + self.n\n\n'
                       'def helper():\n    return 40\n\ndef double(x):\n    return x + x + 1\n')
    namespace = {"__file__": str(engine_file), "__name__": "toy_engine"}
    exec(compile(MODULE, str(engine_file), "exec"), namespace)
    monkeypatch.setenv("LAB_IMPL", str(student))
    assert lab_impl.plug_lab_parts(namespace) == ["toy"]
    pool = namespace["Pool"]()
    assert pool.take() == 40 and namespace["double"](2) == 5, "the student's parts run in the engine's class and module"
    monkeypatch.setenv("LAB_IMPL", str(tmp_path))  # a directory: toy.py in it
    namespace2 = {"__file__": str(engine_file), "__name__": "toy_engine"}
    exec(compile(MODULE, str(engine_file), "exec"), namespace2)
    assert lab_impl.plug_lab_parts(namespace2) == ["toy"]
    monkeypatch.setenv("LAB_ONLY", "other")
    assert lab_impl.plug_lab_parts(namespace2) == [], "LAB_ONLY limits the swap to the labs it names"


def test_a_students_part_reads_the_modules_names_live_and_cannot_take_the_engines(tmp_path, monkeypatch):
    engine_file = tmp_path / "toy_engine.py"
    engine_file.write_text("FACTOR = 2\n" + MODULE.replace("return 2 * x", "return FACTOR * x"))
    namespace = {"__file__": str(engine_file), "__name__": "toy_engine"}
    exec(compile(engine_file.read_text(), str(engine_file), "exec"), namespace)
    student = tmp_path / "toy.py"
    student.write_text('LAB = "toy"\n\nclass Pool:\n    def take(self):\n        return 1\n\ndef double(x):\n    return FACTOR * x + 1\n')
    monkeypatch.setenv("LAB_IMPL", str(student))
    lab_impl.plug_lab_parts(namespace)
    namespace["FACTOR"] = 10  # a test patching a module constant, as monkeypatch.setattr(module, "FACTOR", 10) does
    assert namespace["double"](2) == 21, "the student's part sees the module's constant as it is now, not a copy"
    thief = tmp_path / "thief.py"  # the engine's own function, taken from the namespace the file runs in
    thief.write_text('LAB = "toy"\n_answer = double\n\nclass Pool:\n    def take(self):\n        return 1\n\n'
                     'def double(x):\n    return _answer(x)\n')
    namespace2 = {"__file__": str(engine_file), "__name__": "toy_engine"}
    exec(compile(engine_file.read_text(), str(engine_file), "exec"), namespace2)
    monkeypatch.setenv("LAB_IMPL", str(thief))
    lab_impl.plug_lab_parts(namespace2)
    with pytest.raises(NotImplementedError, match="lab toy: double"):
        namespace2["double"](2)  # what the file took was the "not written" stub
    only_line = tmp_path / "only.py"
    only_line.write_text('LAB = "toy"\n')
    namespace3 = {"__file__": str(engine_file), "__name__": "toy_engine"}
    exec(compile(engine_file.read_text(), str(engine_file), "exec"), namespace3)
    monkeypatch.setenv("LAB_IMPL", str(only_line))
    with pytest.raises(LabImplError, match="needs `Pool.take`"):  # a file holding only its LAB line gets no part
        lab_impl.plug_lab_parts(namespace3)


def test_the_seam_names_what_is_missing(tmp_path, monkeypatch):
    engine_file = tmp_path / "toy_engine.py"
    engine_file.write_text(MODULE)
    namespace = {"__file__": str(engine_file), "__name__": "toy_engine"}
    exec(compile(MODULE, str(engine_file), "exec"), namespace)
    student = tmp_path / "toy.py"
    student.write_text('LAB = "toy"\n\ndef double(x):\n    return x\n')
    monkeypatch.setenv("LAB_IMPL", str(student))
    with pytest.raises(LabImplError, match=r"toy.py: lab toy needs `Pool.take`"):
        lab_impl.plug_lab_parts(namespace)
    monkeypatch.setenv("LAB_IMPL", str(tmp_path / "nowhere.py"))
    with pytest.raises(LabImplError, match="no such file or directory"):
        lab_impl.plug_lab_parts(namespace)
    with pytest.raises(LabImplError, match="names no lab"):
        solution_regions("def f():\n    # BEGIN SOLUTION\n    pass\n    # END SOLUTION\n")
    with pytest.raises(LabImplError, match="one function, one lab"):
        lab_parts("def f():\n    # BEGIN SOLUTION a\n    x = 1\n    # END SOLUTION\n    # BEGIN SOLUTION b\n    pass\n    # END SOLUTION\n")


@pytest.mark.slow
def test_the_engine_generates_the_same_text_through_the_seam(tmp_path, tiny_llama_dir):
    answers = tmp_path / "answers"
    answers.mkdir()
    for lab in labs.LABS:
        if lab.base is None:
            (answers / f"{lab.name}.py").write_text(labs.cut(lab, keep_solution=True))
    args = ["-m", "engine", "generate", "--model", str(tiny_llama_dir), "--raw", "--max-tokens", "12", "--block-size", "4",
            "--quiet", "--json", "the paged KV cache", "blocks and slots"]
    own = _run(args, timeout=600)
    plugged = _run([*args, "--impl", str(answers)], timeout=600)
    assert own.returncode == 0 and plugged.returncode == 0, own.stderr[-2000:] + plugged.stderr[-2000:]
    texts = [json.loads(r.stdout)["outputs"] for r in (own, plugged)]
    assert texts[0] == texts[1] and texts[0][0]["token_ids"], "the model answers plugged in from files change the output"
    starter = _run([*args, "--impl", "starter"], timeout=600)
    assert starter.returncode == 2 and "error: not written yet: " in starter.stderr and "(lab " in starter.stderr \
        and "Traceback" not in starter.stderr, "the starters are plugged in, and the first part not written ends it in one line"


@pytest.mark.slow
def test_grade_the_model_answer_full_and_the_starters_below_full(tmp_path):
    solution = _run(["-m", "lessons", "grade", "--impl", "solution", "--json"])
    assert solution.returncode == 0, solution.stdout[-3000:] + solution.stderr[-2000:]
    report = json.loads(solution.stdout)
    assert len(report["labs"]) >= 12 and all(lab["score"] == lab["max_score"] for lab in report["labs"])
    results = tmp_path / "results.json"
    starter = _run(["-m", "lessons", "grade", "--impl", "starter", "--json", "--gradescope", str(results)])
    assert starter.returncode == 1, starter.stderr[-2000:]
    report = json.loads(starter.stdout)
    assert len(report["labs"]) >= 12 and report["score"] == 0, "the untouched starters, the find-the-bug ones included, score nothing"
    failed = [t for lab in report["labs"] for t in lab["tests"] if not t["passed"]]
    assert all(t["output"] for t in failed), "every failed test carries a hint"
    gradescope = json.loads(results.read_text())
    assert set(gradescope) >= {"score", "tests"} and gradescope["score"] == report["score"]
    for test in gradescope["tests"]:
        assert set(test) >= {"name", "score", "max_score", "output", "visibility"}
        assert 0 <= test["score"] <= test["max_score"] and test["visibility"] in ("visible", "hidden", "after_due_date", "after_published")


def test_a_crash_a_loop_and_an_import_error_cost_their_own_lab_only(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    block_pool = labs.cut(labs.get("block_pool"), keep_solution=True)
    block_pool = block_pool.replace("        if self.ref_counts[block_id] == 0:\n            self.free_blocks.remove(block_id)\n",
                                    "        while True:\n            pass\n", 1)  # touch never returns
    (mine / "block_pool.py").write_text(block_pool)
    (mine / "spec_verify.py").write_text('LAB = "spec_verify"\n\ndef verify_greedy(drafts, targets:\n')  # a syntax error
    swap = labs.cut(labs.get("swap"), keep_solution=True).replace(
        '        mapping: dict[int, int] = {}\n', '        mapping: dict[int, int] = {}\n        1 / 0\n', 1)
    (mine / "swap.py").write_text(swap)
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    (hidden / "test_lab_chunked_prefill_hidden.py").write_text("def test_a_hidden_check():\n    assert False, 'the hidden hint'\n")
    done = _run(["-m", "lessons", "grade", "block_pool", "spec_verify", "swap", "chunked_prefill", "--impl", str(mine),
                 "--json", "--timeout", "5", "--tests", str(hidden)], timeout=600)
    assert done.returncode == 1, done.stderr[-2000:]
    by_name = {lab["name"]: lab for lab in json.loads(done.stdout)["labs"]}
    pool = by_name["block_pool"]
    looped = [t for t in pool["tests"] if not t["passed"]]
    assert 0 < pool["score"] < pool["max_score"] and looped and all("Timeout" in t["output"] for t in looped), \
        "each test that reaches the loop fails on its own timeout; the others pass"
    assert by_name["spec_verify"]["score"] == 0 and "SyntaxError" in json.dumps(by_name["spec_verify"])
    swap_failed = [t["output"] for t in by_name["swap"]["tests"] if not t["passed"]]
    assert swap_failed and all("ZeroDivisionError" in o and "swap.py" in o for o in swap_failed), swap_failed
    assert by_name["chunked_prefill"]["score"] == 0 and "not handed in" in by_name["chunked_prefill"]["error"], \
        "a lab without the student's file scores nothing (the engine's own part would pass)"
    (mine / "chunked_prefill.py").write_text(labs.cut(labs.get("chunked_prefill"), keep_solution=True))
    done = _run(["-m", "lessons", "grade", "chunked_prefill", "--impl", str(mine), "--json", "--tests", str(hidden)], timeout=600)
    chunked = json.loads(done.stdout)["labs"][0]
    hidden_outputs = [t["output"] for t in chunked["tests"] if t["hidden"]]
    assert len(hidden_outputs) == 1 and hidden_outputs[0].startswith("AssertionError: the hidden hint"), hidden_outputs
    assert chunked["score"] < chunked["max_score"], "a hidden test counts"


def test_the_handout_has_no_model_answer(tmp_path):
    written = labs.write_handout(tmp_path / "handout")
    assert not [p for p in written if p.startswith(("lessons/solutions/", "labs/bugs/", "tests/"))]
    assert "labs/starters/block_pool.py" in written and "labs/tests/test_lab_block_pool.py" in written
    for lab, module in lab_modules().items():
        source = module.read_text(encoding="utf-8")
        handed = (tmp_path / "handout" / module.relative_to(ROOT)).read_text(encoding="utf-8")
        assert "# BEGIN SOLUTION" not in handed and f'raise NotImplementedError("lab {lab}:' in handed
        compile(handed, str(module), "exec")
        assert source != handed
        assert [p.qualname for p in lab_parts(handed)[lab]] == [p.qualname for p in lab_parts(source)[lab]], \
            f"the handout's {module.name} marks where lab {lab}'s parts plug in, as the engine's module does"


def test_a_student_grades_their_folder_in_the_handout(tmp_path):
    handout = tmp_path / "handout"
    labs.write_handout(handout)
    mine = handout / "labs" / "mine"
    mine.mkdir()
    for name in ("block_pool", "slot_mapping"):  # the student's finished files, as in labs/README.md
        (mine / f"{name}.py").write_text(labs.cut(labs.get(name), keep_solution=True))
    env = {k: v for k, v in os.environ.items() if k not in ("LAB_IMPL", "LAB_ONLY")}
    env.update(PYTHONPATH=str(handout), OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-m", "lessons", "grade", "block_pool", "slot_mapping", "--impl", "labs/mine", "--json"],
                          cwd=handout, env=env, capture_output=True, text=True, timeout=600)
    by_name = {lab["name"]: lab for lab in json.loads(done.stdout)["labs"]}
    assert by_name["block_pool"]["score"] == by_name["block_pool"]["max_score"], by_name["block_pool"]
    failed = [t["output"] for t in by_name["slot_mapping"]["tests"] if not t["passed"]]
    assert len(failed) == 1 and "lab chunked_prefill" in failed[0] and "this test also runs lab chunked_prefill's part" in failed[0], \
        "the scheduler test waits for a later lab's part, and its hint says so"
    done = subprocess.run([sys.executable, "-m", "lessons", "compare", "--impl", "labs/mine"], cwd=handout, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 1 and done.stdout.startswith("the engine's own parts stopped at step 0") \
        and "nothing to compare against" in done.stdout, "in the handout the reference is the starters: compare says so"


def test_a_weeks_handout_cuts_only_its_labs_and_a_later_week_adds_to_it(tmp_path):
    handout = tmp_path / "handout"
    labs.write_handout(handout, labs.chosen_labs(["block_pool", "slot_mapping"]))
    assert sorted(p.name for p in (handout / "labs" / "starters").iterdir()) == ["block_pool.py", "slot_mapping.py"], \
        "`cp -r labs/starters labs/mine` copies this week's labs only"
    assert labs.handed_out(handout) == {"block_pool", "slot_mapping"}
    manager = (handout / "engine" / "core" / "block_manager.py").read_text(encoding="utf-8")
    assert 'raise NotImplementedError("lab slot_mapping:' in manager and "# BEGIN SOLUTION fork_cow" in manager
    assert {"slot_mapping", "fork_cow", "append_slot"} <= set(lab_parts(manager)), "a module with both marks every lab's parts"
    mine = handout / "labs" / "mine"
    mine.mkdir()
    for name in ("block_pool", "slot_mapping"):  # the student's finished files: the model answers
        (mine / f"{name}.py").write_text(labs.cut(labs.get(name), keep_solution=True))
    env = {k: v for k, v in os.environ.items() if k not in ("LAB_IMPL", "LAB_ONLY")}
    env.update(PYTHONPATH=str(handout), OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-m", "lessons", "grade", "block_pool", "slot_mapping", "--impl", "labs/mine", "--json"],
                          cwd=handout, env=env, capture_output=True, text=True, timeout=600)
    by_name = {lab["name"]: lab for lab in json.loads(done.stdout)["labs"]}
    assert done.returncode == 0 and all(lab["score"] == lab["max_score"] for lab in by_name.values()), \
        "with only the week's labs written, each scores full: the other labs' parts are the engine's own"
    labs.write_handout(handout, labs.chosen_labs(["fork_cow", "bug_cow"]), add=True)  # the next week, into the student's copy
    assert labs.handed_out(handout) == {"block_pool", "slot_mapping", "fork_cow"}, \
        "bug_cow's starter is fork_cow's answer with one bug: it waits until fork_cow is in the handout"
    labs.write_handout(handout, labs.chosen_labs(["bug_cow"]), add=True)  # the week after
    assert labs.handed_out(handout) == {"block_pool", "slot_mapping", "fork_cow", "bug_cow"}
    assert sorted(p.name for p in mine.iterdir()) == ["block_pool.py", "slot_mapping.py"], "the student's work is kept"
    manager = (handout / "engine" / "core" / "block_manager.py").read_text(encoding="utf-8")
    assert "# BEGIN SOLUTION fork_cow" not in manager and 'raise NotImplementedError("lab slot_mapping:' in manager
    assert (handout / "labs" / "starters" / "fork_cow.py").is_file()
    with pytest.raises(labs.LabError, match="not empty"):
        labs.write_handout(handout, labs.chosen_labs(through_lesson=4))


def test_the_autograder_zip(tmp_path):
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    (hidden / "test_lab_block_pool_more.py").write_text("def test_x():\n    pass\n")
    path = labs.write_autograder(tmp_path / "autograder.zip", hidden)
    with zipfile.ZipFile(path) as zf:
        names = set(zf.namelist())
        assert {"setup.sh", "run_autograder", "labs/hidden/test_lab_block_pool_more.py", "engine/core/lab_impl.py"} <= names
        assert "--tests labs/hidden" in zf.read("run_autograder").decode()
        assert zf.getinfo("run_autograder").external_attr >> 16 & 0o111


def test_compare_finds_the_first_step_a_seeded_bug_diverges_and_names_a_students_exception():
    from lessons import compare

    reference = compare.run("solution")
    assert reference["error"] is None and len(reference["steps"]) > 5
    kinds = {e["kind"] for step in reference["steps"] for e in step["events"]}
    assert {"fork", "copy_on_write", "cache_hit", "evict", "preempt"} <= kinds, "the workload exercises every part"
    assert compare.first_divergence(reference, reference) is None
    found = compare.first_divergence(reference, compare.run(str(labs.starter_path(labs.get("bug_cow")))))
    assert found["field"] == "events" and found["reference_event"]["kind"] == "copy_on_write", found
    assert "event" in compare.describe(found) and f"step {found['step']}" in compare.describe(found)
    crashed = compare.first_divergence(reference, compare.run("starter", ["block_pool"]))
    assert crashed["field"] == "error" and crashed["step"] == 0
    error = crashed["error"]
    assert error["lab"] == "block_pool" and error["file"].endswith("labs/starters/block_pool.py") and error["line"] > 0
    assert "NotImplementedError" in compare.describe(crashed)


def test_an_impl_the_engine_cannot_use_is_one_clear_line(tmp_path):
    missing = _run(["-m", "engine", "generate", "hi", "--impl", str(tmp_path / "nowhere.py")], timeout=300)
    assert missing.returncode == 2 and missing.stderr.strip().splitlines() == [
        f"error: LAB_IMPL={tmp_path / 'nowhere.py'}: no such file or directory (solution, starter, a directory or a .py file)"]
    empty = tmp_path / "block_pool.py"
    empty.write_text('LAB = "block_pool"\n')
    lacking = _run(["-m", "engine", "generate", "hi", "--impl", str(empty)], timeout=300)
    assert lacking.returncode == 2 and "lab block_pool needs `FreeBlockQueue.popleft`" in lacking.stderr
    assert "Traceback" not in lacking.stderr


def test_a_students_engine_beside_the_engines_own_step_for_step(tiny_llama_dir, tmp_path):
    """lessons/beside.py, the Live page's second engine: on the engine's own parts its records equal the
    page's engine's at every step; a student's endless loop ends their engine alone, named by lab, file
    and line (tiny model)."""
    from engine import EngineConfig, LLMEngine, SamplingParams
    from lessons.beside import BesideEngine, report_record
    from lessons.compare import first_divergence

    config = EngineConfig(model=str(tiny_llama_dir), block_size=4, num_gpu_blocks=16, device="cpu")
    requests = [(list(range(10, 19)), SamplingParams(max_tokens=3, n=2)), (list(range(10, 16)), SamplingParams(max_tokens=2))]
    ours, theirs = LLMEngine(config), BesideEngine(config, requests, "solution")
    for prompt, params in requests:
        ours.add_request(prompt, params)
    records = []
    while ours.has_unfinished_requests():
        theirs.send_step()
        records.append(report_record(ours.step()))
        theirs.receive()
    theirs.close()
    assert len(records) >= 3 and first_divergence({"steps": records, "error": None}, {"steps": theirs.records, "error": None}) is None
    assert {e["kind"] for r in records for e in r["events"]} >= {"fork", "write", "free"}, "the workload forks and frees"
    looping = tmp_path / "block_pool.py"
    looping.write_text(labs.cut(labs.get("block_pool"), keep_solution=True).replace(
        "        if not self.free_blocks:\n", "        while self.free_blocks:\n            pass\n        if not self.free_blocks:\n", 1))
    stuck = BesideEngine(config, requests, str(looping), step_timeout_s=3)
    stuck.step()
    error = stuck.error
    assert error is not None and error["exception"].startswith("TimeoutError") and not stuck.alive, error
    line = looping.read_text().splitlines().index("        while self.free_blocks:") + 1
    assert (error["lab"], error["file"], error["line"]) in {("block_pool", str(looping), line), ("block_pool", str(looping), line + 1)}, error
