"""Sizes and durations as operators type them and as PostgreSQL prints them.

Templated operator fields arrive as strings, so thresholds are parsed from the forms an operator
would write (``"64MB"``, ``"600"``), and printed back the way ``pg_size_pretty`` does, so the
messages of the sensor, the trigger and ``pgcdc lag`` read like the server's own.
"""

from __future__ import annotations

import itertools
import math
import re
from datetime import timedelta

__all__ = ["format_duration", "format_size", "parse_duration", "parse_size"]

_BYTES_PER_UNIT = {
    "": 1,
    "b": 1,
    "bytes": 1,
    "kb": 1 << 10,
    "mb": 1 << 20,
    "gb": 1 << 30,
    "tb": 1 << 40,
    "pb": 1 << 50,
}
_SIZE_TEXT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(value: int | str) -> int:
    """Bytes from an int or a PostgreSQL-style size (``"64MB"``, ``"1.5 GB"``, ``"8192"``).

    Templated operator fields arrive as strings, so sizes are accepted in the form an operator
    would type them, with the units ``pg_size_bytes`` knows (powers of 1024).
    """
    if isinstance(value, bool):
        raise ValueError(f"not a size: {value!r}")
    if isinstance(value, int):
        amount = value
    else:
        match = _SIZE_TEXT.match(value)
        unit = match.group(2).lower() if match else None
        if match is None or unit not in _BYTES_PER_UNIT:
            raise ValueError(f"not a size: {value!r} (use bytes or a number with B, kB, MB, GB, TB or PB)")
        amount = int(float(match.group(1)) * _BYTES_PER_UNIT[unit])
    if amount < 0:
        raise ValueError(f"a size cannot be negative: {value!r}")
    return amount


_PRETTY_UNITS = (("bytes", 1), ("kB", 1 << 10), ("MB", 1 << 20), ("GB", 1 << 30), ("TB", 1 << 40))


def format_size(num_bytes: int | None) -> str:
    """A byte count as ``pg_size_pretty`` prints it (``"12 MB"``, a unit from 10 of it on), or ``"-"``."""
    if num_bytes is None:
        return "-"
    for (unit, unit_bytes), (_, next_unit_bytes) in itertools.pairwise(_PRETTY_UNITS):
        if abs(num_bytes) < 10 * next_unit_bytes:
            return f"{round(num_bytes / unit_bytes)} {unit}"
    unit, unit_bytes = _PRETTY_UNITS[-1]
    return f"{round(num_bytes / unit_bytes)} {unit}"


def parse_duration(value: timedelta | float | str) -> timedelta:
    """A ``timedelta`` from itself, from seconds, or from a string of seconds (templated fields)."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r}")
    elif isinstance(value, int | float):
        seconds = float(value)
    else:
        try:
            seconds = float(value)
        except ValueError:
            raise ValueError(f"not a duration: {value!r} (use a timedelta or a number of seconds)") from None
    if seconds < 0 or not math.isfinite(seconds):
        raise ValueError(f"a duration must be a finite number of seconds >= 0: {value!r}")
    return timedelta(seconds=seconds)


def format_duration(duration: timedelta) -> str:
    """A duration for a message: seconds to a tenth under two minutes, then minutes, then hours."""
    seconds = int(duration.total_seconds())
    if seconds < 120:
        return f"{duration.total_seconds():.1f}s"
    if seconds < 7200:
        return f"{seconds // 60}min {seconds % 60}s"
    return f"{seconds // 3600}h {seconds % 3600 // 60}min"
