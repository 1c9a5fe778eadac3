"""The example DAGs in a private Airflow home, as the Spark benchmarks run them.

One pipeline: the source database as connection ``bench``, local Spark (``local[2]``) as
``spark_local`` and a lake as ``lake``; :func:`pipeline_conf` is the run conf naming them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from airflow_provider_postgres_cdc.formats.lake import LakeConfig
from airflow_provider_postgres_cdc.hooks.lake import connection_json
from airflow_provider_postgres_cdc.testing import AirflowSandbox

DAGS = Path(__file__).resolve().parents[1] / "dags_examples"
# Unencoded brackets in a Spark connection URI make the Spark provider fall back to yarn.
SPARK_LOCAL = "spark://local%5B2%5D"


def example_dags_sandbox(
    home: Path, source_uri: str, lake: LakeConfig, more: dict[str, str] | None = None
) -> AirflowSandbox:
    """An Airflow home for ``dags_examples`` with the pipeline's three connections (and ``more``)."""
    connections = {
        "bench": source_uri,
        "spark_local": SPARK_LOCAL,
        "lake": connection_json(lake),
        **(more or {}),
    }
    return AirflowSandbox(home, DAGS, connections=connections)


def pipeline_conf(slot: str, publication: str, staging: Path, **more: Any) -> dict[str, Any]:
    """The example DAGs' run conf for the sandbox's pipeline, plus ``more`` params."""
    return {
        "postgres_conn_id": "bench", "publications": publication, "slot_name": slot,
        "staging": str(staging), "lake_conn_id": "lake", "spark_conn_id": "spark_local", **more,
    }  # fmt: skip
