"""The KV connector interface, split by role (vLLM v1's ``distributed/kv_transfer/kv_connector/v1/base.py``).

A connector is two objects that talk one way, once per step:

- the *scheduler side* (:class:`KVConnectorScheduler`) only decides. At admission it says how many of a
  request's prompt tokens another engine computed (``get_num_new_matched_tokens``); once the blocks are
  allocated it records where they must land (``update_state_after_alloc``); each step it packs what the
  workers must move into a :class:`KVConnectorMetadata` (``build_connector_meta``); when a request finishes
  it says whether its blocks must outlive it (``request_finished``: a prefill instance lends them to the
  decode instance under a lease).
- the *worker side* (:class:`KVConnectorWorker`) only moves bytes: it reads the metadata
  (``start_load_kv``), may wait per layer (``wait_for_layer_load``), may save per layer
  (``save_kv_layer``, ``wait_for_save``), and reports the loads that ended (``get_finished``).

A new transport is a new pair of classes behind the same methods. Both sides are torch-free here;
a transport's worker side imports what it needs.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.core.sequence import SequenceGroup
    from engine.core.scheduler_output import SchedulerOutput


class KVConnectorRole(enum.Enum):
    SCHEDULER = "scheduler"
    WORKER = "worker"


@dataclass(frozen=True)
class KVLoadSpec:
    """One request's load, as the scheduler hands it to the workers.

    Attributes:
        request_id: the consumer's id of the request.
        transfer_id: the producer's unguessable name for the lent blocks (``secrets.token_urlsafe``).
        remote_host, remote_port: the producer's side channel.
        remote_block_ids: the producer's blocks holding the prompt, in logical order.
        local_block_ids: the consumer's blocks, in logical order; blocks ``[first_block:]`` are loaded
            (the ones before it hit the consumer's own prefix cache).
        first_block: the first logical block to load.
        prompt_hash: the consumer's prompt's fingerprint (``lease.prompt_hash``): the producer serves
            only a reader whose prompt is the one its blocks hold.
        bootstrap_room: the push order's room id (SGLang's ``bootstrap_room``): the consumer reserved
            ``local_block_ids`` and the producer writes into them; None = the pull order (the consumer reads).
            In the push order ``transfer_id`` is the consumer's own name for its reservation.
    """

    request_id: int
    transfer_id: str
    remote_host: str
    remote_port: int
    remote_block_ids: tuple[int, ...]
    local_block_ids: tuple[int, ...]
    first_block: int = 0
    prompt_hash: str = ""
    bootstrap_room: int | None = None


@dataclass(frozen=True)
class KVSendSpec:
    """One request's push, as the producer's scheduler hands it to its workers: after the step's
    forward pass its prompt's KV is complete and goes into the consumer's reservation.

    Attributes:
        request_id: the producer's id of the request.
        block_ids: its blocks holding the prompt, logical order.
    """

    request_id: int
    block_ids: tuple[int, ...]


@dataclass
class KVConnectorMetadata:
    """What the scheduler side tells the worker side in one step (vLLM's ``KVConnectorMetadata``).

    Attributes:
        reqs_to_recv: loads to start.
        reqs_to_discard: request ids aborted while loading: what arrives for them is thrown away
            (their blocks are free, maybe someone else's already).
        reqs_to_send: pushes to make after the step's forward pass (the push order's producer).
    """

    reqs_to_recv: list[KVLoadSpec] = field(default_factory=list)
    reqs_to_discard: list[int] = field(default_factory=list)
    reqs_to_send: list[KVSendSpec] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        return not self.reqs_to_recv and not self.reqs_to_discard and not self.reqs_to_send


@dataclass
class KVConnectorOutput:
    """What the worker side reports after a step (vLLM's ``KVConnectorOutput``).

    Attributes:
        finished_recving: request ids whose KV is now in their blocks.
        failed_recving: request id -> why its load failed (the scheduler applies
            ``kv_load_failure_policy``).
    """

    finished_recving: set[int] = field(default_factory=set)
    failed_recving: dict[int, str] = field(default_factory=dict)

    @property
    def is_empty(self) -> bool:
        return not self.finished_recving and not self.failed_recving


class KVConnectorScheduler(ABC):
    """The scheduler's side of a connector: decisions only, no bytes."""

    @abstractmethod
    def get_num_new_matched_tokens(self, request: SequenceGroup, num_computed_tokens: int) -> tuple[int | None, bool]:
        """How many prompt tokens after the ``num_computed_tokens`` found locally (prefix cache) another
        engine will supply. Returns ``(num_external_tokens, load_async)``: ``(None, False)`` = ask
        again next step; ``load_async`` = they arrive while other requests run (the request waits in
        ``WAITING_FOR_REMOTE_KVS``)."""

    @abstractmethod
    def update_state_after_alloc(self, request: SequenceGroup, block_ids: list[int], num_external_tokens: int) -> None:
        """The request's blocks are allocated (``block_ids``, logical order): remember the load."""

    @abstractmethod
    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        """This step's work for the workers; the connector forgets it once handed over."""

    @abstractmethod
    def request_finished(self, request: SequenceGroup, block_ids: list[int]) -> tuple[bool, dict | None]:
        """A request finished (its reason set). Returns ``(delay_free, kv_transfer_params)``:
        ``delay_free`` = keep its blocks until :meth:`take_freeable` returns it; the params go back to
        the caller in the request's output (what a decode instance needs to read them)."""

    def request_load_failed(self, request: SequenceGroup, why: str) -> None:
        """A load failed: the scheduler recomputes the prompt (``kv_load_failure_policy="recompute"``);
        the connector logs it and says so in ``request.kv_transfer_params``."""

    def request_loaded(self, request: SequenceGroup) -> None:
        """A load ended well: the request's KV is in its blocks."""

    def request_aborted_while_loading(self, request_id: int) -> None:
        """A request waiting for remote KV finished (abort): its load's result must be thrown away."""

    def take_freeable(self, now: float) -> list[int]:
        """Request ids whose delayed-free blocks may be freed now (read, or lease expired)."""
        return []

    def request_bootstrapping(self, request: SequenceGroup) -> bool:
        """A new request: whether it waits outside the queue until another engine reserved room for
        its KV (the push order's producer, SGLang's bootstrap queue)."""
        return False

    def take_bootstrapped(self) -> list[int]:
        """Request ids that were waiting for a reservation and may now be scheduled (reserved, or given up)."""
        return []


class KVConnectorWorker(ABC):
    """The worker's side of a connector: bytes only, as the scheduler side's metadata says."""

    @abstractmethod
    def start_load_kv(self, metadata: KVConnectorMetadata) -> None:
        """Before the step's forward pass: start the loads the metadata names, drop discarded ones."""

    def wait_for_layer_load(self, layer: int) -> None:
        """Block until layer ``layer``'s KV is in place (a transport that loads whole requests before
        the forward pass returns at once)."""

    def save_kv_layer(self, layer: int, kv, attn_metadata) -> None:
        """After layer ``layer`` wrote its K and V: send them on if this transport pushes (a pulling
        producer keeps them in its pool, under a lease)."""

    def wait_for_save(self) -> None:
        """After the step's forward pass: block until every save of the step is out (a pushing
        producer writes the pushes its metadata named here)."""

    @abstractmethod
    def get_finished(self) -> KVConnectorOutput:
        """Loads that ended since the last call, their KV now in the consumer's blocks (or failed)."""

    def wait_for_any(self, timeout_s: float) -> None:
        """An idle engine with loads in flight waits here instead of spinning empty steps."""

    def shutdown(self) -> None:
        """Stop background work."""
