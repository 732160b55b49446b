"""Argument checks shared by the control modules: each raises ConfigError naming the field."""

from __future__ import annotations

import math

from lifeline.errors import ConfigError


def positive(field: str, value: float) -> float:
    """``value`` as a float when it is a finite number > 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ConfigError(f"{field} must be a positive finite number, got {value!r}", field=field)
    return float(value)


def non_negative(field: str, value: float) -> float:
    """``value`` as a float when it is a finite number >= 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
        raise ConfigError(f"{field} must be a finite number >= 0, got {value!r}", field=field)
    return float(value)


def integer(field: str, value: int, minimum: int = 0) -> int:
    """``value`` when it is an integer >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{field} must be an integer >= {minimum}, got {value!r}", field=field)
    return value
