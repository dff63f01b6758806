"""One retry policy for every read and write that may fail for a moment (pure).

`RetryPolicy.call(fn)` retries transient errors (timeouts, resets, EIO, HTTP 408/429/5xx) with
jittered exponential backoff, at most `attempts` times, none starting `deadline` s after the
first; permanent errors propagate at once. `as_api_retry` is the same policy as a
google.api_core Retry, for the requests the storage client retries itself; `call` is not that
Retry, which has no cap on attempts and sleeps by time.sleep (tests pass their own sleep).

`StoreHealth`: a store (bucket) that has answered one process nothing but transient errors
for `store_down` s is down: StoreUnreachable stops the job with one line (exit 2) instead of
failing every image after its own retries. Both budgets (60 s) are read from
IMG2TFRECORD_RETRY_SECONDS when a policy is made (tests shorten them).
"""

from __future__ import annotations

import dataclasses
import errno
import http
import itertools
import os
import random
import re
import time
from collections.abc import Callable
from typing import TypeVar

from transforms.failures import USER_ERROR_MARKER

# errno values worth another try: the file may well be readable a moment later.
TRANSIENT_ERRNOS = frozenset(
    {errno.EAGAIN, errno.EINTR, errno.EIO, errno.EBUSY, errno.ETIMEDOUT, errno.ECONNRESET, errno.ENOBUFS}
)
# HTTP statuses of a cloud store worth another try (throttling and server errors).
TRANSIENT_HTTP = frozenset({408, 429, 500, 502, 503, 504})
# Seconds of the default budget: no retry starts later, and a store failing this long is down.
BUDGET_ENV = "IMG2TFRECORD_RETRY_SECONDS"
_ERRNO = re.compile(r"\[Errno -?\d+\] [^\"')(]+")

T = TypeVar("T")


def _budget() -> float:
    return float(os.environ.get(BUDGET_ENV) or 60.0)


class GaveUp(OSError):
    """A transient error outlived the policy's attempts or deadline; the message says which (one
    line). `store`: the store that was asked ('gs://bucket'), None for a local file."""

    def __init__(self, message: str, store: str | None = None):
        super().__init__(message)
        self.store = store


class StoreUnreachable(Exception):
    """A store answered nothing but errors for too long, or a write to it failed for good: the job
    stops with one line (USER_ERROR_MARKER, exit 2). Not an OSError: never one image's failure."""


def http_status(error: BaseException) -> int | None:
    code = getattr(error, "code", None)  # google.api_core.exceptions.GoogleAPICallError
    if isinstance(code, int):
        return code
    status = getattr(getattr(error, "response", None), "status_code", None)  # requests / media errors
    return status if isinstance(status, int) else None


def is_transient(error: BaseException) -> bool:
    """True for errors that a later attempt may not hit: timeouts, resets, 5xx, 429."""
    if isinstance(error, GaveUp):
        return False
    if isinstance(error, (TimeoutError, ConnectionError)):
        return True
    if isinstance(error, OSError) and error.errno in TRANSIENT_ERRNOS:
        return True
    status = http_status(error)
    if status is not None:
        return status in TRANSIENT_HTTP
    # requests/urllib3 connection and timeout errors carry no status.
    name = type(error).__name__
    return name in {"ConnectionError", "Timeout", "ReadTimeout", "ConnectTimeout", "RetryError"}


def describe(error: BaseException) -> str:
    """One line saying what went wrong: an OSError's reason; for a connection that failed,
    its errno ("[Errno 111] Connection refused" out of urllib3's long text)."""
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    cause = getattr(error, "cause", None)  # google.api_core's RetryError: the last error it retried
    if isinstance(cause, BaseException) and cause is not error:
        return describe(cause)
    status = http_status(error)
    if status is not None and type(error).__name__ == "InvalidResponse":  # resumable media: a tuple
        return f"HTTP {status} {_reason(status)}".rstrip()
    text = str(error).strip()
    if (cause := _ERRNO.search(text)) and is_transient(error):
        return cause.group(0).strip()
    lines = text.splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}".rstrip(": ")


def _reason(status: int) -> str:
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return ""


def store_of(path: str) -> str | None:
    """The store `path` is read from ('gs://bucket'), or None for a local file."""
    if "://" not in path:
        return None
    scheme, rest = path.split("://", 1)
    return f"{scheme}://{rest.split('/', 1)[0]}"


class StoreHealth:
    """Per store, since when every request has failed with a transient error (see module docstring)."""

    def __init__(self, clock=time.monotonic):
        self._clock = clock
        self._failing_since: dict[str, float] = {}  # one dict call each: safe across threads

    def succeeded(self, store: str | None) -> None:
        self._failing_since.pop(store, None)

    def failed(self, store: str | None, error: str, down_after: float) -> None:
        """Notes a transient error; raises StoreUnreachable once the store has been failing for `down_after` s."""
        if store is None:
            return
        now = self._clock()
        since = self._failing_since.setdefault(store, now)
        if now - since >= down_after:
            raise StoreUnreachable(
                f"{USER_ERROR_MARKER} {store} answered nothing but errors for {now - since:.0f} s "
                f"(last: {error}); nothing was published, rerun when it is reachable"
            )


HEALTH = StoreHealth()  # this process's view of the stores it uses


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently a transient error is retried: delays of initial_delay *
    2**attempt (at most max_delay), each plus up to `jitter` of itself at random so that workers
    do not retry in lockstep. An attempt in flight at the deadline ends within its request timeout."""

    attempts: int = 5
    initial_delay: float = 0.5
    max_delay: float = 10.0
    jitter: float = 0.5
    deadline: float = dataclasses.field(default_factory=_budget)
    store_down: float = dataclasses.field(default_factory=_budget)

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("RetryPolicy.attempts must be at least 1")
        if self.deadline <= 0 or self.store_down <= 0:
            raise ValueError("RetryPolicy.deadline and store_down must be positive")

    def call(
        self, fn: Callable[[], T], store: str | None = None, sleep: Callable[[float], None] = time.sleep
    ) -> T:
        """`fn()`, retried while it raises transient errors.

        Raises:
          GaveUp: still failing after `attempts` tries or `deadline` seconds.
          StoreUnreachable: `store` has answered nothing but transient errors for `store_down` s.
          Anything permanent `fn` raises, at once.
        """
        start = time.monotonic()
        for attempt in itertools.count(1):
            try:
                result = fn()
            except Exception as e:
                if not is_transient(e):
                    if isinstance(e, OSError) or http_status(e) is not None:
                        HEALTH.succeeded(store)  # it answered: the store is up, the object is not there
                    raise
                HEALTH.failed(store, describe(e), self.store_down)
                delay = min(self.max_delay, self.initial_delay * 2 ** (attempt - 1))
                delay *= 1 + self.jitter * random.random()
                spent = time.monotonic() - start
                if attempt == self.attempts or spent + delay > self.deadline:
                    within = f" in {spent:.0f} s" if attempt < self.attempts else ""
                    raise GaveUp(
                        f"{describe(e)} (still failing after {attempt} attempts{within})", store
                    ) from None
                sleep(delay)
            else:
                HEALTH.succeeded(store)
                return result

    def as_api_retry(self):
        """This policy's backoff and deadline as a google.api_core Retry, for the storage client's
        own retries (each attempt one request; no attempt starts after `deadline` s)."""
        from google.api_core.retry import Retry

        return Retry(
            predicate=is_transient,
            initial=self.initial_delay,
            maximum=self.max_delay,
            multiplier=2.0,
            timeout=self.deadline,
        )


DEFAULT_RETRY = RetryPolicy()
