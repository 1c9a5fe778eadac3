"""What the Iceberg lake promises beyond the apply algebra: other readers, cuts, catalogs, bad input.

The lake is read by tools that are not the job (pyiceberg, time travel by tag), so these tests
check the tables as Iceberg tables, not just as Spark sees them right after a run.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession
from pyspark.sql.types import DecimalType, LongType

from airflow_provider_postgres_cdc import errors
from airflow_provider_postgres_cdc.formats.lake import LakeConfig, local_lake, tag_name
from airflow_provider_postgres_cdc.formats.lsn import Lsn
from airflow_provider_postgres_cdc.spark import apply_batch as job
from airflow_provider_postgres_cdc.spark.session import register_lake
from airflow_provider_postgres_cdc.testing import PostgresCluster
from tests.integration.spark.iceberg_support import LakeReader, pyiceberg_catalog
from tests.integration.spark.spark_staging import (
    Change,
    Row,
    Stager,
    TableDef,
    dele,
    ins,
    model_apply,
    rows_of,
    upd,
)

S0 = 0x2000_0000
Table = dict[tuple[Any, ...], Row]

# Names a SQL parser, a dotted identifier or a percent-decoder would get wrong.
HOSTILE_COLUMNS = [("Order ID", pa.int64()), ("prix €", pa.decimal128(10, 2)), ("Note", pa.string())]
A = TableDef("public", "a", [("id", pa.int64()), ("name", pa.string())], ["id"])
B = TableDef("public", "b", [("id", pa.int64()), ("name", pa.string())], ["id"])


def _hostile(i: int, note: str = "n") -> Row:
    return {"Order ID": i, "prix €": Decimal(f"{i}.50"), "Note": f"{note} {i}"}


def _named(i: int, name: str = "n") -> Row:
    return {"id": i, "name": f"{name}{i}"}


class History:
    """Every table's rows at the snapshot plus each staged change: the source at any LSN."""

    def __init__(self, tables: list[tuple[TableDef, list[Row]]]) -> None:
        self.initial: dict[str, Table] = {
            t.dirname: {t.key_of(r): dict(r) for r in rows} for t, rows in tables
        }
        self.tdefs = {t.dirname: t for t, _ in tables}
        self.log: dict[str, list[Change]] = {t.dirname: [] for t, _ in tables}

    def record(self, tdef: TableDef, changes: list[Change]) -> list[Change]:
        self.log[tdef.dirname] += changes
        return changes

    def at(self, tdef: TableDef, lsn: int) -> list[tuple[Any, ...]]:
        table = copy.deepcopy(self.initial[tdef.dirname])
        model_apply(tdef, table, [c for c in self.log[tdef.dirname] if c.commit_lsn < lsn], 0)
        return rows_of(table, tdef.names)


def _arrow_rows(config: LakeConfig, tdef: TableDef) -> list[tuple[Any, ...]]:
    """The table as pyiceberg reads it with its own catalog client and file reader (no Spark)."""
    table = pyiceberg_catalog(config).load_table(config.identifier(tdef.schema, tdef.table))
    return sorted((tuple(r[n] for n in tdef.names) for r in table.scan().to_arrow().to_pylist()), key=repr)


@pytest.mark.parametrize(
    "schema",
    [
        "public",
        "My Schema",
    ],
)
def test_pyiceberg_reads_what_the_job_wrote_under_hostile_names(
    spark: SparkSession, lake_config: LakeConfig, tmp_path: Path, schema: str
) -> None:
    """Another Iceberg client finds the tables by the lake's naming rule and applies their deletes."""
    HOSTILE = TableDef(schema, "v1.2 sales%", HOSTILE_COLUMNS, ["Order ID"])  # noqa: N806
    lake, stager = LakeReader(spark, lake_config), Stager(tmp_path / "staging")
    history = History([(HOSTILE, [_hostile(i) for i in range(6)])])
    job.apply_manifest(spark, stager.snapshot(S0, [(HOSTILE, [_hostile(i) for i in range(6)])]), lake_config)
    assert _arrow_rows(lake_config, HOSTILE) == lake.rows(HOSTILE) == history.at(HOSTILE, S0)
    end = S0 + 500
    changes = history.record(
        HOSTILE,
        [
            upd(S0 + 100, 0, **_hostile(1, "é")),
            dele(S0 + 200, 0, **{"Order ID": 2}),
            ins(S0 + 300, 0, **_hostile(9, "new")),
            upd(S0 + 400, 0, old={"Order ID": 3}, **_hostile(30, "moved")),
        ],
    )
    job.apply_manifest(spark, stager.batch(S0, end, [(HOSTILE, [changes])]), lake_config)
    deletes = spark.sql(f"SELECT count(*) FROM {lake.name(HOSTILE)}.files WHERE content = 1").first()
    assert deletes is not None and deletes[0] >= 1  # merge-on-read: readers must apply delete files
    assert _arrow_rows(lake_config, HOSTILE) == lake.rows(HOSTILE) == history.at(HOSTILE, end)
    changelog = pyiceberg_catalog(lake_config).load_table(
        lake_config.changelog_identifier(HOSTILE.schema, HOSTILE.table)
    )
    assert changelog.scan().to_arrow().num_rows == len(changes)


def test_every_cut_reads_the_source_at_its_batch_end_across_tables(
    spark: SparkSession, lake_config: LakeConfig, tmp_path: Path
) -> None:
    """Each batch's tag is a consistent cut over every table, and later batches do not move it."""
    lake, stager = LakeReader(spark, lake_config), Stager(tmp_path / "staging")
    initial = [(A, [_named(i) for i in range(4)]), (B, [_named(i, "b") for i in range(3)])]
    history = History(initial)
    job.apply_manifest(spark, stager.snapshot(S0, initial), lake_config)
    e1, e2, e3 = S0 + 1000, S0 + 2000, S0 + 3000
    batches = [
        (S0, e1, [(A, [upd(S0 + 100, 0, **_named(1, "x")), ins(S0 + 200, 0, **_named(7))]),
                  (B, [dele(S0 + 150, 0, id=0)])]),
        (e1, e2, [(A, [dele(e1 + 100, 0, id=2), upd(e1 + 200, 0, **_named(7, "y"))])]),  # A only
        (e2, e3, [(A, [ins(e2 + 100, 0, **_named(8))]), (B, [upd(e2 + 200, 0, **_named(1, "z"))])]),
    ]  # fmt: skip
    cuts = [S0]
    for start, end, tables in batches:
        staged = [(tdef, [history.record(tdef, changes)]) for tdef, changes in tables]
        job.apply_manifest(spark, stager.batch(start, end, staged), lake_config)
        cuts.append(end)
        for cut in cuts:  # the new cut, and every earlier one still as it was
            for tdef in (A, B):
                assert lake.rows(tdef, tag=tag_name(Lsn(cut))) == history.at(tdef, cut), (tdef.table, cut)
    assert lake.has_cut(B, e2)  # the batch that did not touch B tagged it too
    assert lake.tags(B)[tag_name(Lsn(e2))] == lake.tags(B)[tag_name(Lsn(e1))]


@pytest.fixture
def pg_catalog_db(pg_cluster: PostgresCluster) -> Iterator[str]:
    name = "iceberg_catalog"
    pg_cluster.create_database(name)
    yield name
    pg_cluster.drop_database(name)


@pytest.mark.integration
def test_a_postgresql_jdbc_catalog_holds_the_lake(
    spark: SparkSession, pg_cluster: PostgresCluster, pg_catalog_db: str, tmp_path: Path
) -> None:
    """The production catalog shape: Iceberg's JDBC catalog in a PostgreSQL database."""
    config = LakeConfig(
        catalog=f"pglake_{uuid.uuid4().hex[:8]}",
        properties={
            "type": "jdbc",
            "uri": f"jdbc:postgresql://{pg_cluster.host}:{pg_cluster.port}/{pg_catalog_db}",
            "jdbc.user": pg_cluster.superuser,
            "warehouse": str(tmp_path / "warehouse"),
        },
    )
    register_lake(spark, config)
    lake, stager = LakeReader(spark, config), Stager(tmp_path / "staging")
    history = History([(A, [_named(i) for i in range(3)])])
    job.apply_manifest(spark, stager.snapshot(S0, [(A, [_named(i) for i in range(3)])]), config)
    end = S0 + 500
    changes = history.record(A, [upd(S0 + 100, 0, **_named(0, "u")), ins(S0 + 200, 0, **_named(5))])
    assert [r.status for r in job.apply_manifest(spark, stager.batch(S0, end, [(A, [changes])]), config)] == [
        "applied"
    ]
    assert lake.rows(A) == history.at(A, end)
    assert lake.state(A).applied_end_lsn == Lsn(end)
    assert lake.rows(A, tag=tag_name(Lsn(end))) == history.at(A, end)


def test_a_catalog_spark_does_not_know_is_refused_by_name(spark: SparkSession, tmp_path: Path) -> None:
    manifest = str(tmp_path / "_manifest.json")  # never read: the catalog is checked first
    unknown = LakeConfig(catalog=f"nowhere_{uuid.uuid4().hex[:8]}")
    with pytest.raises(errors.CatalogError, match=rf"Spark has no catalog '{unknown.catalog}'"):
        job.apply_manifest(spark, manifest, unknown)
    unreachable = local_lake(str(tmp_path / "missing" / "dir"), catalog=f"broken_{uuid.uuid4().hex[:8]}")
    register_lake(spark, unreachable)
    with pytest.raises(errors.CatalogError, match=rf"cannot reach Iceberg catalog '{unreachable.catalog}'"):
        job.apply_manifest(spark, manifest, unreachable)


STOCK = TableDef(
    "public",
    "stock",
    [("id", pa.int64()), ("label", pa.string()), ("qty", pa.int32()), ("price", pa.decimal128(10, 2))],
    ["id"],
)


def _stock(i: int) -> Row:
    return {"id": i, "label": f"l{i}", "qty": i, "price": Decimal(f"{i}.10")}


def test_a_type_widening_is_applied_and_widens_the_lake_column(
    spark: SparkSession, lake_config: LakeConfig, tmp_path: Path
) -> None:
    """int -> bigint and decimal(10,2) -> decimal(12,2) are Iceberg promotions: no re-snapshot needed."""
    lake, stager = LakeReader(spark, lake_config), Stager(tmp_path / "staging")
    rows = [_stock(i) for i in range(3)]
    history = History([(STOCK, rows)])
    job.apply_manifest(spark, stager.snapshot(S0, [(STOCK, rows)]), lake_config)
    wider = TableDef(
        "public",
        "stock",
        [("id", pa.int64()), ("label", pa.string()), ("qty", pa.int64()), ("price", pa.decimal128(12, 2))],
        ["id"],
    )
    end = S0 + 1000
    changes = history.record(
        STOCK,
        [
            ins(S0 + 100, 0, id=7, label="big", qty=2**40, price=Decimal("1234567890.12")),
            upd(S0 + 200, 0, id=1, label="l1", qty=-(2**35), price=Decimal("9999999999.99")),
        ],
    )
    job.apply_manifest(spark, stager.batch(S0, end, [(wider, [changes])]), lake_config)
    schema = spark.table(lake.name(STOCK)).schema
    assert (schema["qty"].dataType, schema["price"].dataType) == (LongType(), DecimalType(12, 2))
    assert lake.rows(STOCK) == history.at(STOCK, end)
    assert lake.state(STOCK).applied_end_lsn == Lsn(end)


def test_an_incompatible_type_change_is_refused_without_a_trace(
    spark: SparkSession, lake_config: LakeConfig, tmp_path: Path
) -> None:
    """A text column restaged as bigint in a running pipeline: refused by name, nothing recorded."""
    lake, stager = LakeReader(spark, lake_config), Stager(tmp_path / "staging")
    job.apply_manifest(spark, stager.snapshot(S0, [(STOCK, [_stock(i) for i in range(3)])]), lake_config)
    e1 = S0 + 500
    job.apply_manifest(spark, stager.batch(S0, e1, [(STOCK, [[ins(S0 + 100, 0, **_stock(5))]])]), lake_config)
    before, logged = lake.current(STOCK), lake.changelog(STOCK)
    relabeled = TableDef("public", "stock", [("id", pa.int64()), ("label", pa.int64())], ["id"])
    bad = stager.batch(e1, e1 + 500, [(relabeled, [[ins(e1 + 100, 0, id=9, label=5)]])])
    with pytest.raises(errors.SchemaConflictError, match=r"column 'label' changed type .*re-snapshot"):
        job.apply_manifest(spark, bad, lake_config)
    assert lake.current(STOCK) == before
    assert lake.state(STOCK).applied_end_lsn == Lsn(e1)
    assert lake.changelog(STOCK) == logged
