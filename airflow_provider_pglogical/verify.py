"""Check that lake tables equal their PostgreSQL sources (DESIGN invariant 5), row for row.

The source side is read the way the initial snapshot reads it (same column lists, row filters
and type mapping) through a throwaway slot's exported snapshot, staged to a scratch directory;
the target side is read with the apply job's :func:`read_table`. Spark compares them with
``exceptAll`` in both directions, so duplicates count too. Run it when the source is quiet
(or compare against the LSN the last batch ended at): a busy source is ahead of the lake.
"""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as sf

from airflow_provider_pglogical.replication import connect, drop_slot
from airflow_provider_pglogical.replication.connection import ConnParams
from airflow_provider_pglogical.snapshot import take_snapshot
from airflow_provider_pglogical.spark.apply_batch import read_table


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


def _aligned(source: DataFrame, target: DataFrame) -> tuple[DataFrame, DataFrame, str]:
    """Both sides with the source's columns in its order, the target cast to the source's types."""
    missing = [c for c in source.columns if c not in target.columns]
    if missing:
        return source, target, f"target lacks columns {missing}"
    types = dict(target.dtypes)
    target = target.select(
        *[sf.col(f"`{c}`") if types[c] == t else sf.col(f"`{c}`").cast(t).alias(c) for c, t in source.dtypes]
    )
    return source, target, ""


def compare_tables(
    spark: SparkSession,
    conn_params: ConnParams,
    publications: Sequence[str],
    target: str,
    *,
    scratch: str | None = None,
) -> list[TableComparison]:
    """Compare every published table with its lake table; see the module docstring."""
    slot = f"pglogical_verify_{uuid.uuid4().hex[:12]}"
    staging = scratch or tempfile.mkdtemp(prefix="pglogical-verify-")
    try:
        path, manifest = take_snapshot(conn_params, slot, publications, staging)
    finally:
        conn = connect(conn_params)
        try:
            drop_slot(conn, slot)
        finally:
            conn.close()
    base = path.rsplit("/", 1)[0]
    results = []
    for entry in manifest.tables:
        files = [f"{base}/{name}" for name in entry.files]
        source = spark.read.parquet(*files)
        try:
            lake = read_table(spark, target, entry.schema, entry.table)
        except Exception as exc:  # a missing table is a finding, not a crash of the check
            results.append(TableComparison(entry.qualified, source.count(), 0, source.count(), 0, str(exc)))
            continue
        source, lake, detail = _aligned(source, lake)
        results.append(
            TableComparison(
                entry.qualified,
                source.count(),
                lake.count(),
                0 if detail else source.exceptAll(lake).count(),
                0 if detail else lake.exceptAll(source).count(),
                detail,
            )
        )
    return results


def format_report(results: Sequence[TableComparison]) -> str:
    """An aligned table: source rows, target rows, equal."""
    width = max([len("table")] + [len(r.table) for r in results])
    lines = [f"{'table':{width}}  {'source rows':>11}  {'target rows':>11}  equal"]
    for r in results:
        verdict = (
            "yes"
            if r.equal
            else f"NO ({r.detail or f'{r.only_in_source} missing, {r.only_in_target} extra'})"
        )
        lines.append(f"{r.table:{width}}  {r.source_rows:>11}  {r.target_rows:>11}  {verdict}")
    return "\n".join(lines)
