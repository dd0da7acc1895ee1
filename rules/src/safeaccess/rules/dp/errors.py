"""Errors of the differential-privacy library."""

from __future__ import annotations

import math


class DPParameterError(ValueError):
    """A privacy or noise parameter is out of range; the message says which and what is allowed."""


def check_epsilon(epsilon: float, name: str = "epsilon") -> float:
    value = _as_float(epsilon, name)
    if not (math.isfinite(value) and value > 0.0):
        raise DPParameterError(f"{name} must be a finite number > 0, got {epsilon!r}")
    return value


def check_delta(delta: float, name: str = "delta") -> float:
    value = _as_float(delta, name)
    if not (0.0 < value < 1.0):
        raise DPParameterError(f"{name} must lie strictly between 0 and 1, got {delta!r}")
    return value


def check_positive(value: float, name: str) -> float:
    number = _as_float(value, name)
    if not (math.isfinite(number) and number > 0.0):
        raise DPParameterError(f"{name} must be a finite number > 0, got {value!r}")
    return number


def check_non_negative(value: float, name: str) -> float:
    number = _as_float(value, name)
    if not (math.isfinite(number) and number >= 0.0):
        raise DPParameterError(f"{name} must be a finite number >= 0, got {value!r}")
    return number


def check_probability(value: float, name: str) -> float:
    number = _as_float(value, name)
    if not (0.0 < number < 1.0):
        raise DPParameterError(f"{name} must lie strictly between 0 and 1, got {value!r}")
    return number


def _as_float(value: object, name: str) -> float:
    if isinstance(value, bool):
        raise DPParameterError(f"{name} must be a number, got a boolean")
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise DPParameterError(f"{name} must be a number, got {value!r}") from None
