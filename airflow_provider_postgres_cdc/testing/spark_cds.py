"""A class-data sharing archive for the short Spark drivers of the tests and the demo.

Most of a small Spark job's CPU goes to loading and verifying the classes of Spark, Scala and
Iceberg, again in every JVM. Java's class-data sharing (CDS) maps them ready-made from an archive
instead: measured here, a local spark-submit of a small Iceberg job takes 7.3 s instead of 12 s.
The archive is written once (``python -m airflow_provider_postgres_cdc.testing.spark_cds ARCHIVE``,
which ``make`` runs) by a driver that runs a small lake workload (``spark/warm_up.py``) and dumps
the classes it loaded when it exits; :func:`driver_java_options` then gives the options that use it.

A JVM whose classpath differs from the one that wrote the archive (another Spark, another
virtualenv) cannot use it and runs as without it: the options also silence the JVM's warning, which
it would print on the job's standard output.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from airflow_provider_postgres_cdc.engine.spark_conf import SHORT_JIT_OPTIONS
from airflow_provider_postgres_cdc.spark import WARM_UP_JOB_PATH

# Where ``make`` tells the tests the archive is.
SPARK_CDS_ENV = "POSTGRES_CDC_SPARK_CDS"
_QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"


def driver_java_options(archive: str | os.PathLike[str] | None) -> str:
    """Java options for a short Spark driver: the archive's when it exists, else only the short JIT."""
    if archive and os.path.isfile(archive):
        return f"{SHORT_JIT_OPTIONS} -XX:SharedArchiveFile={archive} {_QUIET}"
    return SHORT_JIT_OPTIONS


def write_archive(archive: Path, jars: str) -> None:
    """Run the warm-up workload in a local driver that writes ``archive`` when it exits.

    ``jars`` are the lake jars the drivers load (``--jars``: the Iceberg runtime, JDBC drivers);
    the archive is written beside its final name and moved there, so a reader never sees half of it.
    """
    from airflow_provider_postgres_cdc.formats.lake import local_lake

    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_name(archive.name + ".partial")
    partial.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="spark-cds-") as scratch:
        lake = local_lake(scratch, catalog="warm")
        confs = [arg for key, value in lake.spark_conf().items() for arg in ("--conf", f"{key}={value}")]
        command = [
            "spark-submit", "--master", "local[2]", "--conf", "spark.ui.enabled=false",
            *(["--jars", jars] if jars else []), *confs, WARM_UP_JOB_PATH, scratch,
        ]  # fmt: skip
        env = {**os.environ, "SPARK_SUBMIT_OPTS": f"{SHORT_JIT_OPTIONS} -XX:ArchiveClassesAtExit={partial}"}
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0 or not partial.is_file():
            raise RuntimeError(
                f"the Spark class-data archive could not be written (exit {done.returncode}):\n"
                f"{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
            )
    partial.replace(archive)


if __name__ == "__main__":
    if len(sys.argv) == 2:
        write_archive(Path(sys.argv[1]), os.environ.get("POSTGRES_CDC_SPARK_JARS", ""))
    else:
        sys.exit("usage: python -m airflow_provider_postgres_cdc.testing.spark_cds ARCHIVE")
