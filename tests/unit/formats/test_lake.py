"""The lake's vocabulary (lake.py), its pyiceberg translation (lake_catalog.py) and its connection hook."""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path

import pytest

from airflow_provider_postgres_cdc.engine.lake_catalog import (
    open_catalog,
    pyiceberg_properties,
    sqlalchemy_url,
)
from airflow_provider_postgres_cdc.errors import LakeCatalogError, LakeConfigError
from airflow_provider_postgres_cdc.formats import lake
from airflow_provider_postgres_cdc.formats.lake import LakeConfig, iceberg_runtime_problem, local_lake
from airflow_provider_postgres_cdc.formats.lsn import Lsn
from airflow_provider_postgres_cdc.hooks.lake import PostgresCdcLakeHook, connection_json


def pipeline(applied: str, base: str = "0/10", batch: str = "b") -> dict[str, str]:
    return {lake.APPLIED_END_LSN: applied, lake.BASE_LSN: base, lake.BATCH_ID: batch, lake.SLOT: "s"}


MAINTENANCE: dict[str, str] = {"added-data-files": "1"}  # a compaction: no pipeline keys


def test_namespaces_keep_one_level_whatever_the_schema_name() -> None:
    config = LakeConfig(namespace_prefix="pg_")
    assert config.identifier("My Schema", "v1.2 sales%") == ("pg_My Schema", "v1.2 sales%")
    assert config.namespace("a.b%c") == "pg_a%2Eb%25c"
    assert config.changelog_identifier("public", "t") == ("pg_public", "t__pgl_changelog")


def test_spark_conf_registers_the_catalog_with_its_properties() -> None:
    conf = local_lake("/data/lake").spark_conf()
    assert conf["spark.sql.catalog.lake"] == lake.SPARK_CATALOG_CLASS
    assert conf["spark.sql.catalog.lake.uri"] == "jdbc:sqlite:/data/lake/catalog.db"
    assert conf["spark.sql.catalog.lake.jdbc.schema-version"] == "V1"
    assert conf["spark.sql.catalog.lake.cache-enabled"] == "false"
    assert conf["spark.sql.extensions"] == lake.SPARK_EXTENSIONS


def test_a_sqlite_catalog_waits_for_other_writers_and_leaves_its_tables_to_the_job() -> None:
    conf = local_lake("/data/lake").spark_conf()
    assert conf["spark.sql.catalog.lake.jdbc.busy_timeout"] == str(lake.SQLITE_BUSY_TIMEOUT_MS)
    assert conf["spark.sql.catalog.lake.jdbc.init-catalog-tables"] == "false"
    own = LakeConfig("lake", {"type": "jdbc", "uri": "jdbc:sqlite:/c.db", "jdbc.busy_timeout": "500"})
    assert own.spark_conf()["spark.sql.catalog.lake.jdbc.busy_timeout"] == "500"  # the lake's own wins
    postgres = LakeConfig("lake", {"type": "jdbc", "uri": "jdbc:postgresql://db/ice"}).spark_conf()
    assert not any(key.endswith(("busy_timeout", "init-catalog-tables")) for key in postgres)


@pytest.mark.parametrize("name", ["", "my-lake", "lake.x", "la ke"])
def test_catalog_names_spark_cannot_key_are_refused(name: str) -> None:
    with pytest.raises(LakeConfigError, match="letters, digits and underscores"):
        LakeConfig(catalog=name)


def test_config_round_trips_and_rejects_unknown_settings() -> None:
    config = LakeConfig("lake", {"type": "rest", "uri": "http://x"}, "p_")
    assert LakeConfig.from_json(config.to_json()) == config
    with pytest.raises(LakeConfigError, match="unknown lake setting"):
        LakeConfig.from_mapping({"catalog": "lake", "warehouse": "/x"})
    with pytest.raises(LakeConfigError, match="not valid JSON"):
        LakeConfig.from_json("{")


def test_tags_name_the_lsn_and_sort_by_it() -> None:
    assert lake.tag_name(Lsn.parse("1/A2B3C4D5")) == "pgl_00000001A2B3C4D5"
    assert lake.tag_lsn("pgl_00000001A2B3C4D5") == Lsn.parse("1/A2B3C4D5")
    assert lake.tag_lsn("main") is None and lake.tag_lsn("pgl_xyz") is None


def test_state_is_the_newest_pipeline_commit_past_maintenance() -> None:
    history = [(3, MAINTENANCE), (2, pipeline("0/30", batch="b2")), (1, pipeline("0/20", batch="b1"))]
    state = lake.state_of(history)
    assert state is not None and (state.snapshot_id, state.applied_end_lsn, state.batch_id) == (
        2,
        Lsn(0x30),
        "b2",
    )
    assert lake.state_of([(1, MAINTENANCE)]) is None


def test_snapshot_at_an_lsn_is_the_newest_one_applied_up_to_it() -> None:
    # newest first: a compaction of batch 0/30, batch 0/30, a compaction of 0/20, batch 0/20
    history = [(4, MAINTENANCE), (3, pipeline("0/30")), (2, MAINTENANCE), (1, pipeline("0/20"))]
    assert lake.snapshot_at(history, Lsn(0x30)) == 4
    assert lake.snapshot_at(history, Lsn(0x2F)) == 2  # the table between the batches: 0/20 compacted
    assert lake.snapshot_at(history, Lsn(0x20)) == 2
    assert lake.snapshot_at(history, Lsn(0x1F)) is None  # no pipeline commit yet


def test_jdbc_catalogs_translate_to_sqlalchemy_for_pyiceberg() -> None:
    props = pyiceberg_properties(local_lake("/data/lake"))
    assert props == {
        "type": "sql",
        "uri": f"sqlite:////data/lake/catalog.db?timeout={lake.SQLITE_BUSY_TIMEOUT_MS // 1000}",
        "warehouse": "file:///data/lake/warehouse",
    }
    url = sqlalchemy_url("jdbc:postgresql://db:5432/iceberg?sslmode=require", "ice berg", "p@ss:/w")
    assert url == "postgresql+psycopg2://ice%20berg:p%40ss%3A%2Fw@db:5432/iceberg?sslmode=require"


def test_pyiceberg_waits_for_a_writer_of_the_sqlite_catalog_as_long_as_spark_does(tmp_path: Path) -> None:
    catalog = open_catalog(local_lake(str(tmp_path)))
    _, connect = catalog.engine.dialect.create_connect_args(catalog.engine.url)
    assert connect["timeout"] == lake.SQLITE_BUSY_TIMEOUT_MS / 1000  # Python's sqlite3 waits 5 s by default
    writer = sqlite3.connect(tmp_path / "catalog.db", check_same_thread=False)
    writer.execute("BEGIN EXCLUSIVE")  # another writer (a Spark job's commit) holds the file a moment
    released = threading.Timer(0.5, writer.rollback)
    released.start()
    catalog.create_namespace("waited")
    released.join()
    assert ("waited",) in catalog.list_namespaces()


def test_catalogs_pyiceberg_cannot_open_are_named() -> None:
    with pytest.raises(LakeCatalogError, match="Hadoop catalog has no pyiceberg client"):
        pyiceberg_properties(LakeConfig("lake", {"type": "hadoop", "warehouse": "/w"}))
    with pytest.raises(LakeCatalogError, match="neither jdbc:sqlite: nor jdbc:postgresql:"):
        pyiceberg_properties(LakeConfig("lake", {"type": "jdbc", "uri": "jdbc:mysql://db/x"}))
    assert pyiceberg_properties(LakeConfig("lake", {"type": "rest", "uri": "http://c"}))["type"] == "rest"


def test_the_connection_password_becomes_the_catalog_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    config = LakeConfig("lake", {"type": "jdbc", "uri": "jdbc:postgresql://db/ice"})
    conn = json.loads(connection_json(config)) | {"login": "ice", "password": "s3cret"}
    monkeypatch.setenv("AIRFLOW_CONN_TEST_LAKE", json.dumps(conn))
    got = PostgresCdcLakeHook("test_lake").get_conn()
    assert got.properties["jdbc.user"] == "ice" and got.properties["jdbc.password"] == "s3cret"
    conn["extra"]["properties"]["type"] = "glue"
    monkeypatch.setenv("AIRFLOW_CONN_TEST_LAKE", json.dumps(conn))
    with pytest.raises(LakeConfigError, match=r"'test_lake'.* glue catalog takes its credentials as catalog"):
        PostgresCdcLakeHook("test_lake").get_conn()


def test_a_rest_catalog_takes_oauth2_client_credentials_or_a_bearer_token(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = LakeConfig("lake", {"type": "rest", "warehouse": "s3://lake/"})
    conn = json.loads(connection_json(config)) | {
        "host": "http://catalog:8181/",
        "login": "id",
        "password": "sec",
    }
    monkeypatch.setenv("AIRFLOW_CONN_TEST_LAKE", json.dumps(conn))
    got = PostgresCdcLakeHook("test_lake").get_conn().properties
    assert (got["uri"], got["credential"], "token" in got) == ("http://catalog:8181", "id:sec", False)
    monkeypatch.setenv("AIRFLOW_CONN_TEST_LAKE", json.dumps(conn | {"login": None, "password": "bearer-tok"}))
    got = PostgresCdcLakeHook("test_lake").get_conn().properties
    assert (got["token"], "credential" in got) == ("bearer-tok", False)
    monkeypatch.setenv("AIRFLOW_CONN_TEST_LAKE", json.dumps(conn | {"password": None}))
    with pytest.raises(LakeConfigError, match=r"'test_lake': it has a client id .* but no client secret"):
        PostgresCdcLakeHook("test_lake").get_conn()


def test_the_iceberg_provider_s_connection_is_a_lake(monkeypatch: pytest.MonkeyPatch) -> None:
    extra = {"warehouse": "s3://lake/", "s3.endpoint": "http://s3:8333", "s3.region": "eu-west-1",
             "io-impl": "org.apache.iceberg.aws.s3.S3FileIO",
             "catalog": "shop", "namespace_prefix": "pg_", "names": "portable"}  # fmt: skip
    conn = {
        "conn_type": "iceberg",
        "host": "http://catalog:8181",
        "login": "id",
        "password": "sec",
        "extra": extra,
    }
    monkeypatch.setenv("AIRFLOW_CONN_ICE", json.dumps(conn))
    got = PostgresCdcLakeHook("ice").get_conn()
    assert (got.catalog, got.namespace_prefix, got.catalog_type, got.names) == (
        "shop",
        "pg_",
        "rest",
        "portable",
    )
    assert got.properties["credential"] == "id:sec" and got.properties["uri"] == "http://catalog:8181"
    assert got.properties["s3.endpoint"] == "http://s3:8333" and "catalog" not in got.properties
    spark = got.spark_conf()
    assert spark["spark.sql.catalog.shop.client.region"] == "eu-west-1"  # Iceberg's S3FileIO reads this key
    monkeypatch.setenv("AIRFLOW_CONN_ICE", json.dumps(conn | {"extra": {"type": "sql", "uri": "sqlite://"}}))
    with pytest.raises(LakeConfigError, match="'ice': an iceberg connection's catalog type must be one of"):
        PostgresCdcLakeHook("ice").get_conn()


def test_the_iceberg_runtime_must_match_spark_and_scala() -> None:
    ivy = "file:/root/.ivy2/jars/org.apache.iceberg_iceberg-spark-runtime-3.5_2.12-1.10.1.jar"
    assert iceberg_runtime_problem("3.5.9", "2.12.18", ivy) is None
    assert iceberg_runtime_problem("3.5.9", "2.12.18", "file:/opt/jars/iceberg-renamed.jar") is None
    wrong = iceberg_runtime_problem("4.1.1", "2.13.16", ivy)
    assert wrong is not None and "runtime for Spark 3.5 (Scala 2.12)" in wrong
    assert "packages='org.apache.iceberg:iceberg-spark-runtime-4.1_2.13:<version>'" in wrong
    missing = iceberg_runtime_problem("3.5.9", "2.12.18", None)
    assert missing is not None and "not on the job's classpath" in missing
    assert "iceberg-spark-runtime-3.5_2.12:<version>" in missing
