"""Publication and table names that need quoting reach pgoutput intact, on both transports.

pgoutput splits ``publication_names`` as a list of SQL identifiers: unquoted, ``Probe Pub`` is
folded and split in two and the slot's startup callback fails; ``a,b`` becomes two publications.
"""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from airflow_provider_postgres_cdc.engine.drain import DrainSettings, drain_batch
from airflow_provider_postgres_cdc.replication import connect, create_slot
from airflow_provider_postgres_cdc.testing import PostgresCluster

SCHEMA = """
CREATE SCHEMA "My Schema";
CREATE TABLE "My Schema"."v1.2 sales%" (id int PRIMARY KEY, "Prix €" numeric(8, 2));
CREATE TABLE plain (id int PRIMARY KEY);
CREATE PUBLICATION "Probe Pub" FOR TABLE "My Schema"."v1.2 sales%";
CREATE PUBLICATION "a,b" FOR TABLE plain;
"""


@pytest.mark.integration
@pytest.mark.parametrize("transport", ["peek", "stream"])
def test_publication_names_that_need_quoting_drain(
    pg_cluster: PostgresCluster, pg_dbname: str, tmp_path: str, transport: str
) -> None:
    pg_cluster.execute(SCHEMA, pg_dbname)
    conn = connect(pg_cluster.dsn(pg_dbname))
    create_slot(conn, "names")
    conn.close()
    pg_cluster.execute(
        'INSERT INTO "My Schema"."v1.2 sales%" SELECT g, g * 1.5 FROM generate_series(1, 50) g;'
        "INSERT INTO plain SELECT generate_series(1, 7)",
        pg_dbname,
    )
    settings = DrainSettings("names", ("Probe Pub", "a,b"), str(tmp_path), transport=transport)  # type: ignore[arg-type]
    result = drain_batch(pg_cluster.dsn(pg_dbname), settings)
    batch_dir = f"{tmp_path}/names/{result.manifest.batch_id}"
    rows = {
        entry.qualified: sum(pq.ParquetFile(f"{batch_dir}/{f}").metadata.num_rows for f in entry.files)
        for entry in result.manifest.tables
    }
    assert rows == {"My Schema.v1.2 sales%": 50, "public.plain": 7}
