"""verify compares values as PostgreSQL's row text would: the sign of a zero counts, NaN equals NaN."""

from __future__ import annotations

import pyarrow as pa

from airflow_provider_postgres_cdc.engine.verify import multiset_difference


def test_negative_zero_differs_from_zero_in_scalars_and_arrays() -> None:
    source = pa.table({"f": [-0.0, 1.0], "a": [[-0.0, 2.0], []]})
    signed = pa.table({"f": [0.0, 1.0], "a": [[-0.0, 2.0], []]})
    in_array = pa.table({"f": [-0.0, 1.0], "a": [[0.0, 2.0], []]})
    assert multiset_difference(source, signed) == (1, 1)
    assert multiset_difference(source, in_array) == (1, 1)
    assert multiset_difference(source, source) == (0, 0)


def test_nan_equals_nan_and_duplicates_count() -> None:
    source = pa.table({"f": [float("nan"), float("nan"), 0.5]})
    assert multiset_difference(source, pa.table({"f": [float("nan"), float("nan"), 0.5]})) == (0, 0)
    assert multiset_difference(source, pa.table({"f": [float("nan"), 0.5]})) == (1, 0)
