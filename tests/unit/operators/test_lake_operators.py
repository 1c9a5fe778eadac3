"""What the Spark operators hand to spark-submit: the lake's catalog conf, the job's modules, its arguments.

The provider's ``SparkSubmitOperator.execute`` (which would start spark-submit) is replaced by a
recorder of the operator's state at that moment; everything before it runs for real, including the
lake connection's hook and the zip of the job's package modules.
"""

from __future__ import annotations

import dataclasses
import json
import zipfile
from pathlib import Path
from typing import Any

import pytest
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

from airflow_provider_postgres_cdc.errors import DeletesOptionError, HistoryOptionError, PartitionSpecError
from airflow_provider_postgres_cdc.formats.lake import LakeConfig
from airflow_provider_postgres_cdc.formats.lsn import Lsn
from airflow_provider_postgres_cdc.formats.manifest import (
    SHORT_JOB_ROWS,
    ColumnManifest,
    Manifest,
    TableManifest,
)
from airflow_provider_postgres_cdc.hooks.lake import connection_json
from airflow_provider_postgres_cdc.operators.maintenance import PostgresCdcLakeMaintenanceOperator
from airflow_provider_postgres_cdc.operators.spark_apply import PostgresCdcSparkApplyOperator
from airflow_provider_postgres_cdc.spark import JARS_ENV

TABLE = TableManifest(
    schema="public", table="t", columns=(ColumnManifest("id", "int4", 23, -1, "int32", key=True),),
    key_columns=("id",), replica_identity="d", rows=1, files=("public.t/part-v000-0000.parquet",),
)  # fmt: skip


def write_manifest(directory: Path, tables: tuple[TableManifest, ...]) -> str:
    manifest = Manifest("batch", "shop_cdc", "shop", "batch-0000000000000100", Lsn(0x100), Lsn(0x200), tables)
    path = directory / "_manifest.json"
    path.write_text(manifest.to_json())
    return str(path)


@pytest.fixture
def submitted(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[dict[str, Any]]:
    # A JDBC catalog in SQLite: the operators open it before they submit (its user and password are
    # the JDBC catalog's; SQLite ignores them).
    lake = LakeConfig("shop", {"type": "jdbc", "uri": f"jdbc:sqlite:{tmp_path}/catalog.db"}, "pg_")
    conn = json.loads(connection_json(lake)) | {"login": "ice", "password": "s3cret"}
    monkeypatch.setenv("AIRFLOW_CONN_SHOP_LAKE", json.dumps(conn))
    monkeypatch.setenv(JARS_ENV, "/jars/iceberg.jar")
    calls: list[dict[str, Any]] = []

    def record(self: SparkSubmitOperator, context: Any) -> None:
        with zipfile.ZipFile(str(self.py_files).split(",")[-1]) as shipped:
            names = shipped.namelist()
        secrets = Path(self.properties_file) if self.properties_file else None
        calls.append({"conf": dict(self.conf or {}), "args": list(self.application_args or []),
                      "jars": self.jars, "shipped": names, "conn_id": self._conn_id,
                      "properties_file": secrets,
                      "properties": secrets.read_text() if secrets else "",
                      "mode": secrets.stat().st_mode & 0o777 if secrets else None})  # fmt: skip

    monkeypatch.setattr(SparkSubmitOperator, "execute", record)
    return calls


def test_apply_submits_the_lake_conf_the_job_modules_and_the_manifest(
    submitted: list[dict[str, Any]], tmp_path: Path
) -> None:
    path = write_manifest(tmp_path, (TABLE,))
    operator = PostgresCdcSparkApplyOperator(
        task_id="apply", manifest=path, lake_conn_id="shop_lake", spark_conn_id="spark_local",
        conf={"spark.sql.catalog.shop.warehouse": "s3a://override"},
    )  # fmt: skip
    operator.execute({"outlet_events": _NoEvents()})  # type: ignore[arg-type]
    (call,) = submitted
    # The secret is in a private properties file that is gone once the job ended, never in --conf.
    assert "spark.sql.catalog.shop.jdbc.password" not in call["conf"]
    assert "spark.sql.catalog.shop.jdbc.password=s3cret" in call["properties"].splitlines()
    assert call["mode"] == 0o600 and not call["properties_file"].exists()
    assert call["conf"]["spark.sql.catalog.shop.jdbc.user"] == "ice"
    assert "credential" in call["properties"] and "spark.redaction.regex" not in call["conf"]
    assert call["conf"]["spark.sql.catalog.shop.warehouse"] == "s3a://override"  # explicit conf wins
    assert call["conf"]["spark.log.level"] == "WARN"  # Spark's INFO lines stay out of the task log
    assert call["conf"]["spark.driver.extraJavaOptions"] == "-XX:TieredStopAtLevel=1"  # a short job
    assert call["args"][:2] == ["--catalog", "shop"] and "--namespace-prefix" in call["args"]
    assert call["args"][call["args"].index("--manifest") + 1] == path
    assert "s3cret" not in " ".join(call["args"]) + json.dumps(call["conf"])
    assert call["jars"] == "/jars/iceberg.jar" and call["conn_id"] == "spark_local"
    assert "airflow_provider_postgres_cdc/formats/lake.py" in call["shipped"]
    assert "airflow_provider_postgres_cdc/spark/apply_batch.py" in call["shipped"]


def test_the_staging_connection_reaches_the_job_s_s3a_settings_with_its_secret_in_the_file(
    submitted: list[dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = {"conn_type": "aws", "login": "AKIDSTAGING", "password": "staging-secret",
             "extra": {"endpoint_url": "http://127.0.0.1:8333", "region_name": "eu-west-1"}}  # fmt: skip
    monkeypatch.setenv("AIRFLOW_CONN_STAGING_STORE", json.dumps(store))
    operator = PostgresCdcSparkApplyOperator(
        task_id="apply", manifest="s3://stage-bucket/shop_cdc/batch-1/_manifest.json",
        lake_conn_id="shop_lake", staging_conn_id="staging_store",
    )  # fmt: skip
    operator.staging_conn_id = "staging_store"
    monkeypatch.setattr(
        "airflow_provider_postgres_cdc.engine.staging.read_manifest",
        lambda uri, options: Manifest.from_json(Path(write_manifest(tmp_path, (TABLE,))).read_text()),
    )
    operator.execute({"outlet_events": _NoEvents()})  # type: ignore[arg-type]
    (call,) = submitted
    bucket = "spark.hadoop.fs.s3a.bucket.stage-bucket."
    assert call["conf"][bucket + "endpoint"] == "http://127.0.0.1:8333"
    assert call["conf"][bucket + "path.style.access"] == "true"
    assert call["conf"][bucket + "endpoint.region"] == "eu-west-1"
    assert call["conf"][bucket + "access.key"] == "AKIDSTAGING"
    assert call["conf"]["spark.hadoop.fs.s3.impl"] == "org.apache.hadoop.fs.s3a.S3AFileSystem"
    assert f"{bucket}secret.key=staging-secret" in call["properties"].splitlines()
    assert "staging-secret" not in json.dumps(call["conf"]) + " ".join(call["args"])


class _NoEvents(dict[Any, Any]):
    """``outlet_events`` of a context whose lake has none of the batch's tables (no event is added)."""

    def __missing__(self, key: Any) -> Any:
        return self


def test_an_empty_batch_submits_nothing(submitted: list[dict[str, Any]], tmp_path: Path) -> None:
    path = write_manifest(tmp_path, ())
    PostgresCdcSparkApplyOperator(task_id="apply", manifest=path, lake_conn_id="shop_lake").execute({})  # type: ignore[arg-type]
    assert submitted == []


def test_maintenance_submits_its_retention_settings(submitted: list[dict[str, Any]]) -> None:
    operator = PostgresCdcLakeMaintenanceOperator(
        task_id="maintain", slot_name="shop_cdc", lake_conn_id="shop_lake", keep_cuts="3",
        older_than_hours="36",
        skip=["orphans"], packages="org.apache.iceberg:iceberg-spark-runtime-3.5_2.12:1.10.1",
        conf={"spark.log.level": "INFO"},
    )  # fmt: skip
    operator.execute({})  # type: ignore[arg-type]
    (call,) = submitted
    assert call["conf"]["spark.log.level"] == "INFO"  # the user's level wins over the quiet default
    args = call["args"]
    assert args[args.index("--slot-name") + 1] == "shop_cdc" and args[args.index("--keep-cuts") + 1] == "3"
    assert (
        args[args.index("--older-than-hours") + 1] == "36.0" and args[args.index("--skip") + 1] == "orphans"
    )
    assert call["jars"] is None  # packages given: the local jars are not added
    assert "airflow_provider_postgres_cdc/spark/maintain_lake.py" in call["shipped"]


def test_the_spark_connection_is_rendered_from_a_template(
    submitted: list[dict[str, Any]], tmp_path: Path
) -> None:
    path = write_manifest(tmp_path, (TABLE,))
    operator = PostgresCdcSparkApplyOperator(
        task_id="apply", manifest=path, lake_conn_id="shop_lake", spark_conn_id="{{ params.spark }}"
    )
    operator.render_template_fields({"params": {"spark": "spark_local"}})  # type: ignore[arg-type]
    operator.execute({"outlet_events": _NoEvents()})  # type: ignore[arg-type]
    assert submitted[0]["conn_id"] == "spark_local"


def test_only_a_short_jobs_driver_compiles_with_c1_only_and_the_users_options_win(
    submitted: list[dict[str, Any]], tmp_path: Path
) -> None:
    large = dataclasses.replace(TABLE, rows=SHORT_JOB_ROWS + 1)
    (tmp_path / "large").mkdir()
    PostgresCdcSparkApplyOperator(
        task_id="apply", manifest=write_manifest(tmp_path / "large", (large,)), lake_conn_id="shop_lake"
    ).execute({"outlet_events": _NoEvents()})  # type: ignore[arg-type]
    (tmp_path / "small").mkdir()
    PostgresCdcSparkApplyOperator(
        task_id="apply", manifest=write_manifest(tmp_path / "small", (TABLE,)), lake_conn_id="shop_lake",
        conf={"spark.driver.extraJavaOptions": "-Xss4m"},
    ).execute({"outlet_events": _NoEvents()})  # type: ignore[arg-type]  # fmt: skip
    large_call, own_call = submitted
    assert "spark.driver.extraJavaOptions" not in large_call["conf"]  # a long job: the full JIT pays off
    assert own_call["conf"]["spark.driver.extraJavaOptions"] == "-Xss4m"


def test_the_partition_option_is_checked_when_parsed_and_against_the_batch_before_submitting(
    submitted: list[dict[str, Any]], tmp_path: Path
) -> None:
    with pytest.raises(PartitionSpecError, match="'weeks' is not an Iceberg partition transform"):
        PostgresCdcSparkApplyOperator(
            task_id="apply", manifest="m", lake_conn_id="shop_lake", partition_by={"public.t": ["weeks(id)"]}
        )
    path = write_manifest(tmp_path, (TABLE,))
    refused = PostgresCdcSparkApplyOperator(
        task_id="apply", manifest=path, lake_conn_id="shop_lake", partition_by='{"public.t": ["days(id)"]}'
    )
    with pytest.raises(PartitionSpecError, match="days takes date and timestamp columns"):
        refused.execute({"outlet_events": _NoEvents()})  # type: ignore[arg-type]
    assert submitted == []  # nothing was submitted, so nothing committed
    taken = PostgresCdcSparkApplyOperator(
        task_id="apply", manifest=path, lake_conn_id="shop_lake",
        partition_by={"public.t": ["bucket(8, id)"], "public.other": ["days(at)"]},
    )  # fmt: skip
    taken.execute({"outlet_events": _NoEvents()})  # type: ignore[arg-type]
    (call,) = submitted
    option = call["args"][call["args"].index("--partition-by") + 1]
    assert json.loads(option) == {"public.t": ["bucket(8, id)"], "public.other": ["days(at)"]}


@pytest.mark.parametrize(
    ("option", "mode", "error"),
    [("deletes", "soft", DeletesOptionError), ("history", "scd2", HistoryOptionError)],
)
def test_a_table_mode_option_is_checked_when_parsed_and_against_the_batch_before_submitting(
    submitted: list[dict[str, Any]], tmp_path: Path, option: str, mode: str, error: type[Exception]
) -> None:
    with pytest.raises(error, match=r"must be '.*' or '.*', not 'archive'"):
        PostgresCdcSparkApplyOperator(
            task_id="apply", manifest="m", lake_conn_id="shop_lake", **{option: {"public.t": "archive"}}
        )
    keyless = dataclasses.replace(TABLE, key_columns=(), replica_identity="f")
    refused = PostgresCdcSparkApplyOperator(
        task_id="apply", manifest=write_manifest(tmp_path, (keyless,)), lake_conn_id="shop_lake",
        **{option: mode},
    )  # fmt: skip
    with pytest.raises(error, match="its changes carry no key"):
        refused.execute({"outlet_events": _NoEvents()})  # type: ignore[arg-type]
    assert submitted == []
    taken = PostgresCdcSparkApplyOperator(
        task_id="apply", manifest=write_manifest(tmp_path, (TABLE,)), lake_conn_id="shop_lake",
        **{option: f'{{"public.t": "{mode}"}}'},
    )  # fmt: skip
    taken.execute({"outlet_events": _NoEvents()})  # type: ignore[arg-type]
    (call,) = submitted
    assert json.loads(call["args"][call["args"].index(f"--{option}") + 1]) == {"public.t": mode}
    assert "--partition-by" not in call["args"]
