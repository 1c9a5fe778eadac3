"""Secrets reach spark-submit in a private properties file: which settings, and the file itself."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_provider_postgres_cdc.engine.spark_conf import (
    is_secret_key,
    spark_defaults_file,
    split_secrets,
    submit_settings,
    with_defaults,
)


@pytest.mark.parametrize(
    "key",
    [
        "spark.sql.catalog.lake.jdbc.password",
        "spark.sql.catalog.lake.token",
        "spark.sql.catalog.lake.credential",
        "spark.sql.catalog.lake.s3.secret-access-key",
        "spark.sql.catalog.lake.s3.session-token",
        "spark.hadoop.fs.s3a.secret.key",
        "spark.hadoop.fs.s3a.bucket.staging.session.token",
    ],
)
def test_secret_settings_are_recognised(key: str) -> None:
    assert is_secret_key(key)


@pytest.mark.parametrize(
    "key",
    [
        "spark.sql.catalog.lake.uri",
        "spark.sql.catalog.lake.s3.access-key-id",
        "spark.hadoop.fs.s3a.bucket.staging.access.key",
        "spark.sql.catalog.lake.warehouse",
        "spark.redaction.regex",
    ],
)
def test_other_settings_stay_on_the_command_line(key: str) -> None:
    assert not is_secret_key(key)


def test_secrets_go_to_a_private_file_after_the_spark_defaults(tmp_path: Path) -> None:
    conf_dir = tmp_path / "conf"
    conf_dir.mkdir()
    (conf_dir / "spark-defaults.conf").write_text("spark.eventLog.enabled true")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setenv("SPARK_CONF_DIR", str(conf_dir))
    try:
        public, path = submit_settings(
            {"spark.sql.catalog.lake.uri": "http://c", "spark.sql.catalog.lake.credential": "id:s=c\\r#t"},
            str(scratch),
        )
    finally:
        monkeypatch.undo()
    assert set(public) == {"spark.sql.catalog.lake.uri"}
    assert path is not None and Path(path).parent == scratch and Path(path).stat().st_mode & 0o777 == 0o600
    # The defaults first (spark-submit would skip them); values escaped for java.util.Properties.
    assert Path(path).read_text().splitlines() == [
        "spark.eventLog.enabled true",
        "spark.redaction.regex=(?i)secret|password|token|access[.]key|credential",
        "spark.sql.catalog.lake.credential=id:s=c\\\\r#t",
    ]


def test_without_secrets_no_file_is_written_and_the_user_s_file_is_kept(tmp_path: Path) -> None:
    public, path = submit_settings({"spark.executor.memory": "2g"}, str(tmp_path), "/etc/spark/mine.conf")
    assert path == "/etc/spark/mine.conf" and public["spark.executor.memory"] == "2g"
    assert list(tmp_path.iterdir()) == []
    assert split_secrets({"a.token": "x"}) == ({}, {"a.token": "x"})


def test_the_spark_defaults_are_found_where_spark_submit_looks(tmp_path: Path) -> None:
    (tmp_path / "conf").mkdir()
    assert spark_defaults_file({"SPARK_HOME": str(tmp_path)}) is None
    (tmp_path / "conf" / "spark-defaults.conf").write_text("")
    assert spark_defaults_file({"SPARK_HOME": str(tmp_path)}) == tmp_path / "conf" / "spark-defaults.conf"


def test_the_jobs_defaults_are_added_only_where_neither_conf_nor_the_users_files_set_them(
    tmp_path: Path,
) -> None:
    defaults = {"spark.log.level": "WARN", "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1"}
    conf = {"spark.master": "local[2]"}
    assert with_defaults(conf, defaults, None, environ={}) == {**defaults, **conf}
    assert with_defaults({"spark.log.level": "DEBUG"}, defaults, None, environ={}) == {
        "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1",
        "spark.log.level": "DEBUG",
    }
    # The user's properties file, or the spark-defaults.conf spark-submit reads, sets a key: it stays.
    (tmp_path / "mine.conf").write_text("# mine\n  spark.log.level   INFO\nspark.master=yarn\n")
    assert with_defaults({}, defaults, str(tmp_path / "mine.conf"), environ={}) == {
        "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1"
    }
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "spark-defaults.conf").write_text("spark.driver.extraJavaOptions=-Xss4m\n")
    environ = {"SPARK_CONF_DIR": str(tmp_path / "conf")}
    assert with_defaults({}, defaults, None, environ=environ) == {"spark.log.level": "WARN"}
    # A file that sets other keys only, or only mentions one in a comment, leaves the defaults on.
    (tmp_path / "other.conf").write_text("#spark.log.level INFO\nspark.executor.memory 2g\n")
    assert with_defaults({}, defaults, str(tmp_path / "other.conf"), environ={}) == defaults
