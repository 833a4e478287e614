"""A prefill instance's leases: the blocks of a finished request, lent to one decode instance
under an unguessable name for a limited time (vLLM's pull order: prefill finishes and holds its
blocks; decode allocates, reads, notifies; a lease nobody reads expires, as vLLM's
``VLLM_NIXL_ABORT_REQUEST_TIMEOUT``).

A client's ``kv_transfer_params`` are untrusted: whoever asks to read blocks names a transfer id and
the blocks it expects. The table serves a read only when the id is one it granted (a 192-bit
``secrets.token_urlsafe``, not a request id or a counter), still live, not read before, and the
blocks are exactly the ones lent under it; anything else is refused and logged. So a forged
``remote_block_ids`` or transfer id never reads another request's KV. Model-free and thread-safe.
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Callable

logger = logging.getLogger("engine.kv_transfer")

TRANSFER_ID_BYTES = 24  # 192 random bits, URL-safe base64: 32 characters


def prompt_hash(token_ids: list[int]) -> str:
    """A prompt's fingerprint (sha256 of its token ids): a lease serves only a reader with the same prompt."""
    return hashlib.sha256(json.dumps(list(token_ids)).encode()).hexdigest()


class TransferRefused(Exception):
    """A read of lent blocks that the lease table refused (the reason is the message)."""


@dataclass
class Lease:
    """Blocks lent under one transfer id.

    Attributes:
        transfer_id: the unguessable name the decode instance reads them by.
        request_id: the prefill instance's request that computed them.
        block_ids: its blocks, in logical order.
        prompt_hash: :func:`prompt_hash` of its prompt.
        expires_at: when the lease ends unread (the table's clock, s).
        read: the blocks were read once (a second read is refused).
        released: the reader is done (or gave up): the blocks may be freed.
    """

    transfer_id: str
    request_id: int
    block_ids: tuple[int, ...]
    prompt_hash: str
    expires_at: float
    read: bool = False
    released: bool = False


class LeaseTable:
    """The leases of one prefill instance.

    Args:
        duration_s: how long a lease lives unread (``kv_lease_duration``).
        clock: seconds, monotonic (a test passes its own).
    """

    def __init__(self, duration_s: float, clock: Callable[[], float] = time.monotonic):
        self.duration_s = duration_s
        self.clock = clock
        self._leases: dict[str, Lease] = {}
        self._lock = threading.Lock()
        self.num_refused = 0
        self.num_expired = 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._leases)

    def grant(self, request_id: int, block_ids: list[int], prompt_hash_: str) -> Lease:
        """Lend ``block_ids`` of finished request ``request_id`` (whose prompt has ``prompt_hash_``);
        returns the lease with its new id."""
        lease = Lease(secrets.token_urlsafe(TRANSFER_ID_BYTES), request_id, tuple(block_ids), prompt_hash_, self.clock() + self.duration_s)
        with self._lock:
            self._leases[lease.transfer_id] = lease
        return lease

    def claim(self, transfer_id, block_ids, prompt_hash_, peer: str = "unknown") -> Lease:
        """The one read of a lease: ``block_ids`` must be exactly the blocks lent under ``transfer_id``
        and ``prompt_hash_`` the reader's prompt's, the same as the lender's. A claimed lease lives
        ``duration_s`` more from now: a read that came in time is not lost to a busy lender.

        Raises:
            TransferRefused: an unknown or expired transfer id, a lease already read, other blocks
                than the lease's, or another prompt; the refusal is logged (warning, with ``peer``).
        """
        with self._lock:
            lease = self._leases.get(transfer_id) if isinstance(transfer_id, str) else None
            if lease is None:
                why = "unknown transfer id"
            elif lease.released or self.clock() >= lease.expires_at:
                why = "the lease has ended"
            elif lease.read:
                why = "the blocks were already read"
            elif not isinstance(block_ids, (list, tuple)) or tuple(block_ids) != lease.block_ids:
                why = "the blocks asked for are not the ones lent under this transfer id"
            elif prompt_hash_ != lease.prompt_hash:
                why = "the reader's prompt is not the one these blocks hold"
            else:
                lease.read = True
                lease.expires_at = self.clock() + self.duration_s
                return lease
            self.num_refused += 1
        shown = transfer_id[:6] + "..." if isinstance(transfer_id, str) else repr(type(transfer_id).__name__)
        logger.warning("refused a KV read from %s (transfer id %s): %s", peer, shown, why)
        raise TransferRefused(why)

    def release(self, transfer_id, prompt_hash_) -> bool:
        """The reader is done with (or gives up) a lease: its blocks may be freed. Returns whether
        ``transfer_id`` named a live lease lent for the prompt of ``prompt_hash_`` (anything else
        changes nothing: a reader refused for another prompt cannot end someone's lease)."""
        with self._lock:
            lease = self._leases.get(transfer_id) if isinstance(transfer_id, str) else None
            if lease is None or lease.prompt_hash != prompt_hash_:
                return False
            lease.released = True
            return True

    def live_ids(self) -> set[str]:
        """The transfer ids of the leases not yet taken by :meth:`take_freeable`."""
        with self._lock:
            return set(self._leases)

    def take_freeable(self) -> list[int]:
        """Request ids of the leases released or expired, each once (the table forgets them)."""
        now = self.clock()
        with self._lock:
            done = [lease for lease in self._leases.values() if lease.released or now >= lease.expires_at]
            for lease in done:
                del self._leases[lease.transfer_id]
                if not lease.released:
                    self.num_expired += 1
        for lease in done:
            if not lease.released:
                logger.warning("KV lease of request %d expired unread after %.0f s: its %d blocks are freed",
                               lease.request_id, self.duration_s, len(lease.block_ids))
        return [lease.request_id for lease in done]
