"""The Spark copy engine's job file is where ``spark-submit`` is told to find it."""

from __future__ import annotations

from pathlib import Path

import airflow_provider_postgres_cdc.spark
from airflow_provider_postgres_cdc.engine.snapshot.spark_engine import SPARK_JOB_PATH


def test_the_job_path_is_the_job_file_in_the_spark_package() -> None:
    shipped = Path(airflow_provider_postgres_cdc.spark.__file__).with_name("snapshot_jdbc.py")
    assert Path(SPARK_JOB_PATH).is_file()
    assert Path(SPARK_JOB_PATH).samefile(shipped)
