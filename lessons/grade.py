"""Grade labs: run each lab's tests on the chosen implementation, one pytest process per lab.

``python -m lessons grade [LAB ...] [--impl solution|starter|PATH] [--json] [--gradescope FILE] [--tests DIR] [--jobs N]``

Each lab's tests (``labs/tests/test_lab_<lab>.py``; a find-the-bug lab runs the tests of the lab it
copies) run in a subprocess of their own with ``LAB_IMPL`` naming the implementation
(``engine/core/lab_impl.py``), under pytest-timeout: a student's crash, endless loop or import error
costs that lab's points and the next lab runs. Labs run side by side (``--jobs``, by default the
machine's cores, at most 4). Every lab is worth :data:`POINTS` points, shared evenly by its tests;
a failed test prints its message as the hint. ``--tests DIR`` adds a teacher's hidden tests
(``DIR/test_lab_<lab>*.py``), which Gradescope shows only once grades are published.
The exit status is 0 only when every chosen lab scores full marks.

``--impl``: ``solution`` (the engine's own parts), ``starter`` (``labs/starters/``), a directory of the
student's files named as the starters (every lab's part from it, so that the labs build on each other,
as in the handout), or one file (its lab: the file's name, else its ``LAB = "..."`` line).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from engine.core.lab_impl import LAB_IMPL_ENV, LAB_LINE, LAB_ONLY_ENV
from lessons.labs import BY_NAME, LABS, ROOT, STARTERS, TESTS, Lab

POINTS = 10.0
TEST_TIMEOUT_S = 60  # per test (pytest-timeout)
LAB_REPORT_ENV = "LAB_REPORT"  # where a lab's tests may write what they measured (the open lab's simulation)
LAB_TIMEOUT_S = 600  # per lab's whole pytest run
DEFAULT_JOBS = max(1, min(4, os.cpu_count() or 1))


@dataclass
class TestResult:
    name: str
    score: float
    max_score: float
    passed: bool
    output: str = ""
    hidden: bool = False


@dataclass
class LabResult:
    name: str
    title: str
    score: float
    max_score: float
    seconds: float
    tests: list[TestResult] = field(default_factory=list)
    error: str = ""
    ranking: list[dict] = field(default_factory=list)  # the open lab: FCFS, the model answer and yours, best TTFT p90 first

    @property
    def full(self) -> bool:
        return self.score >= self.max_score - 1e-9


def impl_env(lab: Lab, impl: str) -> dict[str, str]:
    """``LAB_IMPL`` (and ``LAB_ONLY``) for grading ``lab`` on ``impl``."""
    if impl == "solution":
        return {LAB_IMPL_ENV: "solution"}
    if impl == "starter":
        return {LAB_IMPL_ENV: str(STARTERS / f"{lab.name}.py"), LAB_ONLY_ENV: lab.part_lab}
    path = Path(impl).expanduser().resolve()
    if path.is_dir():
        own = path / f"{lab.name}.py"
        if lab.base is not None:  # the seeded copy's part wins over the directory's copy of the lab it copies
            return {LAB_IMPL_ENV: os.pathsep.join([str(path), str(own)])}
        return {LAB_IMPL_ENV: str(path)}
    return {LAB_IMPL_ENV: str(path), LAB_ONLY_ENV: lab.part_lab}


def labs_for(impl: str, names: list[str]) -> list[Lab]:
    """The labs to grade: those named, else all (a single file: its lab)."""
    if names:
        unknown = [n for n in names if n not in BY_NAME]
        if unknown:
            raise SystemExit(f"error: no lab {', '.join(unknown)}; the labs: {', '.join(BY_NAME)}")
        return [BY_NAME[n] for n in names]
    path = Path(impl).expanduser()
    if impl not in ("solution", "starter") and path.is_file():
        if path.stem in BY_NAME:
            return [BY_NAME[path.stem]]
        found = LAB_LINE.search(path.read_text(encoding="utf-8"))
        if found and found["lab"] in BY_NAME:
            return [BY_NAME[found["lab"]]]
        raise SystemExit(f"error: {path}: name it after its lab (e.g. block_pool.py) or name the lab on the command line")
    if impl not in ("solution", "starter") and not path.exists():
        raise SystemExit(f"error: --impl {impl}: no such file or directory (solution, starter, a directory or a .py file)")
    return list(LABS)


def test_files(lab: Lab, hidden_dir: Path | None) -> tuple[list[Path], list[Path]]:
    own = [TESTS / f"test_lab_{lab.part_lab}.py"] + sorted(TESTS.glob(f"test_lab_{lab.name}_*.py"))
    if lab.base is not None and (TESTS / f"test_lab_{lab.name}.py").is_file():
        own.append(TESTS / f"test_lab_{lab.name}.py")
    hidden = sorted(Path(hidden_dir).glob(f"test_lab_{lab.name}*.py")) if hidden_dir else []
    return own, hidden


def _hint(text: str) -> str:
    """The first useful lines of a failure: a not-yet-written part, else the assertion's message."""
    match = re.search(r"NotImplementedError: lab (\w+): ([\w.]+)", text)
    if match:
        return f"not written yet: {match[2]} (lab {match[1]})"
    lines = [line for line in text.strip().splitlines() if line.strip()]
    raised = [line[1:].strip() for line in lines if line.startswith("E ")]  # pytest's lines of the exception
    if raised and not lines[0].startswith("AssertionError"):
        return "\n".join(raised[:6])[:1200]
    return "\n".join(lines[:6])[:1200]


def _another_labs_part(lab: Lab, hint: str) -> str:
    """A hint's note when the part not yet written is another lab's, which this lab's test also runs
    (in the handout the engine's parts are the starters until each lab is written)."""
    match = re.match(r"not written yet: [\w.]+ \(lab (\w+)\)", hint)
    if not match or match[1] in (lab.name, lab.part_lab) or match[1] not in BY_NAME:
        return ""
    other = BY_NAME[match[1]]
    return (f"\nthis test also runs lab {other.name}'s part (after lesson {other.lesson}), which is not written yet: "
            f"the test passes once that lab is")


def _location(text: str) -> str:
    """The student's file and line in a traceback, when the failure happened there."""
    found = [(m[1] or m[3], m[2] or m[4]) for m in re.finditer(r'^([^\s:][^:\n]*\.py):(\d+): |File "([^"]+\.py)", line (\d+)', text, re.MULTILINE)]
    ours = ("engine/", "paged_kernels/", "labs/tests/", "site-packages", "/lib/python", "<frozen")
    found = [(f, n) for f, n in found if not any(part in f for part in ours) and not f.startswith(str(ROOT / "engine"))]
    return f" ({found[-1][0]}:{found[-1][1]})" if found else ""


def run_lab(lab: Lab, impl: str, hidden_dir: Path | None = None, timeout_s: int = LAB_TIMEOUT_S,
            test_timeout_s: int = TEST_TIMEOUT_S) -> LabResult:
    """Grade one lab in a pytest process of its own; safe to call from several threads at once."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "measured.json"
        result = _run_tests(lab, impl, hidden_dir, timeout_s, test_timeout_s, report)
        yours = json.loads(report.read_text()) if report.is_file() else None
        if yours is not None:  # a lab measured on the simulator: rank it beside FCFS and the model answer
            report.unlink()
            if impl != "solution":
                _run_tests(lab, "solution", None, timeout_s, test_timeout_s, report)
            answer = json.loads(report.read_text()) if report.is_file() else {}
            rows = [{"policy": "model answer" if impl == "solution" else "yours", **yours["yours"]}, {"policy": "FCFS", **yours["fcfs"]}]
            if answer:
                rows.insert(1, {"policy": "model answer", **answer["yours"]})
            result.ranking = sorted(rows, key=lambda row: row["ttft_p90_s"])
    return result


def _run_tests(lab: Lab, impl: str, hidden_dir: Path | None, timeout_s: int, test_timeout_s: int,
               measured: Path | None = None) -> LabResult:
    folder = Path(impl).expanduser()
    if impl not in ("solution", "starter") and folder.is_dir() and not (folder / f"{lab.name}.py").is_file():
        # Without the student's file the engine's own part would run: no points for a lab not handed in.
        return LabResult(lab.name, lab.title[0], 0.0, POINTS, 0.0, error=f"no {lab.name}.py in {impl}: this lab was not handed in")
    own, hidden = test_files(lab, hidden_dir)
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.xml"
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", f"--timeout={test_timeout_s}",
               "--tb=short", "-o", "junit_family=xunit1", f"--junitxml={report}", "--rootdir", str(ROOT), *map(str, own + hidden)]
        chosen = impl_env(lab, impl)
        env = {k: v for k, v in os.environ.items() if k not in (LAB_IMPL_ENV, LAB_ONLY_ENV, LAB_REPORT_ENV)}
        if measured is not None:
            env[LAB_REPORT_ENV] = str(measured)
        env.update(chosen, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        try:
            done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)
            log = done.stdout + done.stderr
        except subprocess.TimeoutExpired:
            log = f"the lab's tests ran past {timeout_s} s and were stopped"
            done = None
        seconds = time.monotonic() - start
        tests = _parse(report, {str(p.resolve()) for p in hidden}) if report.is_file() else []
    result = LabResult(lab.name, lab.title[0], 0.0, POINTS, round(seconds, 1), tests)
    if not tests:  # pytest itself failed, or the run was stopped
        result.error = _hint(log[-4000:]) if done is not None else log
        return result
    share = POINTS / len(tests)
    for t in tests:
        t.output += _another_labs_part(lab, t.output)
        t.max_score = round(share, 4)
        t.score = t.max_score if t.passed else 0.0
    result.score = round(sum(t.score for t in tests), 2)
    return result


def _parse(report: Path, hidden_files: set[str]) -> list[TestResult]:
    out = []
    for case in ET.parse(report).getroot().iter("testcase"):
        classname, name = case.get("classname", ""), case.get("name", "")
        problem = next((c for c in case if c.tag in ("failure", "error")), None)
        skipped = next((c for c in case if c.tag == "skipped"), None)
        if skipped is not None and problem is None:
            continue
        file = case.get("file") or ""
        hidden = bool(file) and str((ROOT / file).resolve()) in hidden_files
        classname = classname or Path(file).stem
        collection = problem is not None and (problem.get("message") == "collection failure" or not name)
        output = ""
        if problem is not None:
            output = _hint(problem.text or "" if collection else problem.get("message") or problem.text or "") + _location(problem.text or "")
        label = f"{(name or classname or file).rsplit('.', 1)[-1]}::collection" if collection else f"{classname.rsplit('.', 1)[-1]}::{name}"
        out.append(TestResult(label, 0.0, 0.0, problem is None, output, hidden))
    return out


def gradescope(results: list[LabResult]) -> dict:
    """Gradescope's ``results.json`` (autograder specification: score, tests with name, score,
    max_score, output, visibility)."""
    tests = []
    for lab in results:
        if not lab.tests:
            tests.append({"name": f"{lab.name}", "score": 0.0, "max_score": lab.max_score, "output": lab.error or "no test ran",
                          "visibility": "visible"})
        for t in lab.tests:
            tests.append({"name": f"{lab.name}: {t.name}", "score": t.score, "max_score": t.max_score, "output": t.output,
                          "visibility": "after_published" if t.hidden else "visible"})
    score = round(sum(r.score for r in results), 2)
    return {"score": score, "output": f"{score} / {sum(r.max_score for r in results):g} over {len(results)} labs",
            "visibility": "visible", "stdout_visibility": "hidden", "tests": tests}


def format_text(results: list[LabResult], impl: str) -> str:
    lines = [f"implementation: {impl}"]
    for r in results:
        passed = sum(t.passed for t in r.tests)
        mark = "full" if r.full else ""
        lines.append(f"{r.name:<16} {r.score:>5g} / {r.max_score:g}  ({passed} of {len(r.tests)} tests, {r.seconds:.0f} s) {mark}".rstrip())
        if r.error:
            lines += ["    " + line for line in r.error.splitlines()]
        for place, row in enumerate(r.ranking, 1):
            lines.append(f"    place {place}: {row['policy']:<13} TTFT p90 {row['ttft_p90_s']:.2f} s, "
                         f"{row['throughput_tokens_per_s']:.0f} output tokens/s, {row['completed']} completed")
        for t in r.tests:
            if not t.passed:
                first, *rest = t.output.splitlines() or [""]
                lines.append(f"    FAIL {t.name}: {first}")
                lines += [f"         {line}" for line in rest[:4]]
    total, most = sum(r.score for r in results), sum(r.max_score for r in results)
    lines.append(f"total {total:g} / {most:g}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m lessons grade", description=__doc__.split("\n\n")[0])
    parser.add_argument("labs", nargs="*", metavar="LAB", help=f"labs to grade (default: all): {', '.join(BY_NAME)}")
    parser.add_argument("--impl", default=os.environ.get(LAB_IMPL_ENV) or "solution",
                        help="solution, starter, a directory of your lab files, or one file (default: $LAB_IMPL or solution)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--gradescope", type=Path, metavar="RESULTS_JSON", help="also write Gradescope's results.json there")
    parser.add_argument("--tests", type=Path, metavar="DIR", help="a directory of hidden tests to add (test_lab_<lab>*.py)")
    parser.add_argument("--timeout", type=int, default=TEST_TIMEOUT_S, metavar="S",
                        help=f"seconds one test may run before it fails (default {TEST_TIMEOUT_S}: an endless loop costs one test)")
    parser.add_argument("--jobs", "-j", type=int, default=DEFAULT_JOBS, metavar="N",
                        help=f"labs graded at once, each in its own process (default {DEFAULT_JOBS}: this machine's cores, at most 4)")
    args = parser.parse_args(argv)
    if args.tests is not None and not args.tests.is_dir():
        parser.error(f"--tests {args.tests}: not a directory")
    if args.jobs < 1:
        parser.error(f"--jobs {args.jobs}: at least 1")
    labs = labs_for(args.impl, args.labs)
    results = []
    # Each lab is its own pytest process, so labs run side by side; results print in the labs' order.
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for result in pool.map(lambda lab: run_lab(lab, args.impl, args.tests, test_timeout_s=args.timeout), labs):
            results.append(result)
            if not args.json:  # one lab at a time, as it is graded
                print("\n".join(format_text(results[-1:], args.impl).splitlines()[1:-1]), flush=True)
    if args.gradescope:
        args.gradescope.parent.mkdir(parents=True, exist_ok=True)
        args.gradescope.write_text(json.dumps(gradescope(results), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    total, most = sum(r.score for r in results), sum(r.max_score for r in results)
    if args.json:
        print(json.dumps({"impl": args.impl, "score": round(total, 2), "max_score": most,
                          "labs": [{**asdict(r), "full": r.full} for r in results]}, indent=2, ensure_ascii=False))
    else:
        print(f"total {total:g} / {most:g}")
    return 0 if all(r.full for r in results) else 1
