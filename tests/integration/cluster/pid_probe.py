"""A tiny PySpark job for the cluster tests: where its tasks run, and where they import the package from.

Prints one JSON line: the driver's pid, and per task its Python worker's pid, the pids of its
ancestors, and the file ``airflow_provider_postgres_cdc.formats`` was imported from.
"""

from __future__ import annotations

import json
import os

from pyspark.sql import SparkSession


def _ancestors(pid: int) -> list[int]:
    chain = []
    while pid > 1:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as stat:
            pid = int(stat.read().rsplit(")", 1)[1].split()[1])
        chain.append(pid)
    return chain


def _probe(_: int) -> dict[str, object]:
    import airflow_provider_postgres_cdc.formats as shipped

    return {"pid": os.getpid(), "ancestors": _ancestors(os.getpid()), "module": shipped.__file__}


if __name__ == "__main__":
    spark = SparkSession.builder.appName("postgres-cdc-pid-probe").getOrCreate()
    tasks = spark.sparkContext.parallelize(range(4), 4).map(_probe).collect()
    print(json.dumps({"driver": os.getpid(), "tasks": tasks}))
    spark.stop()
