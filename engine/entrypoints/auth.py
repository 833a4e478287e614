"""Who may do what on the lab's server: API keys, the teacher token, and a limit on wrong guesses.

Both the OpenAI endpoints (engine/entrypoints/openai/api_server.py) and the lab's
(engine/entrypoints/lab.py) check secrets here:

- every comparison of a secret runs in constant time (:func:`hmac.compare_digest` on UTF-8 bytes,
  so that a header byte outside ASCII is a wrong key, never an error);
- an address that sent :data:`MAX_AUTH_FAILURES` wrong keys or tokens within
  :data:`AUTH_FAILURE_WINDOW_S` seconds gets 429 for every key or token it sends until the oldest of
  those failures is that old (the right one included: otherwise a guesser would only have to wait
  for its 200).
"""

from __future__ import annotations

import hmac
import time
from collections import deque

from starlette.requests import Request

from engine.entrypoints.openai.protocol import APIError

MAX_AUTH_FAILURES = 10  # wrong keys or tokens one address may send in a window
AUTH_FAILURE_WINDOW_S = 60.0
MAX_ADDRESSES_TRACKED = 10_000  # addresses with recent failures kept; the oldest are forgotten beyond


def same_secret(given: str, secret: str) -> bool:
    """``given == secret``, in time that does not depend on where they differ."""
    return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), secret.encode("utf-8", "surrogatepass"))


def bearer(raw: Request) -> str | None:
    """The key of an ``Authorization: Bearer KEY`` header (None without one)."""
    scheme, _, key = raw.headers.get("authorization", "").partition(" ")
    key = key.strip()
    return key if scheme.lower() == "bearer" and key else None


def key_name(key: str, api_keys: dict[str, str]) -> str | None:
    """The client name of ``key`` among ``api_keys`` (key -> name), None when it is none of them.
    Every key is compared, in constant time each, so the time says nothing about which one matched."""
    found = None
    for known, name in api_keys.items():
        if same_secret(key, known):
            found = name
    return found


class AuthFailures:
    """Wrong keys and tokens by client address, over a sliding window (429 with ``Retry-After`` beyond
    the limit). Used from the event loop only."""

    def __init__(self, max_failures: int = MAX_AUTH_FAILURES, window_s: float = AUTH_FAILURE_WINDOW_S):
        self.max_failures, self.window_s = max_failures, window_s
        self.failures: dict[str, deque[float]] = {}

    def check(self, raw: Request) -> None:
        """Before a key or token is compared.

        Raises:
            APIError: 429 while the address is over its limit.
        """
        address = client_address(raw)
        times = self.failures.get(address)
        if times is None:
            return
        now = time.monotonic()
        while times and now - times[0] > self.window_s:
            times.popleft()
        if not times:
            del self.failures[address]
        elif len(times) >= self.max_failures:
            wait = max(1, int(self.window_s - (now - times[0])) + 1)
            raise APIError(429, f"too many wrong keys or tokens from this address ({len(times)} in {self.window_s:g} s); "
                           f"retry in {wait} s", "authorization", {"Retry-After": str(wait)})

    def failed(self, raw: Request) -> None:
        """A wrong key or token came from ``raw``'s address."""
        address = client_address(raw)
        times = self.failures.pop(address, None) or deque(maxlen=self.max_failures)
        times.append(time.monotonic())
        self.failures[address] = times  # most recent last: the first ones are the oldest
        while len(self.failures) > MAX_ADDRESSES_TRACKED:
            del self.failures[next(iter(self.failures))]


def client_address(raw: Request) -> str:
    """The request's address: its TCP peer, or the ``X-Forwarded-For`` that a proxy on 127.0.0.1 (the
    app, relaying a student's request) sent, which uvicorn believes from 127.0.0.1 only."""
    return raw.client.host if raw.client is not None else "unknown"
