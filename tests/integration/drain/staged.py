"""Reading back what a drain staged, for tests that compare batches."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from airflow_provider_postgres_cdc.engine.drain import DrainResult


def staged_tables(result: DrainResult) -> dict[str, pa.Table]:
    """Every staged table of a batch, its relation versions concatenated, in change order."""
    root = Path(result.batch_uri.removeprefix("file://"))
    tables = {}
    for entry in result.manifest.tables:
        parts = [pq.read_table(root / f) for f in entry.files]
        table = pa.concat_tables(parts, promote_options="default")
        tables[entry.qualified] = table.sort_by([("_pgl_commit_lsn", "ascending"), ("_pgl_seq", "ascending")])
    return tables
