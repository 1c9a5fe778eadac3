"""A small lake workload for a Spark driver to load the classes the package's jobs use.

``testing/spark_cds.py`` runs it once in a driver that writes a class-data archive of those
classes when it exits; the tests' drivers then map them instead of loading them again. Its
argument is a scratch directory; the lake is the catalog ``warm`` the submit configures.
"""

from __future__ import annotations

import sys

from pyspark.sql import SparkSession

from airflow_provider_postgres_cdc.spark.sqlite_catalog import create_catalog_tables


def warm_up(scratch: str) -> None:
    """What the package's jobs do, in small: Parquet in and out, checkpoints, an Iceberg table
    created, appended, merged into, deleted from, tagged and read back through the JDBC catalog."""
    spark = SparkSession.builder.getOrCreate()
    create_catalog_tables(spark, "warm")
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
    warm_up(sys.argv[1])
