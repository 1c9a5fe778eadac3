"""Overflow siblings: the reserved suffix, and unchanged TOAST naming the sibling too (docs/TYPES.md)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from airflow_provider_postgres_cdc.errors import ReservedColumnNameError
from airflow_provider_postgres_cdc.values.overflow import check_names, with_sibling_unchanged


def test_a_source_column_with_the_reserved_suffix_is_refused_with_the_fix() -> None:
    check_names("public.t", ["d", "pgl_text", "d__pgl_textual"])
    with pytest.raises(ReservedColumnNameError, match=r"public\.t.*'d__pgl_text'.*rename"):
        check_names("public.t", ["d", "d__pgl_text"])


def test_unchanged_lists_name_the_sibling_of_each_column_that_has_one() -> None:
    unchanged = pa.array([[], ["big", "doc"], ["doc"]], pa.list_(pa.string()))
    assert with_sibling_unchanged(unchanged, ["big"]).to_pylist() == [
        [],
        ["big", "doc", "big__pgl_text"],
        ["doc"],
    ]
    assert with_sibling_unchanged(unchanged, []) is unchanged
