"""verify counts overflow siblings as part of the row: absent on one side = NULL."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa

from airflow_provider_postgres_cdc.engine.verify import multiset_difference, with_siblings


def _differences(source: pa.Table, lake: pa.Table) -> tuple[int, int]:
    left, right = with_siblings(source, lake)
    return multiset_difference(left, right.select(left.column_names))


def test_a_sibling_absent_on_one_side_is_null_there() -> None:
    source = pa.table({"id": [1, 2], "d": [dt.date(2024, 1, 1), None]})
    lake = pa.table({"id": [1, 2], "d": [dt.date(2024, 1, 1), None], "d__pgl_text": pa.nulls(2, pa.string())})
    assert _differences(source, lake) == (0, 0)


def test_a_stale_or_missing_sibling_value_is_a_difference() -> None:
    source = pa.table({"id": [1], "d": pa.array([None], pa.date32()), "d__pgl_text": ["infinity"]})
    stale = pa.table({"id": [1], "d": pa.array([None], pa.date32()), "d__pgl_text": ["-infinity"]})
    missing = pa.table({"id": [1], "d": pa.array([None], pa.date32())})
    assert _differences(source, stale) == (1, 1)
    assert _differences(source, missing) == (1, 1)
    fitting = pa.table({"id": [1], "d": [dt.date(2024, 1, 1)]})
    left_over = pa.table({"id": [1], "d": [dt.date(2024, 1, 1)], "d__pgl_text": ["infinity"]})
    assert _differences(fitting, left_over) == (1, 1)
