"""Retry a web call on transient failures with exponential back-off."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def with_retries(
    call: Callable[[], T],
    *,
    transient: tuple[type[BaseException], ...],
    retries: int = 2,
    backoff: float = 0.5,
) -> T:
    """Return `call()`, retrying up to `retries` times when it raises a `transient` error.

    Waits `backoff`, then twice that, and so on; the last error propagates.
    """
    for attempt in range(retries + 1):
        try:
            return call()
        except transient:
            if attempt == retries:
                raise
            time.sleep(backoff * 2**attempt)
    raise AssertionError("unreachable")
