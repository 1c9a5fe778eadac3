"""Check that lake tables equal their PostgreSQL sources (docs/DESIGN.md, invariant 5), as multisets.

The source side is read the way the initial snapshot reads it (same column lists, row filters
and type mapping) through a throwaway slot's exported snapshot, staged to a scratch directory;
the lake side is read with pyiceberg through the lake's own catalog, so no Spark session is
needed. Rows are compared as multisets (duplicates count). Run it when the source is quiet, or
pass the cut of the batch that matches the source: a busy source is ahead of the lake. A value
held in an overflow sibling (docs/TYPES.md) is compared exactly: the siblings are part of the row.
A soft-deletes table is read as documented (docs/LAKE.md): its rows marked deleted are left out.
"""

from __future__ import annotations

import math
import tempfile
import uuid
from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from airflow_provider_postgres_cdc.engine.column_hashing import ColumnTransformer
from airflow_provider_postgres_cdc.engine.lake_catalog import Cut, read_table
from airflow_provider_postgres_cdc.engine.snapshot import take_snapshot
from airflow_provider_postgres_cdc.formats.deletes import DELETED_LSN
from airflow_provider_postgres_cdc.formats.lake import LakeConfig
from airflow_provider_postgres_cdc.formats.manifest import is_sibling, sibling_name
from airflow_provider_postgres_cdc.replication import connect, drop_slot
from airflow_provider_postgres_cdc.replication.connection import ConnParams


@dataclass(frozen=True, slots=True)
class TableComparison:
    """One table's verdict: row counts on both sides and rows found on one side only."""

    table: str
    source_rows: int
    target_rows: int
    only_in_source: int
    only_in_target: int
    detail: str = ""

    @property
    def equal(self) -> bool:
        return not self.detail and self.only_in_source == 0 and self.only_in_target == 0

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "equal": self.equal}


def _hashable(value: Any) -> Hashable:
    """A value as a dict key: lists and maps become tuples, NaN equals NaN (PostgreSQL agrees), and
    ``-0.0`` differs from ``0.0`` (Python's ``==`` equates them; the row's text does not)."""
    if isinstance(value, float) and math.isnan(value):
        return ("NaN",)
    if isinstance(value, float) and value == 0.0:
        return ("zero", math.copysign(1.0, value))
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple((k, _hashable(v)) for k, v in value.items())
    return value  # type: ignore[no-any-return]


def with_siblings(source: pa.Table, lake: pa.Table) -> tuple[pa.Table, pa.Table]:
    """Both sides with every overflow sibling either has (docs/TYPES.md): a sibling absent on one
    side is all NULL there, so a stale lake sibling, or a missing one, is a difference."""
    names = [n for n in source.column_names if not is_sibling(n)]
    wanted = [
        sibling_name(n)
        for n in names
        if sibling_name(n) in source.column_names or sibling_name(n) in lake.column_names
    ]

    def complete(table: pa.Table) -> pa.Table:
        for name in wanted:
            if name not in table.column_names:
                table = table.append_column(name, pa.nulls(table.num_rows, pa.string()))
        return table

    order = [*names, *wanted]
    return complete(source).select(order), complete(lake)


def _aligned(source: pa.Table, lake: pa.Table) -> tuple[pa.Table, str]:
    """The lake's columns in the source's order and types (the lake widens some: int16 to int)."""
    missing = [name for name in source.column_names if name not in lake.column_names]
    if missing:
        return lake, f"lake lacks columns {missing}"
    columns = []
    for field in source.schema:
        column = lake.column(field.name)
        if column.type != field.type:
            try:
                column = column.cast(field.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                return lake, f"column {field.name!r}: lake type {column.type} vs source {field.type} ({exc})"
        columns.append(column)
    return pa.table(columns, names=source.column_names), ""


def multiset_difference(source: pa.Table, lake: pa.Table) -> tuple[int, int]:
    """(rows only in ``source``, rows only in ``lake``), counting duplicates."""
    left = Counter(tuple(_hashable(v) for v in row.values()) for row in source.to_pylist())
    right = Counter(tuple(_hashable(v) for v in row.values()) for row in lake.to_pylist())
    return sum((left - right).values()), sum((right - left).values())


def compare_tables(
    conn_params: ConnParams,
    publications: Sequence[str],
    lake: LakeConfig,
    *,
    scratch: str | None = None,
    cut: Cut | None = None,
    transforms: ColumnTransformer | None = None,
) -> list[TableComparison]:
    """Compare every published table with its lake table (now, or as of ``cut``); see the module doc.

    ``transforms``: the pipeline's column transforms, applied to the source's copy the same way (so
    hashed columns compare by their hashes)."""
    slot = f"postgres_cdc_verify_{uuid.uuid4().hex[:12]}"
    staging = scratch or tempfile.mkdtemp(prefix="postgres-cdc-verify-")
    try:
        # A throwaway slot: no standby needs a copy of it.
        path, manifest = take_snapshot(
            conn_params, slot, publications, staging, failover=False, transforms=transforms
        )
    finally:
        conn = connect(conn_params)
        try:
            drop_slot(conn, slot)
        finally:
            conn.close()
    base = path.rsplit("/", 1)[0]
    results = []
    for entry in manifest.tables:
        parts = [pq.read_table(f"{base}/{name}") for name in entry.files]
        # Files differ in the overflow siblings they carry: the union of columns, absent = NULL.
        source = pa.concat_tables(parts, promote_options="default") if parts else pa.table({})
        try:
            lake_rows = read_table(lake, entry.schema, entry.table, cut=cut)
        except Exception as exc:  # a missing table is a finding, not a crash of the check
            results.append(TableComparison(entry.qualified, source.num_rows, 0, source.num_rows, 0, str(exc)))
            continue
        if DELETED_LSN in lake_rows.column_names:
            lake_rows = lake_rows.filter(pc.is_null(lake_rows[DELETED_LSN]))
        source, lake_rows = with_siblings(source, lake_rows)
        aligned, detail = _aligned(source, lake_rows)
        missing, extra = (0, 0) if detail else multiset_difference(source, aligned)
        results.append(
            TableComparison(entry.qualified, source.num_rows, lake_rows.num_rows, missing, extra, detail)
        )
    return results


def format_report(results: Sequence[TableComparison]) -> str:
    """An aligned table: source rows, target rows, equal."""
    width = max([len("table")] + [len(r.table) for r in results])
    lines = [f"{'table':{width}}  {'source rows':>11}  {'lake rows':>11}  equal"]
    for r in results:
        verdict = (
            "yes"
            if r.equal
            else f"NO ({r.detail or f'{r.only_in_source} missing, {r.only_in_target} extra'})"
        )
        lines.append(f"{r.table:{width}}  {r.source_rows:>11}  {r.target_rows:>11}  {verdict}")
    return "\n".join(lines)
