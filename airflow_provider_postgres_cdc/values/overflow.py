"""Overflow siblings: where a value its lake type cannot hold is kept, exactly (docs/TYPES.md).

A value the typed column cannot hold (``'infinity'::date``, a BC or year-10000 timestamp,
``NaN`` in ``numeric(10,2)``, a multi-dimensional array...) is staged as NULL in the typed column
and as its exact PostgreSQL text in the string column ``<column>__pgl_text``, the column's
*sibling*. A staged file has the sibling only when it needs it: some value of the column in
that file overflows, or (changes) the column is an unchanged TOAST value in some row, and then
the sibling is named in that row's ``_pgl_unchanged`` too, so the apply job keeps the lake's
sibling value as it keeps the column's. A sibling absent from a file is all NULL there (those
values fit). The suffix is reserved: a source column may not end with it.

The snapshot engines and the drain call :func:`typed_with_text`; :func:`add_siblings` lays the
siblings next to the typed columns. Pure Arrow, no I/O: shipped with the apply job like
:mod:`.types`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import pyarrow as pa

from airflow_provider_postgres_cdc.errors import ReservedColumnNameError
from airflow_provider_postgres_cdc.formats.manifest import SIBLING_SUFFIX as SUFFIX
from airflow_provider_postgres_cdc.formats.manifest import ColumnManifest, is_sibling, sibling_name
from airflow_provider_postgres_cdc.formats.pgtypes import TEXT_OID
from airflow_provider_postgres_cdc.values.arrow_types import can_overflow, text_to_arrow_with_overflow
from airflow_provider_postgres_cdc.values.binary_format import binary_to_arrow_with_overflow


def check_names(table: str, names: Iterable[str]) -> None:
    """Refuse source columns that would collide with a sibling, naming the rename that fixes it."""
    reserved = [name for name in names if is_sibling(name)]
    if reserved:
        raise ReservedColumnNameError(
            f"table {table}: column(s) {reserved} end with {SUFFIX!r}, which the pipeline reserves for "
            "overflow columns (docs/TYPES.md); rename them in the source, or leave them out of the "
            "publication's column list"
        )


def typed_with_text(values: pa.Array, type_oid: int, typmod: int) -> tuple[pa.Array, pa.Array | None]:
    """A column's typed values and, when some overflow, their exact text (null elsewhere).

    ``values`` are PostgreSQL text (string arrays) or binary-format values (binary arrays).
    """
    if pa.types.is_binary(values.type):
        return binary_to_arrow_with_overflow(values, type_oid, typmod)
    return text_to_arrow_with_overflow(values, type_oid, typmod)


def may_need_sibling(type_oid: int, typmod: int) -> bool:
    """Whether a column of this type can ever have a sibling (its values may overflow)."""
    return can_overflow(type_oid, typmod)


def sibling_field(column: str) -> pa.Field:
    return pa.field(sibling_name(column), pa.string())


def add_siblings(
    names: Sequence[str],
    typed: Sequence[pa.Array],
    texts: Sequence[pa.Array | None],
    needed: Iterable[str] = (),
) -> tuple[list[pa.Field], list[pa.Array]]:
    """Sibling fields and arrays for the columns that overflow here, or are in ``needed``.

    ``texts[i]`` is column ``names[i]``'s overflow text (None when nothing overflowed); columns
    in ``needed`` (unchanged TOAST in a change file) get an all-NULL sibling when nothing overflowed.
    """
    wanted = set(needed)
    fields, arrays = [], []
    for name, values, text in zip(names, typed, texts, strict=True):
        if text is None and name not in wanted:
            continue
        fields.append(sibling_field(name))
        arrays.append(text if text is not None else pa.nulls(len(values), pa.string()))
    return fields, arrays


def with_sibling_unchanged(unchanged: pa.Array, siblings: Iterable[str]) -> pa.Array:
    """``_pgl_unchanged`` lists that name the sibling of each listed column that has one in the file."""
    has = {name for name in siblings}
    if not has:
        return unchanged
    lists = unchanged.to_pylist()
    extended = [row + [sibling_name(c) for c in row if c in has] if row else row for row in lists]
    return pa.array(extended, unchanged.type)


def sibling_manifests(table_columns: Iterable[str], staged: Iterable[str]) -> list[ColumnManifest]:
    """Manifest entries of the siblings among ``staged`` field names (text columns, never keys),
    in the order of the table columns they belong to."""
    present = set(staged)
    return [
        ColumnManifest(sibling_name(name), "text", TEXT_OID, -1, "string")
        for name in table_columns
        if sibling_name(name) in present
    ]
