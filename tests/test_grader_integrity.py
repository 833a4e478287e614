"""The grader against submissions that try to get marks without writing the part (tests/data/grader_tricks/).

One submission folder holds a trick per lab, beside one lab written correctly (the model answer). Each lab is
graded alone, so every trick lab must score 0 while the honest lab keeps full marks, and the results file is
the grader's own. Where the grader runs as root (CI, Gradescope), the submission's code runs as ``nobody``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lessons.labs import BY_NAME, cut

ROOT = Path(__file__).resolve().parents[1]
TRICKS = ROOT / "tests" / "data" / "grader_tricks"
HIDDEN_MARK = "HIDDEN-SOURCE-7f3a"
AS_ROOT = os.geteuid() == 0


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """Grade every trick in one run (each lab alone), with a hidden test for two of the labs."""
    tmp = tmp_path_factory.mktemp("tricks")
    submission = tmp / "submission"
    shutil.copytree(TRICKS, submission, ignore=shutil.ignore_patterns("README.md"))
    if not AS_ROOT:  # killing the grader is stopped by running the submission as another user: root only
        (submission / "admission.py").unlink()
    (submission / "chunked_prefill.py").write_text(cut(BY_NAME["chunked_prefill"], keep_solution=True))  # one honest lab
    hidden = tmp / "hidden"
    hidden.mkdir()
    for lab in ("append_slot", "block_pool"):
        (hidden / f"test_lab_{lab}_hidden.py").write_text(
            f"# {HIDDEN_MARK}\nfrom labkit import request, scheduler, step\n\n\ndef test_hidden_a_request_gets_its_blocks():\n"
            "    sched = scheduler(num_blocks=8, block_size=4)\n    group = request(0, 6)\n    sched.add(group)\n"
            "    step(sched)\n    step(sched)  # a prefill, then a decode (append_slot)\n"
            "    assert len(group.seqs[0].block_table) == 2, 'seven tokens in blocks of four'\n")
    results = tmp / "results" / "results.json"
    labs = sorted(p.stem for p in submission.glob("*.py"))
    done = subprocess.run([sys.executable, "-m", "lessons", "grade", *labs, "--impl", str(submission), "--tests", str(hidden),
                           "--json", "--gradescope", str(results), "--import-timeout", "10", "--jobs", "2"],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode in (0, 1), done.stderr[-3000:]
    report = json.loads(done.stdout)
    return {"labs": {lab["name"]: lab for lab in report["labs"]}, "results": json.loads(results.read_text()),
            "stdout": done.stdout, "stderr": done.stderr}


def test_every_trick_scores_nothing_and_the_honest_lab_full_marks(graded):
    labs = graded["labs"]
    assert labs["chunked_prefill"]["score"] == 10, "a correct lab keeps its marks beside broken ones (each lab alone)"
    tricks = {name: lab["score"] for name, lab in labs.items() if name != "chunked_prefill"}
    assert tricks and all(score == 0 for score in tricks.values()), tricks


def test_a_part_not_written_is_never_the_engines(graded):
    labs = graded["labs"]
    for name in ("paged_attention", "lpm", "block_pool", "slot_mapping", "fork_cow"):
        text = labs[name]["error"] + " ".join(t["output"] for t in labs[name]["tests"])
        assert "written in this file" in text or "not written yet" in text or "raised" in text or text, (name, text)
    assert "written in this file" in labs["paged_attention"]["error"] + str(labs["paged_attention"]["tests"])


def test_a_process_that_leaves_early_or_patches_pytest_scores_nothing_with_the_reason(graded):
    labs = graded["labs"]
    assert "os._exit" in labs["kv_quant"]["error"]
    assert "pytest's reporting was changed" in labs["spec_verify"]["error"]
    assert "did not finish importing your file within 10 s" in labs["swap"]["error"]
    assert "did not sign" in labs["sliding_window"]["error"], "a line the grader did not sign ends the run with no marks"
    assert any("grader's pytest plugin" in flag for flag in labs["lookahead"]["flags"])


def test_the_teacher_sees_the_flags(graded):
    labs = graded["labs"]
    expect = {"fork_cow": "imports the lab's own engine module", "slot_mapping": "calls exec", "kv_quant": "os._exit",
              "spec_verify": "pytest's internals", "append_slot": "calls open"}
    for name, words in expect.items():
        assert any(words in flag for flag in labs[name]["flags"]), (name, labs[name]["flags"])
    hidden_rows = [t for t in graded["results"]["tests"] if t["name"].endswith("flagged for the teacher")]
    assert hidden_rows and all(t["visibility"] == "hidden" and t["score"] == 0 for t in hidden_rows)
    assert labs["chunked_prefill"]["flags"] == [], "the model answer is not flagged"


def test_the_results_file_is_the_graders_and_the_hidden_tests_stay_hidden(graded):
    results = graded["results"]
    assert results["score"] == 10, "only the honest lab's marks, whatever a submission wrote"
    visible = [t["output"] for t in results["tests"] if t["visibility"] == "visible"]
    assert not any(HIDDEN_MARK in text or "test_hidden_a_request" in text for text in visible)
    hidden = [t for t in results["tests"] if t["visibility"] == "after_published"]
    assert hidden and not any(t["passed"] if "passed" in t else t["score"] for t in hidden if "append_slot" in t["name"])


@pytest.mark.skipif(not AS_ROOT, reason="the submission runs as another user only when the grader runs as root (Gradescope, CI)")
def test_as_root_the_submission_runs_as_nobody_and_cannot_kill_the_grader(graded):
    assert "tests run as root" not in graded["stderr"], graded["stderr"]
    assert graded["labs"]["admission"]["score"] == 0
    assert "Permission" in json.dumps(graded["labs"]["admission"]), graded["labs"]["admission"]
