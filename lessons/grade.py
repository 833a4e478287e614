"""Grade labs: each lab alone, in a test process of its own that a submission cannot use to forge a result.

``python -m lessons grade [LAB ...] [--impl solution|starter|PATH] [--together] [--through-lesson N]
[--json] [--gradescope FILE] [--tests DIR] [--jobs N]``

What a grade guarantees (docs/labs.md, "What the grader guarantees"):

- **Each lab alone.** A lab's tests run with that lab's part from the submission and every other part
  the engine's own (in a handout, where a part is cut out, the student's file for it). One broken file
  costs its own lab's points. ``--together`` grades all of a folder's parts at once instead, as a
  separate, labelled report.
- **No answer in reach.** Each run gets a tree of its own, a copy of the engine with the graded lab's
  solution regions cut out, as the handout's engine is; while the student's file runs, the lab's parts
  in its namespace raise "not written"; a part must be a function written in the file.
- **No way to forge a result.** The tests run in a child process that reports each test over a pipe,
  every record signed with a key written for that run alone (:mod:`lessons.grade_plugin`); the grader
  counts only signed records in order, ending in a ``done`` record, against the tests it collected
  itself before any submission ran. A process that stops short (``os._exit``, a crash, a file that
  never finishes importing within :data:`IMPORT_TIMEOUT_S`) scores 0 for that lab, with the reason. A
  run whose pytest reporting was patched scores 0. When the grader runs as root (Gradescope), the
  child runs as the unprivileged user ``nobody``: it cannot write the tests, the grader's files or the
  results, nor signal the grader. Hidden tests (``--tests``) run in a second process after every
  visible run, from a copy the visible runs cannot read.
- **What cannot be prevented is flagged**: :mod:`lessons.integrity` lists what a submission's source
  does that a part never needs, in the results for the teacher alone.

A find-the-bug lab's points go to the tests that its untouched starter fails (the bug's tests); the
others must still pass. Every lab is worth :data:`POINTS` points. The exit status is 0 only when every
chosen lab scores full marks.

``--impl``: ``solution`` (each lab's model answer, submitted as a student's file), ``starter``
(``labs/starters/``), a folder of the student's files named as the starters, or one file (its lab:
the file's name, else its ``LAB = "..."`` line).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import pwd
import queue
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from engine.core.lab_impl import LAB_IMPL_ENV, LAB_LINE, LAB_ONLY_ENV, lab_modules
from lessons.integrity import new_flags
from lessons.labs import BY_NAME, LABS, ROOT, STARTERS, TESTS, Lab, cut, strip_solutions

POINTS = 10.0
TEST_TIMEOUT_S = 60  # per test (pytest-timeout)
IMPORT_TIMEOUT_S = 120  # a lab's process: importing the student's file and collecting the tests
LAB_REPORT_ENV = "LAB_REPORT"  # where a lab's tests may write what they measured (the open lab's simulation)
LAB_TIMEOUT_S = 600  # per lab's whole test process
DEFAULT_JOBS = max(1, min(4, os.cpu_count() or 1))
SANDBOX_USER = "nobody"
PLUGIN = Path(__file__).with_name("grade_plugin.py")
FDS_ENV = "LAB_GRADE_FDS"
# The labs whose parts compare's workload runs (lessons/compare.py): their tests include the replay beside the
# engine's own steps (labs/tests/test_replay.py).
REPLAY_LABS = {"block_pool", "slot_mapping", "append_slot", "fork_cow", "prefix_cache", "radix_match", "radix_insert", "lpm",
               "admission", "preemption", "chunked_prefill"}


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
    flags: list[str] = field(default_factory=list)  # for the teacher (lessons/integrity.py)
    together: bool = False
    bug_tests: list[str] = field(default_factory=list)  # a find-the-bug lab: the tests its seeded bug fails

    @property
    def full(self) -> bool:
        return self.score >= self.max_score - 1e-9


@dataclass
class Outcome:
    """What one test process reported, as far as the grader could verify it."""

    reports: dict[str, dict] = field(default_factory=dict)  # nodeid -> {"passed", "skipped", "text"}
    collected: list[str] | None = None
    collect_errors: list[dict] = field(default_factory=list)
    tampered: list[str] = field(default_factory=list)
    forged: bool = False
    done: bool = False
    stopped: str = ""  # why the grader stopped the process, if it did
    returncode: int | None = None
    log: str = ""
    measured: dict | None = None


def _sandbox_user() -> tuple[int, int] | None:
    """(uid, gid) of the unprivileged user the tests run as when the grader runs as root; None where
    it does not (a student's own machine), or where that user cannot run this Python."""
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam(SANDBOX_USER)
        uid, gid = entry.pw_uid, entry.pw_gid
    except KeyError:
        uid = gid = 65534
    try:
        probe = subprocess.run([sys.executable, "-c", "import pytest, torch"], user=uid, group=gid, extra_groups=[], cwd="/",
                               env={"PATH": os.environ.get("PATH", ""), "HOME": "/tmp"}, capture_output=True, timeout=300)
        if probe.returncode == 0:
            return uid, gid
        why = probe.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
    except (OSError, subprocess.SubprocessError) as error:
        why = [str(error)]
    print(f"warning: the tests run as root: user {SANDBOX_USER} cannot run {sys.executable} ({why[0]}); "
          "make its folders readable by all (chmod o+rx) for the isolation docs/labs.md describes", file=sys.stderr)
    return None


def _copy_tree(src: Path, dest: Path) -> None:
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.so", "build"), dirs_exist_ok=True)


class Grader:
    """One grading: a private folder of run trees, the trusted list of tests, and each lab's runs."""

    def __init__(self, hidden_dir: Path | None = None, test_timeout_s: int = TEST_TIMEOUT_S,
                 import_timeout_s: int = IMPORT_TIMEOUT_S, lab_timeout_s: int = LAB_TIMEOUT_S):
        self.hidden_dir = Path(hidden_dir).resolve() if hidden_dir else None
        self.test_timeout_s, self.import_timeout_s, self.lab_timeout_s = test_timeout_s, import_timeout_s, lab_timeout_s
        self.root = Path(tempfile.mkdtemp(prefix="lab-grade-"))
        os.chmod(self.root, 0o711)  # the runs' trees are reachable by their random names only
        self.user = _sandbox_user()
        if self.user is not None and self.hidden_dir is not None and self.hidden_dir.stat().st_uid == 0:
            os.chmod(self.hidden_dir, 0o700)  # the submission's user cannot read the hidden tests in place
        self.cut_here = cut_out_here()  # the labs this tree (a handout) has cut out: the student's files stand in
        self.module_files = lab_modules(ROOT)
        self.modules = {lab: ".".join(path.relative_to(ROOT).with_suffix("").parts) for lab, path in self.module_files.items()}
        self._expected: dict[str, list[str]] | None = None
        self._lock = threading.RLock()

    def close(self) -> None:
        if self.user is not None:
            _kill_user(self.user[0])
        shutil.rmtree(self.root, ignore_errors=True)

    # -------------------------------------------------------------------------------------- trees
    def _tree(self, cut_lab: str | None, hidden: bool, submission: dict[str, str] | None) -> Path:
        """A run's tree: the engine and kernels (``cut_lab``'s solution regions cut out), the labs' tests,
        the hidden tests (``hidden``) and the submission's files, read-only to the submission's user."""
        tree = self.root / f"run-{secrets.token_hex(8)}"
        tree.mkdir()
        os.chmod(tree, 0o700)
        for package in ("engine", "paged_kernels"):
            _copy_tree(ROOT / package, tree / package)
        if cut_lab in self.module_files:  # (in a handout the lab is cut out already)
            module = tree / self.module_files[cut_lab].relative_to(ROOT)
            module.write_text(strip_solutions(module.read_text(encoding="utf-8"), str(module), {cut_lab}), encoding="utf-8")
        (tree / "lessons").mkdir()
        for name in ("__init__.py", "compare.py"):  # the replay's workload (labs/tests/test_replay.py)
            shutil.copy2(ROOT / "lessons" / name, tree / "lessons" / name)
        (tree / "labs").mkdir()
        _copy_tree(TESTS, tree / "labs" / "tests")
        if self.replay_reference() is not None:
            (tree / "labs" / "tests" / "replay_reference.json").write_text(self.replay_reference())
        if hidden and self.hidden_dir is not None:
            _copy_tree(self.hidden_dir, tree / "labs" / "hidden")
            (tree / "labs" / "hidden" / "conftest.py").write_text(
                "import sys\nfrom pathlib import Path\n\nsys.path.insert(0, str(Path(__file__).resolve().parents[1] / 'tests'))  # labkit\n")
        (tree / "pytest.ini").write_text("[pytest]\n")
        shutil.copy2(PLUGIN, tree / "lab_grade_plugin.py")
        if submission is not None:
            (tree / "submission").mkdir()
            for name, text in submission.items():
                (tree / "submission" / name).write_text(text, encoding="utf-8")
        for folder, dirs, files in os.walk(tree):
            for name in dirs:
                os.chmod(Path(folder) / name, 0o755)
            for name in files:
                os.chmod(Path(folder) / name, 0o644)
        os.chmod(tree, 0o755)
        return tree

    def replay_reference(self) -> str | None:
        """compare's workload on the engine's own parts, recorded once in a process of the grader's that no
        submission runs in; None where those parts cannot run it (a handout)."""
        with self._lock:
            if not hasattr(self, "_replay"):
                env = {k: v for k, v in os.environ.items() if not k.startswith("LAB_")}
                env["PYTHONPATH"] = str(ROOT)
                done = subprocess.run([sys.executable, "-m", "lessons.compare", "--record"], cwd=ROOT, env=env,
                                      capture_output=True, text=True, timeout=self.lab_timeout_s)
                record = json.loads(done.stdout) if done.returncode == 0 and done.stdout.strip() else None
                self._replay = json.dumps(record) if record and record["error"] is None else None
            return self._replay

    def expected(self) -> dict[str, list[str]]:
        """Every lab test's node id, by file (tree-relative), collected by the grader with the engine's own
        parts before any submission runs: a test a run does not report fails."""
        with self._lock:
            if self._expected is None:
                tree = self._tree(None, True, None)
                os.chmod(tree, 0o700)
                files = sorted(str(p.relative_to(tree)) for p in (tree / "labs").glob("*/test_*.py"))
                env = self._env(tree, None)
                done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                                       "-c", str(tree / "pytest.ini"), "--rootdir", str(tree), *files],
                                      cwd=tree, env=env, capture_output=True, text=True, timeout=self.lab_timeout_s)
                found: dict[str, list[str]] = {}
                for line in done.stdout.splitlines():
                    if "::" in line and not line.startswith(" "):
                        found.setdefault(line.split("::", 1)[0], []).append(line.strip())
                self._expected = found
                shutil.rmtree(tree, ignore_errors=True)
            return self._expected

    def _env(self, tree: Path, home: Path | None) -> dict[str, str]:
        drop = ("PYTHONSTARTUP", "PYTHONINSPECT", "PYTHONHOME", "PYTEST_ADDOPTS", "PYTEST_PLUGINS", LAB_REPORT_ENV, FDS_ENV)
        env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("LAB_")}
        env.update(PYTHONPATH=str(tree), PYTHONDONTWRITEBYTECODE="1")
        if home is not None:
            env.update(HOME=str(home), TMPDIR=str(home / "tmp"), XDG_CACHE_HOME=str(home / "cache"),
                       TRITON_CACHE_DIR=str(home / "triton"))
            if self.user is not None:
                env.update(USER=SANDBOX_USER, LOGNAME=SANDBOX_USER)
        return env

    # --------------------------------------------------------------------------------------- a run
    def run(self, lab: Lab, submission: dict[str, str], graded: str, files: list[str], hidden: bool,
            together: bool = False, measure: bool = False) -> Outcome:
        """Run ``files`` (tree-relative test files) on ``submission`` (file name -> text; ``graded`` is the
        graded lab's file) in a fresh tree and process; returns what it verifiably reported."""
        tree = self._tree(lab.part_lab, hidden, submission)
        home = self.root / f"home-{secrets.token_hex(8)}"
        for sub in ("", "tmp", "cache", "triton"):
            (home / sub).mkdir(exist_ok=True)
            if self.user is not None:
                os.chown(home / sub, *self.user)
            os.chmod(home / sub, 0o700)
        env = self._env(tree, home)
        sub_dir = tree / "submission"
        if together:
            env[LAB_IMPL_ENV] = str(sub_dir)
        else:
            env[LAB_IMPL_ENV] = os.pathsep.join([str(sub_dir), str(sub_dir / graded)])
            env[LAB_ONLY_ENV] = ",".join(sorted({lab.part_lab} | self.cut_here))
        if measure:
            env[LAB_REPORT_ENV] = str(home / "measured.json")
        key = secrets.token_bytes(32)
        key_r, key_w = os.pipe()
        out_r, out_w = os.pipe()
        env[FDS_ENV] = f"{key_r},{out_w}"
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "lab_grade_plugin", "-o", "addopts=",
               f"--timeout={self.test_timeout_s}", "--tb=short", "-c", str(tree / "pytest.ini"), "--rootdir", str(tree), *files]
        log_path = self.root / f"log-{secrets.token_hex(8)}"
        outcome = Outcome()
        with open(log_path, "w+b") as log:
            user = {"user": self.user[0], "group": self.user[1], "extra_groups": []} if self.user else {}
            try:
                child = subprocess.Popen(cmd, cwd=tree, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         pass_fds=(key_r, out_w), start_new_session=True, **user)
            finally:
                os.close(key_r)
                os.close(out_w)
            with os.fdopen(key_w, "wb") as pipe:
                try:
                    pipe.write(key)
                except BrokenPipeError:
                    pass
            self._read(child, out_r, key, outcome)
            log.seek(0)
            outcome.log = log.read()[-6000:].decode(errors="replace")
        os.unlink(log_path)
        if measure and (home / "measured.json").is_file():
            try:
                outcome.measured = json.loads((home / "measured.json").read_text())
            except (OSError, ValueError):
                outcome.measured = None
        shutil.rmtree(tree, ignore_errors=True)
        shutil.rmtree(home, ignore_errors=True)
        return outcome

    def _read(self, child: subprocess.Popen, out_r: int, key: bytes, outcome: Outcome) -> None:
        lines: queue.Queue = queue.Queue()

        def reader() -> None:
            with os.fdopen(out_r, "rb") as pipe:
                for line in pipe:
                    lines.put(line)
            lines.put(None)

        threading.Thread(target=reader, daemon=True).start()
        start = time.monotonic()
        seq = 0
        while True:
            limit = self.import_timeout_s if outcome.collected is None and not outcome.collect_errors else self.lab_timeout_s
            left = start + limit - time.monotonic()
            try:
                line = lines.get(timeout=max(left, 0.01))
            except queue.Empty:
                outcome.stopped = ("import" if limit == self.import_timeout_s else "time")
                _kill(child)
                continue
            if line is None:
                break
            record = _verified(line, key)
            if record is None or record.get("seq") != seq:
                outcome.forged = True
                continue
            seq += 1
            kind = record.get("kind")
            if kind == "collected":
                outcome.collected = record["nodeids"]
            elif kind == "collect_error":
                outcome.collect_errors.append(record)
            elif kind == "report":
                outcome.reports[record["nodeid"]] = record
            elif kind == "tamper":
                outcome.tampered += record["what"]
            elif kind == "done":
                outcome.done = True
        try:
            outcome.returncode = child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            _kill(child)
            outcome.returncode = child.wait()
        _kill(child)  # anything it left running in its session


def _verified(line: bytes, key: bytes) -> dict | None:
    try:
        wrapper = json.loads(line)
        body, mac = wrapper["body"], wrapper["mac"]
        if not hmac.compare_digest(hmac.new(key, body.encode(), hashlib.sha256).hexdigest(), mac):
            return None
        return json.loads(body)
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def _kill(child: subprocess.Popen) -> None:
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _kill_user(uid: int) -> None:
    """End every process of the submissions' user (one that left its session keeps running otherwise)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid:
                    os.kill(int(entry.name), signal.SIGKILL)
            except (OSError, ValueError):
                pass


def submission_files(lab: Lab, impl: str) -> tuple[dict[str, str], str, str] | None:
    """The files a lab's run gets (name -> text), the graded lab's file name, and how to show it in a
    hint; None when the folder has no file for this lab (not handed in).

    Raises:
        SystemExit: ``--impl solution`` where the model answers were cut out (a handout).
    """
    if impl == "solution":
        if lab.part_lab in cut_out_here():
            raise SystemExit("error: --impl solution: this tree is a handout; the model answers are not in it")
        return {f"{lab.name}.py": cut(lab, keep_solution=True, seed_bug=False)}, f"{lab.name}.py", "model answer"
    folder = STARTERS if impl == "starter" else Path(impl).expanduser()
    if folder.is_dir():
        own = folder / f"{lab.name}.py"
        if not own.is_file():
            return None
        files = {p.name: p.read_text(encoding="utf-8") for p in sorted(folder.glob("*.py"))}
        return files, own.name, str(folder)
    return {f"{lab.name}.py": folder.read_text(encoding="utf-8")}, f"{lab.name}.py", str(folder.parent)


def cut_out_here() -> set[str]:
    """The labs whose engine parts this tree has cut out (a handout: their TODO lines); empty in the full
    repository."""
    from engine.core.lab_impl import starter_regions

    found = set()
    for package in ("engine", "paged_kernels"):
        for path in (ROOT / package).rglob("*.py"):
            text = path.read_text(encoding="utf-8")
            if "# TODO(" in text:
                found |= {r.lab for r in starter_regions(text)}
    return found


def labs_for(impl: str, names: list[str], through_lesson: int | None = None) -> list[Lab]:
    """The labs to grade: those named, else those of lessons up to ``through_lesson``, else a single
    file's lab, else those this tree hands out (a week's handout: its labs), else all."""
    if names:
        unknown = [n for n in names if n not in BY_NAME]
        if unknown:
            raise SystemExit(f"error: no lab {', '.join(unknown)}; the labs: {', '.join(BY_NAME)}")
        chosen = [BY_NAME[n] for n in names]
    else:
        chosen = list(LABS)
    if through_lesson is not None:
        chosen = [lab for lab in chosen if lab.lesson <= through_lesson]
    path = Path(impl).expanduser()
    if not names and impl not in ("solution", "starter") and path.is_file():
        if path.stem in BY_NAME:
            return [BY_NAME[path.stem]]
        found = LAB_LINE.search(path.read_text(encoding="utf-8"))
        if found and found["lab"] in BY_NAME:
            return [BY_NAME[found["lab"]]]
        raise SystemExit(f"error: {path}: name it after its lab (e.g. block_pool.py) or name the lab on the command line")
    if impl not in ("solution", "starter") and not path.exists():
        raise SystemExit(f"error: --impl {impl}: no such file or directory (solution, starter, a directory or a .py file)")
    here = cut_out_here()
    if not names and here:  # a handout: grade the labs it holds, out of their points
        chosen = [lab for lab in chosen if lab.part_lab in here and (lab.base is None or (STARTERS / f"{lab.name}.py").is_file())]
    return chosen


def test_files(lab: Lab, hidden_dir: Path | None) -> tuple[list[str], list[str]]:
    """A lab's visible and hidden test files, relative to a run's tree."""
    own = [f"labs/tests/test_lab_{lab.part_lab}.py"] + [f"labs/tests/{p.name}" for p in sorted(TESTS.glob(f"test_lab_{lab.name}_*.py"))]
    if lab.base is not None and (TESTS / f"test_lab_{lab.name}.py").is_file():
        own.append(f"labs/tests/test_lab_{lab.name}.py")
    if lab.part_lab in REPLAY_LABS:
        own.append("labs/tests/test_replay.py")
    hidden = [f"labs/hidden/{p.name}" for p in sorted(Path(hidden_dir).glob(f"test_lab_{lab.name}*.py"))] if hidden_dir else []
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


def _shown(text: str, shown: str) -> str:
    """A hint with the run tree's copy of the submission named as the student knows it."""
    return re.sub(r"(?:\S*/run-[0-9a-f]+/)?\bsubmission/", shown.rstrip("/") + "/", text)


def _test_name(nodeid: str) -> str:
    file, _, name = nodeid.partition("::")
    return f"{Path(file).stem}::{name}"


def _stopped_reason(outcome: Outcome, flags: list[str], import_timeout_s: int, lab_timeout_s: int) -> str:
    if outcome.stopped == "import":
        return f"did not finish importing your file within {import_timeout_s} s (an endless loop at import?): no marks for this lab"
    if outcome.stopped == "time":
        return f"the lab's tests ran past {lab_timeout_s} s and were stopped: no marks for this lab"
    if outcome.forged:
        return "the test process sent results the grader did not sign: no marks for this lab"
    if outcome.tampered:
        return f"pytest's reporting was changed while the tests ran ({', '.join(outcome.tampered)}): no marks for this lab"
    if any("os._exit" in f for f in flags):
        return "your code called os._exit: the tests did not finish, no marks for this lab"
    last = [line for line in outcome.log.strip().splitlines() if line.strip()][-3:]
    return (f"the test process ended before the tests finished (exit status {outcome.returncode}): no marks for this lab"
            + ("\n" + "\n".join(last) if last else ""))


def _results(lab: Lab, outcome: Outcome, expected: list[str], hidden: bool, shown: tuple[str, str]) -> list[TestResult]:
    """One result per expected test of a finished run; a test the run did not report fails."""
    errors = {e["nodeid"].split("::")[0]: e["text"] for e in outcome.collect_errors}
    out = []
    for nodeid in expected:
        report = outcome.reports.get(nodeid)
        file = nodeid.split("::")[0]
        if report is None:
            text = errors.get(file)
            output = (_hint(text) + _location(text)) if text else "this test did not run"
            out.append(TestResult(_test_name(nodeid), 0.0, 0.0, False, output.replace(*shown), hidden))
            continue
        if report.get("skipped") == "setup":  # skipped by its own marker (a missing optional package): not counted
            continue
        output = "" if report["passed"] else (_hint(report["text"]) + _location(report["text"])).replace(*shown)
        out.append(TestResult(_test_name(nodeid), 0.0, 0.0, bool(report["passed"]), output + _another_labs_part(lab, output), hidden))
    return out


def _score(lab: Lab, result: LabResult, bug_tests: set[str] | None) -> None:
    """Share the lab's points among its tests; a find-the-bug lab's among the tests its seeded bug fails,
    the others gating them."""
    tests = result.tests
    if not tests:
        return
    carrying = [t for t in tests if bug_tests and t.name in bug_tests] or tests
    broken = [t for t in tests if t not in carrying and not t.passed]
    share = round(POINTS / len(carrying), 4)
    for t in tests:
        t.max_score = share if t in carrying else 0.0
    carrying[-1].max_score = round(POINTS - share * (len(carrying) - 1), 4)  # the shares add up to the lab's points
    for t in tests:
        t.score = t.max_score if t.passed and not broken else 0.0
        if t in carrying and t.passed and broken:
            t.output = f"passes, but the fix broke {broken[0].name}: no points until every test passes"
        elif t not in carrying:
            t.output = t.output or "must still pass (the seeded bug does not fail it)"
    result.score = round(min(POINTS, sum(t.score for t in tests)), 2)


class Grading:
    """Grade a list of labs on one implementation: every visible run first, then the hidden runs."""

    def __init__(self, impl: str, hidden_dir: Path | None, jobs: int, together: bool = False,
                 test_timeout_s: int = TEST_TIMEOUT_S, import_timeout_s: int = IMPORT_TIMEOUT_S, lab_timeout_s: int = LAB_TIMEOUT_S):
        self.impl, self.jobs, self.together = impl, jobs, together
        self.grader = Grader(hidden_dir, test_timeout_s, import_timeout_s, lab_timeout_s)

    def lab(self, lab: Lab) -> LabResult:
        """A lab's visible runs (and the untouched bug starter's, for a find-the-bug lab)."""
        g = self.grader
        result = LabResult(lab.name, lab.title[0], 0.0, POINTS, 0.0, together=self.together)
        files = submission_files(lab, self.impl)
        if files is None:
            result.error = f"no {lab.name}.py in {self.impl}: this lab was not handed in"
            return result
        submission, graded, shown = files
        module = g.modules.get(lab.part_lab)
        starter = (STARTERS / f"{lab.name}.py")
        starter_text = starter.read_text(encoding="utf-8") if starter.is_file() else ""
        result.flags = new_flags(submission[graded], starter_text, module, set(g.modules.values()))
        visible, hidden = test_files(lab, g.hidden_dir)
        expected = g.expected()
        start = time.monotonic()
        outcome = g.run(lab, submission, graded, visible, hidden=False, together=self.together, measure=True)
        result.seconds = time.monotonic() - start
        self._outcomes = getattr(self, "_outcomes", {})
        self._outcomes[lab.name] = (submission, graded, shown, hidden)
        if not outcome.done or outcome.forged or outcome.tampered:
            result.error = _stopped_reason(outcome, result.flags, g.import_timeout_s, g.lab_timeout_s)
            return result
        want = [n for f in visible for n in expected.get(f, [])] or (outcome.collected or [])
        pair = (str(g.root), "")
        result.tests = [t for t in _results(lab, outcome, want, False, (pair[0], pair[1]))]
        for t in result.tests:
            t.output = _shown(t.output, shown)
        if outcome.measured is not None:  # a lab measured on the simulator: rank it beside FCFS and the model answer
            result.ranking = self._ranking(lab, outcome.measured)
        if lab.base is not None:
            result.bug_tests = sorted(self._bug_tests(lab, submission, graded, visible))
        return result

    def hidden(self, lab: Lab, result: LabResult) -> LabResult:
        g = self.grader
        state = getattr(self, "_outcomes", {}).get(lab.name)
        if state is None or result.error or not state[3]:
            return self._finish(lab, result)
        submission, graded, shown, hidden = state
        start = time.monotonic()
        outcome = g.run(lab, submission, graded, hidden, hidden=True, together=self.together)
        result.seconds += time.monotonic() - start
        if not outcome.done or outcome.forged or outcome.tampered:
            result.tests = []
            result.error = _stopped_reason(outcome, result.flags, g.import_timeout_s, g.lab_timeout_s) + " (the hidden tests' run)"
            return self._finish(lab, result)
        want = [n for f in hidden for n in g.expected().get(f, [])] or (outcome.collected or [])
        tests = _results(lab, outcome, want, True, (str(g.root), ""))
        for t in tests:
            t.output = _shown(t.output, shown)
        result.tests += tests
        return self._finish(lab, result)

    def _finish(self, lab: Lab, result: LabResult) -> LabResult:
        _score(lab, result, set(result.bug_tests))
        result.seconds = round(result.seconds, 1)
        return result

    def _bug_tests(self, lab: Lab, submission: dict[str, str], graded: str, visible: list[str]) -> set[str]:
        """The tests a find-the-bug lab's untouched starter fails: where its points are."""
        starter = STARTERS / f"{lab.name}.py"
        if not starter.is_file():
            return set()
        outcome = self.grader.run(lab, {f"{lab.name}.py": starter.read_text(encoding="utf-8")}, f"{lab.name}.py", visible, hidden=False)
        return {_test_name(n) for n, r in outcome.reports.items() if not r["passed"]}

    def _ranking(self, lab: Lab, yours: dict) -> list[dict]:
        rows = [{"policy": "model answer" if self.impl == "solution" else "yours", **yours["yours"]}, {"policy": "FCFS", **yours["fcfs"]}]
        if self.impl != "solution" and lab.part_lab not in self.grader.cut_here:
            files = {f"{lab.name}.py": cut(lab, keep_solution=True, seed_bug=False)}
            answer = self.grader.run(lab, files, f"{lab.name}.py", test_files(lab, None)[0], hidden=False, measure=True).measured
            if answer:
                rows.insert(1, {"policy": "model answer", **answer["yours"]})
        return sorted(rows, key=lambda row: row["ttft_p90_s"])

    def grade(self, labs: list[Lab], on_result=None) -> list[LabResult]:
        try:
            with ThreadPoolExecutor(max_workers=self.jobs) as pool:
                first = list(pool.map(self.lab, labs))
                results = []
                for result in pool.map(lambda pair: self.hidden(*pair), zip(labs, first)):  # after every visible run
                    results.append(result)
                    if on_result is not None:
                        on_result(result)
            return results
        finally:
            self.grader.close()


def run_lab(lab: Lab, impl: str, hidden_dir: Path | None = None, together: bool = False) -> LabResult:
    """Grade one lab (see :class:`Grading`)."""
    return Grading(impl, hidden_dir, 1, together).grade([lab])[0]


def gradescope(results: list[LabResult]) -> dict:
    """Gradescope's ``results.json`` (autograder specification: score, tests with name, score,
    max_score, output, visibility). The integrity flags are tests worth 0 with ``hidden`` visibility:
    the teacher sees them, the student does not."""
    tests = []
    for lab in results:
        label = f"{lab.name} (your parts together)" if lab.together else lab.name
        if not lab.tests:
            tests.append({"name": label, "score": 0.0, "max_score": lab.max_score, "output": lab.error or "no test ran",
                          "visibility": "visible"})
        for t in lab.tests:
            tests.append({"name": f"{label}: {t.name}", "score": t.score, "max_score": t.max_score, "output": t.output,
                          "visibility": "after_published" if t.hidden else "visible"})
        if lab.flags:
            tests.append({"name": f"{label}: flagged for the teacher", "score": 0.0, "max_score": 0.0,
                          "output": "\n".join(lab.flags), "visibility": "hidden"})
    score = round(sum(r.score for r in results), 2)
    flagged = [r.name for r in results if r.flags]
    return {"score": score, "output": f"{score} / {sum(r.max_score for r in results):g} over {len(results)} labs",
            "visibility": "visible", "stdout_visibility": "hidden", "tests": tests,
            "extra_data": {"flagged_labs": flagged}}


def format_text(results: list[LabResult], impl: str) -> str:
    lines = [f"implementation: {impl}"]
    for r in results:
        passed = sum(t.passed for t in r.tests)
        mark = "full" if r.full else ""
        name = f"{r.name} (together)" if r.together else r.name
        lines.append(f"{name:<16} {r.score:>5g} / {r.max_score:g}  ({passed} of {len(r.tests)} tests, {r.seconds:.0f} s) {mark}".rstrip())
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
        lines += [f"    FLAGGED for the teacher: {flag}" for flag in r.flags]
    total, most = sum(r.score for r in results), sum(r.max_score for r in results)
    lines.append(f"total {total:g} / {most:g}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m lessons grade", description=__doc__.split("\n\n")[0])
    parser.add_argument("labs", nargs="*", metavar="LAB", help=f"labs to grade (default: all, or those a handout holds): {', '.join(BY_NAME)}")
    parser.add_argument("--impl", default=os.environ.get(LAB_IMPL_ENV) or "solution",
                        help="solution, starter, a directory of your lab files, or one file (default: $LAB_IMPL or solution)")
    parser.add_argument("--together", action="store_true",
                        help="run all of a folder's parts at once (your parts together), instead of each lab alone")
    parser.add_argument("--through-lesson", type=int, metavar="N", help="only the labs of lessons 1..N (a week's grade, out of its points)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--gradescope", type=Path, metavar="RESULTS_JSON", help="also write Gradescope's results.json there")
    parser.add_argument("--tests", type=Path, metavar="DIR", help="a directory of hidden tests to add (test_lab_<lab>*.py)")
    parser.add_argument("--timeout", type=int, default=TEST_TIMEOUT_S, metavar="S",
                        help=f"seconds one test may run before it fails (default {TEST_TIMEOUT_S}: an endless loop costs one test)")
    parser.add_argument("--import-timeout", type=int, default=IMPORT_TIMEOUT_S, metavar="S",
                        help=f"seconds a lab's process may take to import the file and collect its tests (default {IMPORT_TIMEOUT_S})")
    parser.add_argument("--jobs", "-j", type=int, default=DEFAULT_JOBS, metavar="N",
                        help=f"labs graded at once, each in its own process (default {DEFAULT_JOBS}: this machine's cores, at most 4)")
    args = parser.parse_args(argv)
    if args.tests is not None and not args.tests.is_dir():
        parser.error(f"--tests {args.tests}: not a directory")
    if args.jobs < 1:
        parser.error(f"--jobs {args.jobs}: at least 1")
    labs = labs_for(args.impl, args.labs, args.through_lesson)

    def show(result: LabResult) -> None:
        if not args.json:  # one lab at a time, as it is graded
            print("\n".join(format_text([result], args.impl).splitlines()[1:-1]), flush=True)

    if args.together and not args.json:
        print("your parts together: every lab's tests run with all of your files plugged in at once", flush=True)
    grading = Grading(args.impl, args.tests, args.jobs, args.together, args.timeout, args.import_timeout)
    results = grading.grade(labs, show)
    if args.gradescope:  # written by this process alone, last, in one step
        args.gradescope.parent.mkdir(parents=True, exist_ok=True)
        part = args.gradescope.with_name(f".{args.gradescope.name}.{os.getpid()}")
        part.write_text(json.dumps(gradescope(results), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        os.replace(part, args.gradescope)
    total, most = sum(r.score for r in results), sum(r.max_score for r in results)
    if args.json:
        print(json.dumps({"impl": args.impl, "together": args.together, "score": round(total, 2), "max_score": most,
                          "labs": [{**asdict(r), "full": r.full} for r in results]}, indent=2, ensure_ascii=False))
    else:
        print(f"total {total:g} / {most:g}")
    return 0 if all(r.full for r in results) else 1
