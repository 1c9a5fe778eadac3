"""A class-data sharing archive for the short Spark drivers of the tests and the demo.

Most of a small Spark job's CPU goes to loading and verifying the classes of Spark, Scala and
Iceberg, again in every JVM. Java's class-data sharing (CDS) maps them ready-made from an archive
instead: measured here, a local spark-submit of a small Iceberg job takes 7.3 s instead of 12 s.
The archive is written once (``python -m airflow_provider_postgres_cdc.testing.spark_cds ARCHIVE``,
which ``make`` runs) by a driver that runs a small lake workload and dumps the classes it loaded
when it exits; :func:`driver_java_options` then gives the options that use it.

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

# Where ``make`` tells the tests the archive is.
SPARK_CDS_ENV = "POSTGRES_CDC_SPARK_CDS"
# Only the first JIT tier: short-lived drivers finish before the optimizing compiler pays off.
SHORT_JVM_OPTS = "-XX:TieredStopAtLevel=1"
_QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"


def driver_java_options(archive: str | os.PathLike[str] | None) -> str:
    """Java options for a short Spark driver: the archive's when it exists, else only the short JIT."""
    if archive and os.path.isfile(archive):
        return f"{SHORT_JVM_OPTS} -XX:SharedArchiveFile={archive} {_QUIET}"
    return SHORT_JVM_OPTS


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
            *(["--jars", jars] if jars else []), *confs, __file__, "--warm-up", scratch,
        ]  # fmt: skip
        env = {**os.environ, "SPARK_SUBMIT_OPTS": f"{SHORT_JVM_OPTS} -XX:ArchiveClassesAtExit={partial}"}
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0 or not partial.is_file():
            raise RuntimeError(
                f"the Spark class-data archive could not be written (exit {done.returncode}):\n"
                f"{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
            )
    partial.replace(archive)


def _warm_up(scratch: str) -> None:
    """What the package's jobs do, in small: Parquet in and out, checkpoints, an Iceberg table
    created, appended, merged into, deleted from, tagged and read back through the JDBC catalog."""
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.getOrCreate()
    staged = spark.range(200).selectExpr(
        "id",
        "cast(id % 7 as string) AS op",
        "current_timestamp() AS at",
        "cast(id AS decimal(20, 2)) AS amount",
    )
    staged.write.parquet(f"{scratch}/staged")
    changes = spark.read.parquet(f"{scratch}/staged").localCheckpoint()
    changes.groupBy("op").count().collect()
    changes.createOrReplaceTempView("changes")
    spark.sql("CREATE NAMESPACE IF NOT EXISTS warm.ns")
    spark.sql(
        "CREATE TABLE warm.ns.t (id bigint, op string, at timestamp, amount decimal(20, 2)) USING iceberg"
    )
    spark.sql("INSERT INTO warm.ns.t SELECT * FROM changes WHERE id < 100")
    spark.sql(
        "MERGE INTO warm.ns.t t USING changes c ON t.id = c.id "
        "WHEN MATCHED AND c.op = '0' THEN DELETE WHEN MATCHED THEN UPDATE SET * "
        "WHEN NOT MATCHED THEN INSERT *"
    )
    spark.sql("DELETE FROM warm.ns.t WHERE id > 190")
    spark.sql("ALTER TABLE warm.ns.t CREATE TAG warm")
    spark.table("warm.ns.t").where("amount > 10").orderBy("id").limit(5).collect()
    spark.stop()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--warm-up"]:
        _warm_up(sys.argv[2])
    elif len(sys.argv) == 2:
        write_archive(Path(sys.argv[1]), os.environ.get("POSTGRES_CDC_SPARK_JARS", ""))
    else:
        sys.exit("usage: python -m airflow_provider_postgres_cdc.testing.spark_cds ARCHIVE")
