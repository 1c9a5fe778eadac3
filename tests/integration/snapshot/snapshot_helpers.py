"""Helpers for snapshot tests: read what a snapshot staged, and what the source says it should be."""

from __future__ import annotations

import math
import posixpath
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from airflow_provider_postgres_cdc.formats.manifest import Manifest, TableManifest
from airflow_provider_postgres_cdc.testing import PostgresCluster
from airflow_provider_postgres_cdc.values.arrow_types import text_to_arrow


def staged_table(manifest_path: str, entry: TableManifest) -> pa.Table:
    """Every staged row of one table, read from exactly the files its manifest entry lists."""
    batch_dir = posixpath.dirname(manifest_path)
    tables = [pq.read_table(posixpath.join(batch_dir, name)) for name in entry.files]
    assert tables, f"{entry.qualified} has no staged file"
    return pa.concat_tables(tables, promote_options="default")  # files may differ in overflow siblings


def source_rows(pg: PostgresCluster, dbname: str, entry: TableManifest, query: str) -> pa.Table:
    """Run ``query`` (its columns in manifest order, cast to text) and type it like the snapshot."""
    rows = pg.execute(query, dbname)
    arrays = []
    for i, column in enumerate(entry.columns):
        texts = pa.array([row[i] for row in rows], pa.string())
        arrays.append(text_to_arrow(texts, column.type_oid, column.typmod))
    return pa.Table.from_arrays(arrays, names=[c.name for c in entry.columns])


def _comparable(value: Any) -> Any:
    # NaN never equals itself; compare it as a marker so NaN rows can be checked at all.
    return "<NaN>" if isinstance(value, float) and math.isnan(value) else value


def sorted_rows(table: pa.Table) -> list[dict[str, Any]]:
    """The rows as dicts, in a stable order, with NaN made comparable."""
    rows = [{key: _comparable(value) for key, value in row.items()} for row in table.to_pylist()]
    return sorted(rows, key=lambda row: [repr(value) for value in row.values()])


def peek_inserts(pg: PostgresCluster, dbname: str, slot: str, publication: str) -> int:
    """Insert messages (``'I'``) the slot would stream now, without consuming them."""
    rows = pg.execute(
        "SELECT count(*) FILTER (WHERE get_byte(data, 0) = 73) FROM pg_logical_slot_peek_binary_changes("
        f"'{slot}', NULL, NULL, 'proto_version', '1', 'publication_names', '{publication}')",
        dbname,
    )
    return int(rows[0][0])


def load_manifest(path: str) -> Manifest:
    with open(path, encoding="utf-8") as handle:
        return Manifest.from_json(handle.read())
