"""The grader's pytest plugin, loaded in a lab's test process (``-p``) before any student code runs.

The test process sends its results to the grader over a pipe, one JSON line a record, each signed
with a key the grader wrote into another pipe for this run alone (HMAC-SHA256): a student's code in
the same process can write to the pipe, but not sign. The grader (:mod:`lessons.grade`) trusts only
signed records, in order (a sequence number), ending with a ``done`` record; a process that stops
short of it scores no marks. The plugin also notes when pytest's own reporting functions or hooks are
replaced after it started (a submission patching pytest to report passes), and says so in a signed
``tamper`` record: that run scores no marks.

What it cannot stop, since the student's code runs in this process: a submission that finds this
module's key in memory. The grader's static check flags every way there (``gc``, ``inspect``,
frames, ``sys.modules``, ``_pytest``; :mod:`lessons.integrity`).

Standard library and pytest only: it is copied beside the tests into each run's tree.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import sys

import _pytest.python
import _pytest.reports
import _pytest.runner

FDS_ENV = "LAB_GRADE_FDS"  # "<key pipe's read end>,<results pipe's write end>"



def _signer():
    """Read this run's key from its pipe (once: the pipe is closed after) and return the function that
    signs and sends a record; the key lives in that function's closure alone, not in a module name."""
    key_fd, out_fd = (int(x) for x in os.environ.pop(FDS_ENV).split(","))
    with os.fdopen(key_fd, "rb") as pipe:
        key = pipe.read()
    seq = [0]

    def send(record: dict) -> None:
        record = {**record, "seq": seq[0]}
        seq[0] += 1
        body = json.dumps(record, sort_keys=True, ensure_ascii=True)
        mac = hmac.new(key, body.encode(), hashlib.sha256).hexdigest()
        os.write(out_fd, (json.dumps({"body": body, "mac": mac}) + "\n").encode())

    return send


_send = _signer()
# pytest's own reporting, as it was before any test module (and so any student code) was imported;
# the names a pytest release lacks are left out.
_WATCHED_NAMES = ("TestReport.from_item_and_call", "TestReport.__init__", "CallInfo.from_call", "runner.call_and_report",
                  "runner.runtestprotocol", "runner.pytest_runtest_makereport", "runner.call_runtest_hook",
                  "python.pytest_pyfunc_call", "Function.runtest")
_HOOKS = ("pytest_runtest_protocol", "pytest_runtest_makereport", "pytest_runtest_logreport", "pytest_pyfunc_call",
          "pytest_runtest_call", "pytest_report_teststatus", "pytest_collection_modifyitems", "pytest_runtestloop")
_hooks_at_start: dict[str, list] = {}
_outcomes: dict[str, dict] = {}
_tampered: list[str] = []
_CONFIG: list = []


def _hookimpls(config) -> dict[str, list]:
    """The hook implementations now, less the tests' own conftest files (loaded as their folder is collected)."""
    def ours(function) -> bool:
        return os.path.basename(getattr(getattr(function, "__code__", None), "co_filename", "")) == "conftest.py"

    return {name: [impl.function for impl in getattr(config.hook, name).get_hookimpls() if not ours(impl.function)]
            for name in _HOOKS}


def _check(config, where: str) -> None:
    changed = [name for name, value in _WATCHED.items() if _current(name) is not value]
    if _hooks_at_start and _hookimpls(config) != _hooks_at_start:
        changed.append("pytest's hook implementations")
    new = [name for name in changed if name not in _tampered]
    if new:
        _tampered.extend(new)
        _send({"kind": "tamper", "what": new, "where": where})


def _current(name: str):
    owner, _, attr = name.partition(".")
    if owner == "TestReport":
        return _pytest.reports.TestReport.__dict__.get(attr) if attr != "__init__" else _pytest.reports.TestReport.__init__
    if owner == "CallInfo":
        return _pytest.runner.CallInfo.__dict__.get(attr)
    if owner == "Function":
        return _pytest.python.Function.__dict__.get(attr)
    return getattr({"runner": _pytest.runner, "python": _pytest.python}[owner], attr, None)


_WATCHED = {name: value for name in _WATCHED_NAMES if (value := _current(name)) is not None}


def pytest_configure(config) -> None:
    _CONFIG.append(config)
    sys.modules.pop(__name__, None)  # registered with pytest now: `import lab_grade_plugin` finds no key
    _send({"kind": "start"})


def pytest_collection(session) -> None:  # after every plugin's session start, before any test module is imported
    _hooks_at_start.update(_hookimpls(session.config))


def pytest_collectreport(report) -> None:
    if report.failed:  # a test module that could not be imported (the student's file raised at import)
        _send({"kind": "collect_error", "nodeid": report.nodeid, "text": str(report.longrepr)[-4000:]})


def pytest_collection_finish(session) -> None:
    _check(session.config, "collection")
    _send({"kind": "collected", "nodeids": [item.nodeid for item in session.items]})


def pytest_runtest_logreport(report) -> None:
    seen = _outcomes.setdefault(report.nodeid, {"passed": True, "skipped": None, "text": ""})
    if report.failed:
        seen["passed"] = False
        seen["text"] = (seen["text"] + "\n" + str(report.longrepr))[-4000:]
    elif report.skipped:
        # A skip in the test's body came from the code under test (pytest.skip raised by a part): no pass.
        seen["skipped"] = report.when
        seen["text"] = str(report.longrepr)[-1000:]
        if report.when == "call":
            seen["passed"] = False
    if report.when == "teardown":
        _check(_CONFIG[0], "tests")
        _send({"kind": "report", "nodeid": report.nodeid, "passed": seen["passed"], "skipped": seen["skipped"],
               "text": seen["text"]})


def pytest_sessionfinish(session, exitstatus) -> None:
    _check(session.config, "end")
    _send({"kind": "done", "exitstatus": int(exitstatus)})
