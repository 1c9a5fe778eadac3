"""Column transforms (``column_transforms``) from a real PostgreSQL through staging into the lake.

A hashed column lands as the HMAC of its text form, equal in the snapshot and in every batch (so a
join on a hashed key matches, and a delete or key change of a hashed key finds its row); a dropped
column lands nowhere. No clear value of either is found in staging, the changelog, the lake or the
logs, and a batch hashed under another key is refused before it touches the lake.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import random
import string
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from airflow_provider_postgres_cdc.engine.column_hashing import ColumnTransformer
from airflow_provider_postgres_cdc.engine.drain import DrainSettings, drain_batch
from airflow_provider_postgres_cdc.engine.snapshot import take_snapshot
from airflow_provider_postgres_cdc.engine.verify import compare_tables, format_report
from airflow_provider_postgres_cdc.errors import ColumnTransformsError
from airflow_provider_postgres_cdc.formats.column_transforms import TRANSFORMS_PROPERTY, key_id
from airflow_provider_postgres_cdc.formats.lake import LakeConfig
from airflow_provider_postgres_cdc.replication import advance_slot, connect
from airflow_provider_postgres_cdc.spark.apply_batch import apply_manifest
from airflow_provider_postgres_cdc.testing import PostgresCluster
from tests.integration.spark.iceberg_support import pyiceberg_catalog, table_name

pytestmark = [pytest.mark.integration, pytest.mark.spark]

KEY = b"k3y-0f-the-test-that-is-long-enough"
TRANSFORMS = {
    "public.customers": {"email": "hash", "born": "hash", "bio": "hash", "ssn": "drop", "notes": "drop"},
    "public.orders": {"email": "hash"},
    "public.accounts": {"email": "hash"},  # the primary key: deletes and key changes find rows by it
}
RNG = random.Random(7)
BIO = "".join(RNG.choices(string.ascii_letters, k=6000))  # out of line: 'unchanged' in later updates
NOTES = "".join(RNG.choices(string.ascii_letters, k=6000))
SCHEMA = f"""
CREATE TABLE customers (id int PRIMARY KEY, email text, ssn text, born date, region text, bio text,
                        notes text);
CREATE TABLE orders (id int PRIMARY KEY, email text, amount int);
CREATE TABLE accounts (email text PRIMARY KEY, plan text);
CREATE PUBLICATION pub FOR TABLE customers, orders, accounts;
INSERT INTO customers VALUES (1, 'alice@example.com', '111-22-3333', '1990-01-02', 'eu', '{BIO}', '{NOTES}'),
                             (2, 'bob@example.com', '222-33-4444', '1985-05-06', 'us', 'bob bio', 'n2');
INSERT INTO orders VALUES (10, 'alice@example.com', 5);
INSERT INTO accounts VALUES ('alice@example.com', 'free'), ('bob@example.com', 'pro'),
                            ('carol@example.com', 'free');
"""
WORKLOAD = """
UPDATE customers SET region = 'apac' WHERE id = 1;
INSERT INTO customers VALUES (3, 'carol@example.com', '333-44-5555', '2000-03-04', 'us', 'c bio', 'n3');
INSERT INTO orders VALUES (11, 'carol@example.com', 7), (12, 'bob@example.com', 3);
UPDATE customers SET email = 'alice@new.example.com' WHERE id = 1;
DELETE FROM accounts WHERE email = 'bob@example.com';
UPDATE accounts SET email = 'dave@example.com' WHERE email = 'carol@example.com';
UPDATE accounts SET plan = 'pro' WHERE email = 'alice@example.com';
"""
SECRETS = [
    *(
        "alice@example.com",
        "bob@example.com",
        "carol@example.com",
        "dave@example.com",
        "alice@new.example.com",
    ),
    *("111-22-3333", "222-33-4444", "333-44-5555", "1990-01-02", "1985-05-06", "2000-03-04"),
    *(BIO[:40], NOTES[:40], "bob bio", "c bio"),
]


def _hash(text: str) -> str:
    return hmac.new(KEY, text.encode(), hashlib.sha256).hexdigest()


def _values(value: Any) -> Iterator[str]:
    """Every text in a nested value, as text."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield str(key)
            yield from _values(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _values(item)
    elif value is not None:
        yield value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _texts_of(table: pa.Table) -> Iterator[str]:
    for name in table.column_names:
        yield name
        yield from _values(table.column(name).to_pylist())


def _source(cluster: PostgresCluster, db: str, query: str) -> list[tuple[Any, ...]]:
    conn = connect(cluster.dsn(db))
    try:
        with conn.cursor() as cur:
            cur.execute(query)
            return sorted(cur.fetchall())
    finally:
        conn.close()


def _lake(config: LakeConfig, table: str, changelog: bool = False) -> pa.Table:
    identifier = (
        config.changelog_identifier("public", table) if changelog else config.identifier("public", table)
    )
    return pyiceberg_catalog(config).load_table(identifier).scan().to_arrow()


def test_hashed_and_dropped_columns_never_land_in_clear_and_hashes_join_across_snapshot_and_batches(
    pg_cluster: PostgresCluster,
    pg_dbname: str,
    spark: SparkSession,
    lake_config: LakeConfig,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    for logger in ("airflow_provider_postgres_cdc", "postgres_cdc"):  # the engine's and the job's
        caplog.set_level(logging.DEBUG, logger=logger)
    dsn, staging = pg_cluster.dsn(pg_dbname), tmp_path / "staging"
    pg_cluster.execute(SCHEMA, pg_dbname)
    transforms = ColumnTransformer(TRANSFORMS, KEY)
    path, snapshot = take_snapshot(dsn, "s", ["pub"], str(staging), transforms=transforms)
    apply_manifest(spark, path, lake_config)
    pg_cluster.execute(WORKLOAD, pg_dbname)
    batch = drain_batch(dsn, DrainSettings("s", ("pub",), str(staging), transforms=transforms))
    apply_manifest(spark, batch.manifest_uri, lake_config)

    # The lake holds each source row with the hashed columns' HMACs and without the dropped ones.
    customers = _lake(lake_config, "customers")
    assert set(customers.column_names) >= {"id", "email", "born", "region", "bio"}
    assert not {"ssn", "notes"} & set(customers.column_names)
    lake_rows = sorted(
        zip(*(customers.column(c).to_pylist() for c in ("id", "email", "born", "region", "bio")), strict=True)
    )
    source = _source(pg_cluster, pg_dbname, "SELECT id, email, born::text, region, bio FROM customers")
    assert lake_rows == [(i, _hash(e), _hash(b), r, _hash(bio)) for i, e, b, r, bio in source]
    accounts = _lake(lake_config, "accounts")
    assert sorted(
        zip(accounts.column("email").to_pylist(), accounts.column("plan").to_pylist(), strict=True)
    ) == (
        sorted((_hash(e), p) for e, p in _source(pg_cluster, pg_dbname, "SELECT email, plan FROM accounts"))
    )
    # A join on the hashed key matches exactly as the source's join on the clear one.
    orders, customers_name = (
        table_name(lake_config, lake_config.identifier("public", t)) for t in ("orders", "customers")
    )
    joined = spark.sql(
        f"SELECT o.id, c.id FROM {orders} o JOIN {customers_name} c ON o.email = c.email"
    ).collect()
    assert (
        sorted(tuple(r) for r in joined)
        == _source(pg_cluster, pg_dbname, "SELECT o.id, c.id FROM orders o JOIN customers c USING (email)")
        == [(11, 3), (12, 2)]
    )

    # What the tables record: the transforms and the key's identifier, never the key.
    for manifest in (snapshot, batch.manifest):
        customers_spec = next(t for t in manifest.tables if t.table == "customers")
        recorded = json.loads(customers_spec.column_transforms)
        assert recorded == {
            "columns": dict(sorted(TRANSFORMS["public.customers"].items())),
            "key_id": key_id(KEY),
        }
        assert not {"ssn", "notes"} & {c.name for c in customers_spec.columns}
    properties = (
        pyiceberg_catalog(lake_config).load_table(lake_config.identifier("public", "customers")).properties
    )
    assert properties[TRANSFORMS_PROPERTY] == customers_spec.column_transforms

    # No clear value anywhere: staged files and manifests, the lake tables and changelogs, the logs.
    found: list[str] = []
    for file in staging.rglob("*"):
        if file.suffix == ".parquet":
            found += _texts_of(pq.read_table(file))
        elif file.is_file():
            found.append(file.read_text(errors="replace"))
    for table in ("customers", "orders", "accounts"):
        found += [
            *_texts_of(_lake(lake_config, table)),
            *_texts_of(_lake(lake_config, table, changelog=True)),
        ]
    found += [record.getMessage() for record in caplog.records]
    text = "\n".join(found)
    assert _hash("alice@example.com") in text  # the check reads what landed
    leaked = [secret for secret in [*SECRETS, KEY.decode()] if secret in text]
    assert leaked == []

    # The source copied under the same transforms equals the lake, table by table.
    results = compare_tables(dsn, ["pub"], lake_config, transforms=transforms)
    assert all(result.equal for result in results), format_report(results)

    # A hashed column dropped from the source, and from the option: no re-snapshot is needed.
    conn = connect(dsn)
    advance_slot(conn, "s", batch.manifest.end_lsn)  # what the ack does
    conn.close()
    pg_cluster.execute("ALTER TABLE customers DROP COLUMN born; UPDATE customers SET region = 'x'", pg_dbname)
    with pytest.raises(ColumnTransformsError, match=r"names 'born', which the publication does not publish"):
        drain_batch(dsn, DrainSettings("s", ("pub",), str(staging), transforms=transforms))
    without_born = {
        **TRANSFORMS,
        "public.customers": {"email": "hash", "bio": "hash", "ssn": "drop", "notes": "drop"},
    }
    transforms = ColumnTransformer(without_born, KEY)
    dropped = drain_batch(dsn, DrainSettings("s", ("pub",), str(staging), transforms=transforms))
    apply_manifest(spark, dropped.manifest_uri, lake_config)
    assert set(_lake(lake_config, "customers").column("region").to_pylist()) == {"x"}
    conn = connect(dsn)
    advance_slot(conn, "s", dropped.manifest.end_lsn)
    conn.close()

    # A batch hashed under another key is refused before it touches the lake.
    pg_cluster.execute("INSERT INTO orders VALUES (13, 'alice@new.example.com', 1)", pg_dbname)
    other = ColumnTransformer(without_born, b"another-key-that-is-long-enough")
    rehashed = drain_batch(dsn, DrainSettings("s", ("pub",), str(staging), transforms=other))
    assert not rehashed.reused
    with pytest.raises(
        ColumnTransformsError, match=r"public\.orders holds rows staged under .*postgres_cdc_backfill"
    ):
        apply_manifest(spark, rehashed.manifest_uri, lake_config)
    assert sorted(_lake(lake_config, "orders").column("id").to_pylist()) == [10, 11, 12]
