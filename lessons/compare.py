"""Run a student's parts beside the engine's own, step for step, and find the first step where they differ.

``python -m lessons compare --impl PATH [LAB] [--json]``

Both runs drive the engine's scheduler and paged KV cache manager (no model) through the same fixed
workload, each in a process of its own with ``LAB_IMPL`` set (``engine/core/lab_impl.py``): six requests,
two sharing a prompt prefix (prefix caching), one with two parallel samples (fork and copy-on-write),
in a pool small enough that requests are preempted; once on the hash chain admitted first come, first
served, then again (the steps numbered on) on the radix tree admitted longest prefix first. Each step records what it scheduled, every block
table, the free queue, the step's block events, the slots it wrote and the sampled tokens. The first step where the two
records differ is reported with what differs (and the first event that differs). A student's exception
inside a step ends their run there; it is reported with its lab, file and line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import traceback
from dataclasses import asdict
from pathlib import Path

from engine.core.lab_impl import LAB_IMPL_ENV, LAB_ONLY_ENV

ROOT = Path(__file__).resolve().parents[1]
NUM_STEPS = 40
NUM_BLOCKS = 10  # small enough that requests are preempted
STEP_TIMEOUT_S = 30  # a step of this workload takes milliseconds: past this, a student's part loops
# The workload runs twice: on vLLM's hash chain admitted first come, first served, then on SGLang's
# radix tree admitted longest prefix first (engine/core/radix_cache.py, scheduling_policy.py).
CACHES = (("hash", "fcfs"), ("radix", "lpm"))
FIELDS = ("scheduled", "preempted", "events", "slots", "block_tables", "free_queue", "tokens")


def _workload():
    from engine.core.sequence import Sequence, SequenceGroup
    from engine.sampling_params import SamplingParams

    prefix = [11, 12, 13, 14, 15, 16, 17, 18]
    specs = [  # (arrival step, prompt, max new tokens, samples)
        (0, prefix + [1, 2, 3], 6, 1),
        (0, [21, 22, 23, 24, 25], 8, 2),
        (1, prefix + [4, 5], 5, 1),
        (2, [31, 32, 33, 34, 35, 36, 37], 9, 1),
        (3, [41, 42, 43], 7, 1),
        (5, prefix + [6, 7, 8, 9, 10], 4, 1),
    ]
    out = []
    for request_id, (arrival, prompt, max_new, n) in enumerate(specs):
        seq = Sequence(request_id, len(prompt), len(prompt) + max_new, SamplingParams(n=n, max_tokens=max_new), token_ids=list(prompt))
        out.append((arrival, SequenceGroup(request_id, [seq], SamplingParams(n=n, max_tokens=max_new))))
    return out


def record(step_timeout_s: float | None = STEP_TIMEOUT_S) -> dict:
    """Run the fixed workload on the parts ``LAB_IMPL`` chooses; returns the steps, and the error
    that ended the run (None when it ran to the end). A step past ``step_timeout_s`` (None: no limit)
    prints the record so far with the lab, file and line it was in, and ends the process."""
    from engine.core.block_manager import PagedBlockManager
    from engine.core.scheduler import Scheduler

    from engine.core.lab_impl import StepWatchdog

    steps: list[dict] = []

    def hang(step: int, seconds: float, cause: dict) -> None:  # an endless loop: report where, then end the process
        error = {"step": step, "exception": f"TimeoutError: the step ran longer than {seconds:g} s (an endless loop?)", **cause,
                 "traceback": ""}
        print(json.dumps({"steps": steps, "error": error}), flush=True)
        os._exit(0)

    watchdog = StepWatchdog(step_timeout_s, hang)
    try:
        for prefix_cache, policy in CACHES:
            kv = PagedBlockManager(NUM_BLOCKS, 4, watermark=0.0, enable_caching=True, prefix_cache=prefix_cache)
            sched = Scheduler(kv, max_num_seqs=4, max_num_batched_tokens=32, scheduling_policy=policy)
            _run_workload(kv, sched, steps, watchdog)
    except Exception as error:  # a student's part raised: this run ends here, with its cause
        return {"steps": steps, "error": _cause(error, len(steps))}
    return {"steps": steps, "error": None}


def _run_workload(kv, sched, steps: list[dict], watchdog) -> None:
    """The workload on one allocator and scheduler, its steps appended to ``steps`` (numbered on)."""
    from engine.core.sequence import fork_samples

    pending = _workload()
    next_seq_id = [100]
    numbered_from = len(steps)

    def new_seq_id() -> int:
        next_seq_id[0] += 1
        return next_seq_id[0]

    for step in range(NUM_STEPS):
        with watchdog.step(numbered_from + step):  # an endless loop in a part: its lab, file and line
            for arrival, group in [p for p in pending if p[0] == step]:
                sched.add(group)
            if not sched.has_unfinished() and all(a < step for a, _ in pending):
                break
            out = sched.schedule()
            batch = out.prefill_seqs + out.decode_seqs
            scheduled = [[s.seq_id, out.num_tokens_of(s)] for s in batch]
            slots = {str(s.seq_id): kv.slot_mapping(s, s.num_computed_tokens, s.num_computed_tokens + out.num_tokens_of(s)) for s in batch}
            ready = sched.update_from_output(out)
            tokens = []
            for seq in ready:
                token = (seq.seq_id * 7 + seq.num_tokens * 3) % 50
                seq.append_token(token)
                tokens.append([seq.seq_id, token])
            for group in list(sched.running):
                first = group.seqs[0]
                if group.num_samples > len(group.seqs) and not first.is_prefill:
                    fork_samples(group, sched.fork, new_seq_id)
                if all(s.num_output_tokens >= s.sampling_params.max_tokens for s in group.unfinished_seqs()):
                    sched.finish(group, "length")
            steps.append({
                "step": numbered_from + step,
                "scheduled": scheduled,
                "preempted": [g.request_id for g in out.preempted],
                "block_tables": {str(s.seq_id): list(s.block_table) for g in sched.running for s in g.unfinished_seqs()},
                "free_queue": kv.free_queue(),
                "events": [{k: v for k, v in asdict(e).items() if v is not None} for e in kv.events.drain()],
                "slots": slots,
                "tokens": tokens,
            })


def _cause(error: BaseException, step: int) -> dict:
    frames = traceback.extract_tb(error.__traceback__)
    engine_dirs = (str(ROOT / "engine"), str(ROOT / "paged_kernels"), str(Path(__file__).resolve()))
    theirs = [f for f in frames if not f.filename.startswith(engine_dirs) and "site-packages" not in f.filename]
    where = theirs[-1] if theirs else frames[-1]
    lab = None
    try:
        from engine.core.lab_impl import LAB_LINE

        found = LAB_LINE.search(Path(where.filename).read_text(encoding="utf-8"))
        lab = found["lab"] if found else None
    except OSError:
        pass
    return {"step": step, "exception": f"{type(error).__name__}: {error}", "lab": lab, "file": where.filename,
            "line": where.lineno, "code": (where.line or "").strip(), "traceback": "".join(traceback.format_exception(error))[-3000:]}


def run(impl: str, labs: list[str] | None = None, timeout_s: int = 300) -> dict:
    """:func:`record` in a process of its own with ``LAB_IMPL=impl`` (``LAB_ONLY`` = ``labs``)."""
    env = {k: v for k, v in os.environ.items() if k not in (LAB_IMPL_ENV, LAB_ONLY_ENV)}
    env[LAB_IMPL_ENV] = impl
    if labs:
        env[LAB_ONLY_ENV] = ",".join(labs)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")
    try:
        done = subprocess.run([sys.executable, "-m", "lessons.compare", "--record"], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:  # an endless loop: the run ends, the caller (the app) keeps working
        return {"steps": [], "error": {"step": 0, "exception": f"TimeoutError: the run took longer than {timeout_s} s (an endless loop?)",
                                       "lab": None, "file": None, "line": None, "code": "", "traceback": ""}}
    if done.returncode != 0 or not done.stdout.strip():  # it failed before a step ran: an import error
        lines = done.stderr.strip().splitlines()
        return {"steps": [], "error": {"step": 0, "exception": lines[-1] if lines else f"exit status {done.returncode}",
                                       "lab": None, "file": None, "line": None, "code": "", "traceback": done.stderr[-3000:]}}
    return json.loads(done.stdout)


def first_divergence(reference: dict, student: dict) -> dict | None:
    """The first step where the student's record differs from the reference: ``{"step", "field",
    "reference", "student", "event"}`` (``event``: the index of the first differing event), or the
    student's error, or the reference's own error (``field`` "reference_error": in a handout the engine's
    parts are the starters, so there is nothing to compare against); None when the runs agree throughout."""
    if reference["error"] is not None:
        return {"step": reference["error"]["step"], "field": "reference_error", "error": reference["error"]}
    for ref, mine in zip(reference["steps"], student["steps"]):
        for field in FIELDS:
            if ref[field] != mine[field]:
                out = {"step": ref["step"], "field": field, "reference": ref[field], "student": mine[field], "event": None}
                if field == "events":
                    index = next((i for i, (a, b) in enumerate(zip(ref[field], mine[field])) if a != b),
                                 min(len(ref[field]), len(mine[field])))
                    out.update(event=index, reference_event=ref[field][index] if index < len(ref[field]) else None,
                               student_event=mine[field][index] if index < len(mine[field]) else None)
                return out
    if student["error"] is not None:
        return {"step": student["error"]["step"], "field": "error", "error": student["error"]}
    if len(reference["steps"]) != len(student["steps"]):
        return {"step": min(len(reference["steps"]), len(student["steps"])), "field": "steps",
                "reference": len(reference["steps"]), "student": len(student["steps"])}
    return None


def describe(found: dict | None) -> str:
    if found is None:
        return "the same as the engine's own parts at every step"
    if found["field"] == "reference_error":
        e = found["error"]
        return (f"the engine's own parts stopped at step {found['step']}: {e['exception']}; there is nothing to compare "
                "against. In a handout the engine's parts are the starters: compare in the full repository, with the "
                "model answers")
    if found["field"] == "error":
        e = found["error"]
        where = f"{e['file']}:{e['line']}" if e["file"] else "before the first step"
        return f"step {found['step']}: {e['exception']} (lab {e['lab'] or '?'}, {where})" + (f"\n    {e['code']}" if e["code"] else "")
    if found["field"] == "events" and found.get("event") is not None:
        return (f"step {found['step']}: event {found['event']} differs\n    engine: {found.get('reference_event')}\n"
                f"    yours:  {found.get('student_event')}")
    return f"step {found['step']}: {found['field']} differ\n    engine: {found['reference']}\n    yours:  {found['student']}"


def main(argv: list[str]) -> int:
    import argparse

    if argv == ["--record"]:
        print(json.dumps(record()))
        return 0
    parser = argparse.ArgumentParser(prog="python -m lessons compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("labs", nargs="*", metavar="LAB", help="swap only these labs' parts (default: every lab the implementation has)")
    parser.add_argument("--impl", required=True, help="starter, a directory of your lab files, or one file")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    found = first_divergence(run("solution"), run(args.impl, args.labs))
    print(json.dumps(found) if args.json else describe(found))
    return 0 if found is None else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
