"""Await a condition with a deadline: the one polling loop shared by benchmarks and tests."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

__all__ = ["wait_for"]


def wait_for(cond: Callable[[], T], timeout: float = 30.0, what: str = "condition", interval: float = 0.01) -> T:
    """Call ``cond()`` every ``interval`` seconds until it returns a truthy value, and return that value.

    Args:
        cond: the condition; any exception it raises propagates.
        timeout: seconds before giving up.
        what: what is awaited, for the error message.
        interval: seconds between calls.

    Raises:
        TimeoutError: ``cond()`` stayed falsy for ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)
