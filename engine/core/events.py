"""The engine's event log: one ordered record of what each step did to the KV cache and the requests.

The allocators (ALLOCATE, FREE, FORK, COPY_ON_WRITE, CACHE_HIT, EVICT, SWAP_OUT, SWAP_IN), the
scheduler (PREEMPT) and the engine (WRITE, FINISH) *emit* into one :class:`EventLog`; the engine
owns it and *drains* it once per step into ``StepReport.events`` (``engine/report.py``). This is
vLLM's KV-cache event queue (``BlockPool.kv_event_queue``, drained by ``take_events()``), which vLLM
fills only when ``enable_kv_cache_events`` is set: the model-free simulator passes a
:class:`NullEventLog` instead, which keeps nothing (on 100,000 requests the events would be
millions of objects nobody reads).
"""

from __future__ import annotations

from typing import Iterator

from engine.report import Event


class EventLog:
    """An ordered list of :class:`~engine.report.Event` that many write and one drains.

    ``enabled`` is False for a log that keeps nothing: a hot path may skip building an event's
    fields then.
    """

    enabled = True

    def __init__(self) -> None:
        self._events: list[Event] = []

    def emit(self, kind: str, request_id: int, **fields) -> None:
        """Append ``Event(kind, request_id, **fields)`` (fields as :class:`~engine.report.Event`'s)."""
        self._events.append(Event(kind, request_id, **fields))

    def drain(self) -> list[Event]:
        """The events emitted since the last drain, oldest first; the log is empty after."""
        events, self._events = self._events, []
        return events

    def __iter__(self) -> Iterator[Event]:
        """The events not drained yet, without draining them."""
        return iter(self._events)

    def __len__(self) -> int:
        return len(self._events)


class NullEventLog(EventLog):
    """An event log that keeps nothing (the simulator's)."""

    enabled = False

    def emit(self, kind: str, request_id: int, **fields) -> None:
        pass
