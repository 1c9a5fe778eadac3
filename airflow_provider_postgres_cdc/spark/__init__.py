"""What spark-submit runs: the apply job and its helpers (the only package part importing pyspark).

The job's entry scripts are files of this folder; what they import from the package (``errors``,
the standard-library ``formats`` package and this folder) reaches the cluster as one zip through
``--py-files`` (:func:`job_py_files`), so the job and the Airflow side share one definition of
every format rule. This module itself imports no pyspark: the
Airflow side uses it to submit.
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

APPLY_JOB_PATH = str(Path(__file__).with_name("apply_batch.py"))
MAINTAIN_JOB_PATH = str(Path(__file__).with_name("maintain_lake.py"))
WARM_UP_JOB_PATH = str(Path(__file__).with_name("warm_up.py"))
# Tables the apply job applies at once by default: a table's steps are mostly round trips to the
# catalog and small Spark jobs, which overlap well even on two cores (docs/LAKE.md).
TABLE_PARALLELISM = 4
# Comma-separated jars for local Spark: the Iceberg runtime and JDBC drivers (`make` sets it).
JARS_ENV = "POSTGRES_CDC_SPARK_JARS"

_PACKAGE = Path(__file__).resolve().parent.parent
_SHIPPED_MODULES = ("__init__.py", "errors.py")
_SHIPPED_PACKAGES = ("formats", "spark")


def job_py_files(directory: str) -> str:
    """Write ``postgres_cdc_job.zip`` (the package modules the Spark jobs import) into ``directory``."""
    path = os.path.join(directory, "postgres_cdc_job.zip")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name in _SHIPPED_MODULES:
            archive.write(_PACKAGE / name, f"{_PACKAGE.name}/{name}")
        for package in _SHIPPED_PACKAGES:
            for module in sorted((_PACKAGE / package).glob("*.py")):
                archive.write(module, f"{_PACKAGE.name}/{package}/{module.name}")
    return path


def local_jars() -> str:
    """The jars local Spark needs for the lake, from ``POSTGRES_CDC_SPARK_JARS`` (empty when unset)."""
    return os.environ.get(JARS_ENV, "")
