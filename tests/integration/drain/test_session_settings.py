"""The settings the text decoding depends on are set on every connection, never assumed.

The database's defaults are set to the least convenient values PostgreSQL allows; the snapshot
and both drain transports must still stage exact values.
"""

from __future__ import annotations

from datetime import UTC, date, datetime
from decimal import Decimal

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_postgres_cdc.engine.drain import DrainSettings, drain_batch
from airflow_provider_postgres_cdc.engine.snapshot import take_snapshot
from airflow_provider_postgres_cdc.replication import connect, drop_slot
from airflow_provider_postgres_cdc.testing import PostgresCluster

HOSTILE = (
    "SET bytea_output = 'escape'", "SET DateStyle = 'SQL, DMY'", "SET IntervalStyle = 'postgres_verbose'",
    "SET TimeZone = 'Asia/Kathmandu'", "SET extra_float_digits = -3",
)  # fmt: skip
EXPECTED = {
    "id": 1,
    "b": b"\x00\xff\\'",
    "ts": datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=UTC),
    "d": date(2026, 12, 31),
    "f": 1 / 3,
    "n": Decimal("12.50"),
}


def staged_row(directory: str, files: tuple[str, ...]) -> dict[str, object]:
    table = pa.concat_tables([pq.read_table(f"{directory}/{f}") for f in files])
    row = table.to_pylist()[0]
    return {k: row[k] for k in EXPECTED}


@pytest.mark.integration
def test_snapshot_and_drain_stage_exact_values_whatever_the_defaults(
    pg_cluster: PostgresCluster, pg_dbname: str, tmp_path: str
) -> None:
    for setting in HOSTILE:
        pg_cluster.execute(f"ALTER DATABASE {pg_dbname} {setting}", pg_dbname)
    pg_cluster.execute(
        "CREATE TABLE t (id int PRIMARY KEY, b bytea, ts timestamptz, d date, f float8, n numeric(6, 2));"
        "CREATE PUBLICATION pub FOR TABLE t",
        pg_dbname,
    )
    insert = (
        "INSERT INTO t VALUES (1, '\\x00ff5c27'::bytea, '2026-01-02 03:04:05.123456+00', '2026-12-31', "
        "1::float8 / 3, 12.5)"
    )
    pg_cluster.execute(insert, pg_dbname)
    dsn = pg_cluster.dsn(pg_dbname)
    path, manifest = take_snapshot(dsn, "hostile", ["pub"], f"{tmp_path}/staging")
    assert staged_row(path.rsplit("/", 1)[0], manifest.tables[0].files) == EXPECTED
    pg_cluster.execute("DELETE FROM t", pg_dbname)
    pg_cluster.execute(insert, pg_dbname)
    for transport in ("peek", "stream"):
        result = drain_batch(
            dsn, DrainSettings("hostile", ("pub",), f"{tmp_path}/{transport}", transport=transport)
        )  # type: ignore[arg-type]
        batch_dir = result.batch_uri.removeprefix("file://")
        inserted = next(e for e in result.manifest.tables if e.qualified == "public.t")
        table = pa.concat_tables([pq.read_table(f"{batch_dir}/{f}") for f in inserted.files])
        row = next(r for r in table.to_pylist() if r["_pgl_op"] == "I")
        assert {k: row[k] for k in EXPECTED} == EXPECTED, transport
    conn = connect(dsn)
    drop_slot(conn, "hostile")
    conn.close()
