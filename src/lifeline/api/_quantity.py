"""Kubernetes resource quantities ("8Gi", "500M", "1e9") as whole bytes."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

__all__ = ["parse_bytes"]

_SUFFIX = {
    "": 1,
    "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
}
_QUANTITY = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?)\s*(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?\s*$")


def parse_bytes(value: int | str) -> int:
    """Return ``value`` (an int of bytes or a Kubernetes quantity string) as whole bytes.

    Accepts the binary suffixes Ki..Ei, the decimal suffixes k..E and exponents
    (``"1e9"``); fractional results round up to the next byte (as Kubernetes does).

    Raises:
        ValueError: negative numbers, booleans, or strings that are not a quantity.
    """
    if isinstance(value, bool):
        raise ValueError("expected bytes (an integer) or a quantity such as 8Gi, got a boolean")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"must be >= 0 bytes, got {value}")
        return value
    if not isinstance(value, str):
        raise ValueError(f"expected bytes (an integer) or a quantity such as 8Gi, got {type(value).__name__}")
    match = _QUANTITY.match(value)
    if match is None:
        raise ValueError(
            f"{value!r} is not a quantity; write bytes (e.g. 8589934592) or a quantity such as 8Gi or 500M"
        )
    try:
        number = Decimal(match.group(1))
    except InvalidOperation as err:  # pragma: no cover - the regex admits only decimals
        raise ValueError(f"{value!r} is not a quantity") from err
    scaled = number * _SUFFIX[match.group(2) or ""]
    whole = int(scaled)
    return whole + 1 if scaled > whole else whole
