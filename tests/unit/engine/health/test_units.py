"""Sizes and durations: parsed from what operators type, printed as ``pg_size_pretty`` prints them."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_postgres_cdc.engine.health.units import format_size, parse_duration, parse_size

MB = 1 << 20


@pytest.mark.parametrize(
    ("text", "expected"),
    [("8192", 8192), ("64MB", 64 * MB), ("1.5 GB", 3 << 29), ("16kB", 16384), ("2tb", 2 << 40), (7, 7)],
)
def test_parse_size(text: str | int, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["-1", "12 parsecs", "", "MB", True])
def test_parse_size_rejects(bad: Any) -> None:
    with pytest.raises(ValueError):
        parse_size(bad)


@given(st.integers(min_value=0, max_value=1 << 50))
def test_format_size_round_trips_within_rounding(num: int) -> None:
    # Like pg_size_pretty: a unit is used from 10 of it on, so rounding costs at most 5 %.
    back = parse_size(format_size(num))
    assert back == num if num < 10240 else abs(back - num) <= num * 0.05


def test_parse_duration() -> None:
    assert parse_duration(timedelta(minutes=5)) == timedelta(minutes=5)
    assert parse_duration("90") == parse_duration(90) == timedelta(seconds=90)
    for bad in ("soon", -1, float("inf")):
        with pytest.raises(ValueError):
            parse_duration(bad)
