"""The pipeline's index of its tables: the apply job writes it, and the job's cut and maintenance
(``IcebergTables.owned_tables``) and the Airflow side (``lake_catalog.owned_tables``: the ack's cut,
the report, lineage) find the same tables through it, among tables of other teams and pipelines.

Mostly on SeaweedFS's Iceberg REST catalog, whose naming rules are the strictest (lowercase
letters, digits, ``_`` and ``-``): the index's own names must pass there. The job runs in-process
in the shared Spark session (``apply_manifest``), as the other apply tests do.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from airflow_provider_postgres_cdc.engine.lake_catalog import cut_at, latest_cut, open_catalog, owned_tables
from airflow_provider_postgres_cdc.formats import lake_index
from airflow_provider_postgres_cdc.formats.lake import LakeConfig, tag_name
from airflow_provider_postgres_cdc.formats.lsn import Lsn
from airflow_provider_postgres_cdc.spark import apply_batch as job
from airflow_provider_postgres_cdc.spark.iceberg import IcebergTables
from airflow_provider_postgres_cdc.spark.session import register_lake
from airflow_provider_postgres_cdc.testing import S3Server
from tests.integration.spark.spark_staging import Stager, TableDef, ins

SLOT, OTHER = "shop_cdc", "other_cdc"
S0 = 0x3000_0000
A = TableDef("public", "a", [("id", pa.int64()), ("name", pa.string())], ["id"])
B = TableDef("public", "b", [("id", pa.int64()), ("name", pa.string())], ["id"])
C = TableDef("public", "c", [("id", pa.int64()), ("name", pa.string())], ["id"])


def _rows(n: int) -> list[dict[str, Any]]:
    return [{"id": i, "name": f"n{i}"} for i in range(n)]


@pytest.fixture(scope="module")
def rest_server() -> Iterator[S3Server]:
    with S3Server(buckets=["staging"], table_buckets=["lake"]) as server:
        yield server


@pytest.fixture
def rest(spark: SparkSession, rest_server: S3Server) -> LakeConfig:
    """The REST catalog under a fresh Spark catalog name, with a namespace prefix of its own (the
    server's catalog is shared by the module's tests), and the name rule such catalogs call for."""
    tag = uuid.uuid4().hex[:8]
    properties = rest_server.rest_catalog_properties("lake")
    config = LakeConfig(f"rest_{tag}", properties, namespace_prefix=f"t{tag}_", names="portable")
    register_lake(spark, config)
    return config


def _job_side(spark: SparkSession, config: LakeConfig, slot: str) -> list[tuple[str, str]]:
    return IcebergTables(spark, config).owned_tables(slot)


def _airflow_side(config: LakeConfig, slot: str) -> list[tuple[str, str]]:
    return [tuple(table.name()[-2:]) for table in owned_tables(open_catalog(config), config, slot)]  # type: ignore[misc]


def _index_rows(config: LakeConfig, slot: str) -> int:
    index = open_catalog(config).load_table(lake_index.index_identifier(config, slot))
    return int(index.scan().to_arrow().num_rows)


def _identifier(config: LakeConfig, tdef: TableDef) -> tuple[str, str]:
    return config.identifier(tdef.schema, tdef.table)


def test_both_sides_find_the_pipelines_tables_among_foreign_ones(
    spark: SparkSession, rest: LakeConfig, tmp_path: Path
) -> None:
    catalog = open_catalog(rest)
    for schema in ("public", "team_x"):
        catalog.create_namespace(rest.namespace(schema))
        for i in range(5):  # other teams' tables, beside ours and in a namespace of their own
            catalog.create_table((rest.namespace(schema), f"foreign_{i}"), pa.schema([("id", pa.int64())]))
    ours, theirs = Stager(tmp_path / "staging", SLOT), Stager(tmp_path / "staging", OTHER)
    job.apply_manifest(spark, theirs.snapshot(S0, [(C, _rows(2))]), rest)
    job.apply_manifest(spark, ours.snapshot(S0, [(A, _rows(3)), (B, _rows(2))]), rest)
    end = S0 + 0x100
    job.apply_manifest(spark, ours.batch(S0, end, [(A, [[ins(S0 + 0x10, 0, id=7, name="x")]])]), rest)

    expected = [_identifier(rest, A), _identifier(rest, B)]
    assert _job_side(spark, rest, SLOT) == _airflow_side(rest, SLOT) == expected
    assert _job_side(spark, rest, OTHER) == _airflow_side(rest, OTHER) == [_identifier(rest, C)]
    assert _index_rows(rest, SLOT) == 2  # the batch found both tables registered: nothing appended
    # The job tagged the batch's cut on every table it found; the ack's and the report's reads agree.
    assert set(cut_at(rest, SLOT, Lsn(end)).snapshots) == set(expected)
    latest = latest_cut(rest, SLOT)
    assert latest is not None and latest.tag == tag_name(Lsn(end)) and set(latest.snapshots) == set(expected)


def test_a_dropped_table_is_skipped_until_its_reload_and_then_found_once(
    spark: SparkSession, rest: LakeConfig, tmp_path: Path
) -> None:
    stager = Stager(tmp_path / "staging", SLOT)
    job.apply_manifest(spark, stager.snapshot(S0, [(A, _rows(3)), (B, _rows(2))]), rest)
    open_catalog(rest).drop_table(_identifier(rest, B))
    assert _job_side(spark, rest, SLOT) == _airflow_side(rest, SLOT) == [_identifier(rest, A)]
    end = S0 + 0x100
    job.apply_manifest(spark, stager.batch(S0, end, [(A, [[ins(S0 + 0x10, 0, id=9, name="y")]])]), rest)
    assert set(cut_at(rest, SLOT, Lsn(end)).snapshots) == {_identifier(rest, A)}  # cut over what exists
    job.apply_manifest(spark, stager.snapshot(end, [(B, _rows(4))]), rest)  # B re-snapshotted
    expected = [_identifier(rest, A), _identifier(rest, B)]
    assert _job_side(spark, rest, SLOT) == _airflow_side(rest, SLOT) == expected
    assert _index_rows(rest, SLOT) == 2


def test_jobs_registering_at_once_all_land(spark: SparkSession, rest: LakeConfig) -> None:
    """Several jobs creating the slot's index and appending to it at the same moment: none is lost.

    The index's namespace exists beforehand: SeaweedFS (4.48) answers a namespace check made while
    another client creates that namespace with an internal error ("attribute not found"), which
    fails the job loudly, before it commits anything.
    """
    wanted = [(rest.namespace("public"), f"t{i}") for i in range(4)]
    errors: list[BaseException] = []
    open_catalog(rest).create_namespace(lake_index.index_namespace(rest))
    tables = IcebergTables(spark, rest)  # the catalog loaded once: Spark loads it lazily, not thread-safely

    def register(identifier: tuple[str, str]) -> None:
        try:
            tables.register(SLOT, [identifier])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=register, args=(identifier,)) for identifier in wanted]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == [], [str(e)[:1000] for e in errors]
    assert IcebergTables(spark, rest).indexed(SLOT) == sorted(wanted)


def test_hostile_source_names_are_indexed_as_the_catalog_stores_them(
    spark: SparkSession, lake_config: LakeConfig, tmp_path: Path
) -> None:
    """The SQLite catalog takes any name: the index holds the lake's names, found back by both sides."""
    hostile = TableDef("My Schema.eu", "v1.2 sales%", [("Order ID", pa.int64())], ["Order ID"])
    job.apply_manifest(spark, Stager(tmp_path / "staging", SLOT).snapshot(S0, [(hostile, [{"Order ID": 1}])]),
                       lake_config)  # fmt: skip
    expected = [_identifier(lake_config, hostile)]
    assert _job_side(spark, lake_config, SLOT) == _airflow_side(lake_config, SLOT) == expected
