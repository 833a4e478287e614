"""A student's engine beside the reference, step for step, on the Live page's workload and real model.

The Live page's engine runs the engine's own parts in the app's process. :class:`BesideEngine` runs a
second engine, with the same settings and requests, in a process of its own with ``LAB_IMPL`` set
(the labs' seam swaps parts in when the engine's modules are imported, ``engine/core/lab_impl.py``):
each Step of the page steps both. Every step of either engine becomes the record that ``python -m
lessons compare`` compares (:func:`report_record`: scheduled batch, preemptions, block events, slots
written, block tables, free queue, sampled tokens), so :func:`lessons.compare.first_divergence` names
the first step, field and event where the two differ.

A student's exception inside a step ends their engine alone: it is reported with its lab, file and
line (:func:`lessons.compare._cause`). A step that runs longer than its limit (an endless loop) is
stopped by the worker's own watchdog (``faulthandler``), which writes where each thread was: the
innermost frame in the student's file gives the lab, file and line.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import re
import selectors
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

from engine.core.lab_impl import LAB_IMPL_ENV, LAB_LINE, LAB_ONLY_ENV
from lessons.compare import ROOT, _cause

STEP_TIMEOUT_S = 60  # a step of the app's small workloads takes well under a second; a student's loop stops here
START_TIMEOUT_S = 300  # importing torch and loading the model, on a busy 2-core laptop
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')


def report_record(report) -> dict:
    """A real engine's :class:`~engine.report.StepReport` as the record ``lessons.compare`` compares:
    ``scheduled`` ([request id, tokens]), ``preempted`` (request ids), ``events`` (each event's fields
    that are set), ``slots`` (seq id -> the slots its tokens were written to, from the WRITE events),
    ``block_tables`` (seq id -> physical block ids), ``free_queue`` (head first) and ``tokens``
    ([request id, token ids added])."""
    from engine.report import WRITE

    events = [{k: v for k, v in dataclasses.asdict(e).items() if v is not None and v != ""} for e in report.events]
    slots: dict[str, list[int]] = {}
    for e in report.events:
        if e.kind == WRITE:
            slots.setdefault(str(e.seq_id if e.seq_id is not None else e.request_id), []).append(e.slot)
    return {
        "step": report.step,
        "scheduled": [[s.request_id, s.num_tokens] for s in report.scheduled],
        "preempted": list(report.preempted),
        "events": events,
        "slots": slots,
        "block_tables": {str(b.seq_id if b.seq_id is not None else b.request_id): list(b.block_table) for b in report.block_tables},
        "free_queue": list(report.free_queue),
        "tokens": [[rid, list(ids)] for rid, ids in sorted(report.new_token_ids.items())],
    }


def wrong_blocks(found: dict | None, block_size: int) -> list[int]:
    """The physical blocks where :func:`lessons.compare.first_divergence`'s first difference lies, on
    either side: the blocks its differing event names, the first differing entry of each differing block
    table or of the free queue, or the blocks of the first differing slot. Empty for other fields."""
    if not found or found["field"] not in ("events", "block_tables", "free_queue", "slots"):
        return []
    ref, mine, blocks = found.get("reference"), found.get("student"), set()
    if found["field"] == "events":
        for event in (found.get("reference_event"), found.get("student_event")):
            blocks |= {(event or {}).get(k) for k in ("block_id", "dst_block_id")} - {None}
    elif found["field"] == "free_queue":
        blocks |= _first_difference(ref, mine)
    else:
        for seq in sorted(set(ref) | set(mine)):
            differ = _first_difference(ref.get(seq, []), mine.get(seq, []))
            blocks |= {b // block_size for b in differ} if found["field"] == "slots" else differ
    return sorted(blocks)


def _first_difference(a: list[int], b: list[int]) -> set[int]:
    """The two lists' entries at the first index where they differ (one, when the other has ended)."""
    for x, y in zip(a, b):
        if x != y:
            return {x, y}
    return set(a[len(b) : len(b) + 1] + b[len(a) : len(a) + 1])


def _hang_cause(dump: str, step: int, timeout_s: float) -> dict:
    """The cause of a step stopped by the watchdog, from ``faulthandler``'s dump (innermost call first):
    the first frame outside the engine is the student's."""
    frames = [m for m in map(_FRAME.match, dump.splitlines()) if m]  # every thread's, each innermost first
    not_theirs = (str(ROOT / "engine"), str(ROOT / "paged_kernels"), str(ROOT / "lessons"), "<",
                  *{sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")})
    theirs = [m for m in frames if not m["file"].startswith(not_theirs)]
    where = theirs[0] if theirs else (frames[0] if frames else None)
    lab, code = None, ""
    if where is not None:
        try:
            text = Path(where["file"]).read_text(encoding="utf-8")
            found = LAB_LINE.search(text)
            lab = found["lab"] if found else None
            code = text.splitlines()[int(where["line"]) - 1].strip()
        except (OSError, IndexError):
            pass
    return {"step": step, "exception": f"TimeoutError: the step ran longer than {timeout_s:g} s (an endless loop?)",
            "lab": lab, "file": where["file"] if where else None, "line": int(where["line"]) if where else None,
            "code": code, "traceback": dump[-3000:]}


class BesideEngine:
    """A second engine on the student's parts (``impl``: a ``LAB_IMPL`` value), in a worker process.

    Args:
        config: the Live page's :class:`~engine.EngineConfig`; requests: its ``(prompt, params)``
            pairs, in order (request id = position); impl: ``starter``, a file or a directory;
        threads: torch threads, the app's own (the same reductions, the same floats).

    ``reports`` holds the student's step reports, ``records`` their :func:`report_record`, ``error``
    the cause that ended their engine (a dict as ``lessons.compare._cause`` writes it), else None.
    """

    def __init__(self, config, requests: list, impl: str, threads: int = 1, step_timeout_s: float = STEP_TIMEOUT_S):
        self.impl, self.step_timeout_s = impl, step_timeout_s
        self.reports: list = []
        self.records: list[dict] = []
        self.error: dict | None = None
        env = {k: v for k, v in os.environ.items() if k not in (LAB_IMPL_ENV, LAB_ONLY_ENV)}
        env[LAB_IMPL_ENV] = impl
        env["PYTHONPATH"] = str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")
        # stderr to a file, not a pipe: a worker that writes much (warnings, a student's prints) never blocks on it
        self._stderr = tempfile.TemporaryFile()
        self.process = subprocess.Popen([sys.executable, "-m", "lessons.beside"], cwd=ROOT, env=env, stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=self._stderr)
        self.process.stdin.write(pickle.dumps((config, requests, threads, step_timeout_s)))
        self.process.stdin.flush()
        self._pending = False
        self._answer(START_TIMEOUT_S, step=0)  # "ready", or the import error of a student's file

    @property
    def alive(self) -> bool:
        return self.error is None and self.process.poll() is None

    def send_step(self) -> None:
        """Start a step in the worker (the page steps its own engine meanwhile); :meth:`receive` takes its report."""
        if self.alive and not self._pending:
            self._pending = True
            try:
                self.process.stdin.write(b"step\n")
                self.process.stdin.flush()
            except OSError:  # the worker died meanwhile: receive() says why
                pass

    def receive(self) -> None:
        """The step's report (appended to ``reports`` and ``records``), or the cause that ended the engine."""
        if not self._pending:
            return
        self._pending = False
        answer = self._answer(self.step_timeout_s + 30, step=len(self.records))
        if answer and "report" in answer:
            from engine.report import StepReport
            from engine.runfile import from_json

            self.reports.append(from_json(StepReport, answer["report"]))
            self.records.append(answer["record"])

    def step(self) -> None:
        self.send_step()
        self.receive()

    def _answer(self, timeout_s: float, step: int) -> dict | None:
        line = _read_line(self.process, timeout_s)
        if line:
            answer = json.loads(line)
            if answer.get("error"):
                self.error = answer["error"]
                self.close()
            return answer
        self.close()  # no answer: the watchdog ended a hung step, or the process died
        self._stderr.seek(0)
        dump = self._stderr.read()[-200_000:].decode("utf-8", "replace")
        if "Timeout (" in dump:  # faulthandler's "Timeout (0:01:00)!" header
            self.error = _hang_cause(dump, step, self.step_timeout_s)
        else:
            lines = dump.strip().splitlines()
            self.error = {"step": step, "exception": lines[-1] if lines else f"exit status {self.process.returncode}",
                          "lab": None, "file": None, "line": None, "code": "", "traceback": dump[-3000:]}
        return None

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def __del__(self):
        if getattr(self, "process", None) is not None and self.process.poll() is None:
            self.process.kill()


def _read_line(process: subprocess.Popen, timeout_s: float) -> bytes:
    """One line of the worker's answers, or b"" when it ends or ``timeout_s`` passes (it is then killed)."""
    with selectors.DefaultSelector() as sel:
        sel.register(process.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if sel.select(timeout=max(0.0, deadline - time.monotonic())):
                return process.stdout.readline()
    process.kill()
    return b""


def worker() -> None:
    """The worker's side: read ``(config, requests, threads, step timeout)`` (a pickle from the app's own
    process) from stdin, build the engine on the ``LAB_IMPL`` parts, answer "ready"; then one JSON line
    per "step" line: ``{"report": ..., "record": ...}``, or ``{"error": ...}`` after which it exits."""
    import faulthandler

    out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # anything the engine prints goes to stderr, away from the answers
    def answer(data: dict) -> None:
        out.write(json.dumps(data) + "\n")
        out.flush()

    step = 0
    faulthandler.dump_traceback_later(START_TIMEOUT_S - 30, exit=True)  # a student's loop while the engine is built
    try:  # unpickling the config imports the engine's modules, which plug the student's parts in
        config, requests, threads, step_timeout_s = pickle.load(sys.stdin.buffer)
        import torch

        from engine.llm_engine import LLMEngine

        torch.set_num_threads(threads)
        llm = LLMEngine(config)
        for prompt, params in requests:
            llm.add_request(prompt, params)
        faulthandler.cancel_dump_traceback_later()
        answer({"ready": True})
        for line in sys.stdin.buffer:
            if line.strip() != b"step":
                continue
            faulthandler.dump_traceback_later(step_timeout_s, exit=True)
            report = llm.step()
            faulthandler.cancel_dump_traceback_later()
            answer({"report": dataclasses.asdict(report), "record": report_record(report)})
            step += 1
    except Exception as error:  # a student's part raised: their engine ends here, with its cause
        faulthandler.cancel_dump_traceback_later()
        answer({"error": _cause(error, step)})


if __name__ == "__main__":
    worker()
