"""A prefill instance's bootstrap table, for the push order (SGLang's ``srt/disaggregation/``: the
prefill side's bootstrap queue and ``KVPoll``).

In the push order the router sends a request to both instances with one ``bootstrap_room`` (a random
number, SGLang's mini load balancer's). The decode instance reserves the prompt's blocks first, names
a reservation (an unguessable ``transfer_id``, a shared-memory segment it created for those blocks,
and its prompt's hash) and *bootstraps* the room on the prefill instance. The prefill request waits,
outside the queue, until its room is bootstrapped (it holds no block while waiting), then prefills and
writes its KV into the decode instance's segment.

Each room goes through SGLang's ``KVPoll`` states: ``Bootstrapping`` (no reservation yet),
``WaitingForInput`` (a reservation, the prefill not yet computed), ``Transferring`` (writing),
``Success`` or ``Failed``. A bootstrap is untrusted: it binds only a room whose prefill request has the
same prompt (checked when both are there), once; a forged one is refused and logged, and never takes
another request's KV. Model-free and thread-safe.
"""

from __future__ import annotations

import enum
import logging
import re
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable

from engine.kv_transfer.lease import TransferRefused

logger = logging.getLogger("engine.kv_transfer")

PUSH_SEGMENT = re.compile(r"pal-kv-push-[0-9a-f]{24}")  # the only segments a prefill instance writes into


class KVPoll(str, enum.Enum):
    """A push transfer's state, SGLang's ``KVPoll`` names (``srt/disaggregation/base/conn.py``)."""

    Bootstrapping = "Bootstrapping"
    WaitingForInput = "WaitingForInput"
    Transferring = "Transferring"
    Success = "Success"
    Failed = "Failed"


@dataclass(frozen=True)
class Reservation:
    """A decode instance's reserved blocks for one prompt, as it names them to the prefill instance.

    Attributes:
        transfer_id: the decode instance's unguessable name for the reservation (``secrets.token_urlsafe``).
        bootstrap_room: the router's room id, the same on both instances.
        prompt_hash: ``lease.prompt_hash`` of the decode request's prompt.
        block_ids: the decode instance's reserved blocks, logical order (shown; the decode instance
            copies into its own reservation, never into blocks a message names).
        shm_name: the segment the decode instance created for them (``pal-kv-push-<24 hex>``).
        shape: ``[num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim]`` the segment holds.
        dtype: the pool's element type, torch's name without "torch." (``float32``, ``float8_e4m3fn``).
    """

    transfer_id: str
    bootstrap_room: int
    prompt_hash: str
    block_ids: tuple[int, ...]
    shm_name: str
    shape: tuple[int, ...]
    dtype: str


@dataclass
class PushTransfer:
    """One room on the prefill instance.

    Attributes:
        bootstrap_room: the router's room id.
        request_id: the prefill instance's request (None: its reservation came first).
        prompt_hash: that request's prompt's hash.
        reservation: the decode instance's, once bootstrapped.
        state: a :class:`KVPoll`.
        why: why it failed ("" otherwise).
        deadline: when a room not bootstrapped, or not written, gives up (the table's clock, s).
        done: resolved with the final state when it reaches Success or Failed (the decode instance's poll waits on it).
    """

    bootstrap_room: int
    request_id: int | None = None
    prompt_hash: str | None = None
    reservation: Reservation | None = None
    state: KVPoll = KVPoll.Bootstrapping
    why: str = ""
    deadline: float = 0.0
    done: Future = field(default_factory=Future)


class BootstrapTable:
    """The rooms of one prefill instance.

    Args:
        timeout_s: how long a room waits for its reservation, or a reservation for its KV
            (``kv_lease_duration``).
        clock: seconds, monotonic (a test passes its own).
    """

    def __init__(self, timeout_s: float, clock: Callable[[], float] = time.monotonic):
        self.timeout_s = timeout_s
        self.clock = clock
        self._rooms: dict[int, PushTransfer] = {}
        self._by_request: dict[int, int] = {}  # prefill request id -> its live room
        self._ended: dict[int, KVPoll] = {}  # prefill request id -> its room's final state, until forgotten
        self._lock = threading.Lock()
        self.changed = threading.Event()  # set at each bootstrap: an idle engine waits on it
        self.num_refused = 0
        self.num_ended = {KVPoll.Success.value: 0, KVPoll.Failed.value: 0}

    def add_request(self, request_id: int, bootstrap_room: int, prompt_hash_: str) -> KVPoll:
        """A prefill request for ``bootstrap_room`` arrived. Returns its room's state (WaitingForInput
        when its reservation came first and is for the same prompt; a reservation for another prompt
        is refused here, logged, and the room waits for the rightful one).

        Raises:
            ValueError: the room already has a prefill request.
        """
        with self._lock:
            room = self._rooms.get(bootstrap_room)
            if room is not None and room.request_id is not None:
                raise ValueError(f"kv_transfer_params.bootstrap_room {bootstrap_room} already has a prefill request")
            if room is None:
                room = self._rooms[bootstrap_room] = PushTransfer(bootstrap_room)
            room.request_id, room.prompt_hash, room.deadline = request_id, prompt_hash_, self.clock() + self.timeout_s
            self._by_request[request_id] = bootstrap_room
            forged = room.reservation is not None and room.reservation.prompt_hash != prompt_hash_
            if forged:
                room.reservation, room.state = None, KVPoll.Bootstrapping
                self.num_refused += 1
            state = room.state
        if forged:
            logger.warning("refused a KV reservation for room %d: the decode request's prompt is not this prefill request's", bootstrap_room)
        return state

    def bootstrap(self, reservation: Reservation, peer: str = "unknown") -> KVPoll:
        """A decode instance's reservation for its room. Returns the room's new state (WaitingForInput).

        Raises:
            TransferRefused: a segment name not of :data:`PUSH_SEGMENT`, a room already bootstrapped or
                ended, or a prompt other than the prefill request's; logged (warning, with ``peer``).
        """
        with self._lock:
            number = reservation.bootstrap_room
            room = self._rooms.get(number) if isinstance(number, int) and not isinstance(number, bool) else None
            if not isinstance(number, int) or isinstance(number, bool):
                why = "bootstrap_room must be an integer"
            elif not isinstance(reservation.shm_name, str) or not PUSH_SEGMENT.fullmatch(reservation.shm_name):
                why = "the segment is not one a decode instance reserved for a push"
            elif room is not None and room.reservation is not None:
                why = "the room already has a reservation"
            elif room is not None and room.state in (KVPoll.Success, KVPoll.Failed):
                why = "the room has ended"
            elif room is not None and room.prompt_hash is not None and room.prompt_hash != reservation.prompt_hash:
                why = "the decode request's prompt is not this room's prefill request's"
            else:
                why = None
                if room is None:
                    room = self._rooms[number] = PushTransfer(number)
                room.reservation, room.state = reservation, KVPoll.WaitingForInput
                room.deadline = self.clock() + self.timeout_s
                self.changed.set()
            if why is not None:
                self.num_refused += 1
        if why is None:
            logger.info("KV push room %d WaitingForInput: %d decode blocks reserved", number, len(reservation.block_ids))
            return KVPoll.WaitingForInput
        logger.warning("refused a KV reservation from %s for room %s: %s", peer, number, why)
        raise TransferRefused(why)

    def has_request(self, bootstrap_room: int) -> bool:
        with self._lock:
            room = self._rooms.get(bootstrap_room)
            return room is not None and room.request_id is not None

    def reservation(self, request_id: int) -> Reservation | None:
        """The reservation a prefill request writes into (None: its room is not bootstrapped, or ended)."""
        with self._lock:
            room = self._rooms.get(self._by_request.get(request_id, -1))
            return room.reservation if room is not None and room.state in (KVPoll.WaitingForInput, KVPoll.Transferring) else None

    def state(self, request_id: int) -> KVPoll | None:
        """The state of a prefill request's room, live or ended (None: no room, or forgotten)."""
        with self._lock:
            room = self._rooms.get(self._by_request.get(request_id, -1))
            return room.state if room is not None else self._ended.get(request_id)

    def forget(self, request_id: int) -> KVPoll | None:
        """The prefill request is gone: its room fails if still live; returns its final state."""
        self.end(request_id, KVPoll.Failed, "the prefill request ended before its KV was written")
        with self._lock:
            return self._ended.pop(request_id, None)

    def waiting_for_input(self, request_id: int) -> bool:
        """Whether the prefill request may run: its room is bootstrapped, or gave up waiting (it then
        runs alone and its KV is freed)."""
        with self._lock:
            room = self._rooms.get(self._by_request.get(request_id, -1))
            return room is None or room.state is not KVPoll.Bootstrapping

    def set_transferring(self, request_id: int) -> bool:
        """The prefill request's KV is being written. Returns False when its room ended meanwhile."""
        with self._lock:
            room = self._rooms.get(self._by_request.get(request_id, -1))
            if room is None or room.state is not KVPoll.WaitingForInput:
                return False
            room.state = KVPoll.Transferring
        logger.info("KV push room %d Transferring", room.bootstrap_room)
        return True

    def end(self, request_id: int, state: KVPoll, why: str = "", detail: dict | None = None) -> None:
        """The prefill request's room ends in ``state`` (Success or Failed): the decode instance's poll
        gets ``{"state", "why", **detail}``; the table forgets the request."""
        with self._lock:
            room = self._rooms.get(self._by_request.pop(request_id, -1))
            if room is None:
                return
            self._end(room, state, why, detail)

    def _end(self, room: PushTransfer, state: KVPoll, why: str, detail: dict | None = None) -> None:
        if room.state in (KVPoll.Success, KVPoll.Failed):
            return
        room.state, room.why = state, why
        if state is KVPoll.Success:
            logger.info("KV push room %d Success", room.bootstrap_room)
        self.num_ended[state.value] += 1
        del self._rooms[room.bootstrap_room]
        if room.request_id is not None:
            self._ended[room.request_id] = state
        if not room.done.done():
            room.done.set_result({"state": state.value, "why": why, **(detail or {})})

    def wait(self, bootstrap_room, transfer_id) -> Future:
        """The future a decode instance's poll waits on: its reservation's final state.

        Raises:
            TransferRefused: no live reservation ``transfer_id`` in that room (logged).
        """
        with self._lock:
            room = self._rooms.get(bootstrap_room) if isinstance(bootstrap_room, int) else None
            if room is not None and room.reservation is not None and room.reservation.transfer_id == transfer_id:
                return room.done
            self.num_refused += 1
        logger.warning("refused a KV poll for room %s: no such reservation", bootstrap_room)
        raise TransferRefused("no such reservation")

    def give_up(self, bootstrap_room: int, transfer_id: str, why: str) -> None:
        """The decode instance stopped waiting (its poll timed out): the room fails, nothing is written."""
        with self._lock:
            room = self._rooms.get(bootstrap_room)
            if room is not None and room.reservation is not None and room.reservation.transfer_id == transfer_id:
                if room.request_id is not None:
                    self._by_request.pop(room.request_id, None)
                self._end(room, KVPoll.Failed, why)

    def expire(self) -> list[int]:
        """Rooms past their deadline fail: a prefill request never bootstrapped gives up waiting (it
        runs alone), a reservation never written is told so. Returns the prefill request ids of the
        rooms that failed while still Bootstrapping."""
        now = self.clock()
        alone = []
        with self._lock:
            for room in [r for r in self._rooms.values() if now >= r.deadline and r.state is not KVPoll.Transferring]:
                if room.state is KVPoll.Bootstrapping and room.request_id is not None:
                    alone.append(room.request_id)
                if room.request_id is not None:
                    self._by_request.pop(room.request_id, None)
                why = (f"no decode instance reserved blocks for it within {self.timeout_s:g} s" if room.state is KVPoll.Bootstrapping
                       else f"the prefill instance did not write the KV within {self.timeout_s:g} s")
                self._end(room, KVPoll.Failed, why)
                logger.warning("KV push room %d failed: %s", room.bootstrap_room, why)
        return alone

    def counts(self) -> dict[str, int]:
        """Live rooms by state (metrics)."""
        with self._lock:
            states = [r.state.value for r in self._rooms.values()]
        return {s.value: states.count(s.value) for s in KVPoll if s not in (KVPoll.Success, KVPoll.Failed)}
