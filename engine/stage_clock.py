"""The stages of a start, each said with the seconds since the process started: the progress callback the CLI
hands to the model loader and the CPU kernels' build (``progress(stage_text, fraction)``, fraction in 0..1).
Standard library only, so every layer may use it."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable


def process_seconds() -> float:
    """Seconds since this process started (Linux: from /proc, so the interpreter's own start and the imports
    count too); elsewhere, seconds since this module was imported."""
    try:
        ticks = os.sysconf("SC_CLK_TCK")
        with open("/proc/self/stat") as f:
            started = int(f.read().rsplit(")", 1)[1].split()[19]) / ticks  # field 22: starttime, in ticks after boot
        with open("/proc/uptime") as f:
            return max(float(f.read().split()[0]) - started, 0.0)
    except (OSError, ValueError, IndexError, AttributeError):
        return time.monotonic() - _IMPORTED


_IMPORTED = time.monotonic()


class StageClock:
    """A progress callback that writes one line when a stage begins and one when it is done, each with the
    seconds since the process started, and keeps every stage's times (:attr:`stages`).

    Lines look like ``engine: [  3.4 s] Converting x.gguf to float32 safetensors`` and
    ``engine: [  7.9 s] done in 4.5 s: Converting x.gguf to float32 safetensors``. Stages may overlap (the CPU
    kernels compile in another thread while the model is converted); the callback is thread-safe.

    Args:
        write: where a line goes; default: stderr.
    """

    def __init__(self, write: Callable[[str], None] | None = None):
        self.write = write or (lambda line: print(line, file=sys.stderr, flush=True))
        self.stages: dict[str, list[float | None]] = {}  # stage text -> [began, ended or None], seconds since start
        self._lock = threading.Lock()

    def __call__(self, stage: str, fraction: float) -> None:
        now = process_seconds()
        with self._lock:
            times = self.stages.get(stage)
            if times is None or (times[1] is not None and fraction <= 0.0):  # a new stage, or one begun again
                times = self.stages[stage] = [now, None]
                self.write(f"engine: [{now:6.1f} s] {stage}")
            if fraction >= 1.0 and times[1] is None:
                times[1] = now
                self.write(f"engine: [{now:6.1f} s] done in {now - times[0]:.1f} s: {stage}")

    def mark(self, event: str) -> float:
        """Write one line for an event (e.g. the first token) with the seconds so far; returns them."""
        now = process_seconds()
        with self._lock:
            self.stages[event] = [now, now]
            self.write(f"engine: [{now:6.1f} s] {event}")
        return now
