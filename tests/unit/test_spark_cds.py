"""The Java options of the tests' short Spark drivers (``testing/spark_cds.py``)."""

from __future__ import annotations

from pathlib import Path

from airflow_provider_postgres_cdc.engine.spark_conf import SHORT_JIT_OPTIONS
from airflow_provider_postgres_cdc.testing.spark_cds import driver_java_options


def test_an_existing_archive_is_mapped_and_its_mismatch_warning_silenced(tmp_path: Path) -> None:
    archive = tmp_path / "spark-3.5.jsa"
    archive.write_bytes(b"\0")
    options = driver_java_options(archive).split()
    assert options[0] == SHORT_JIT_OPTIONS
    assert f"-XX:SharedArchiveFile={archive}" in options
    # A JVM of another classpath skips the archive and would warn on the job's standard output.
    assert {"-Xlog:cds=off", "-Xlog:cds+dynamic=off"} <= set(options)


def test_without_an_archive_only_the_short_jit_remains(tmp_path: Path) -> None:
    assert driver_java_options(tmp_path / "absent.jsa") == SHORT_JIT_OPTIONS
    assert driver_java_options(None) == SHORT_JIT_OPTIONS
    assert driver_java_options("") == SHORT_JIT_OPTIONS
