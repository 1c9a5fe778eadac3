"""``make demo`` finds the example DAGs it runs (it broke when the demo moved into ``demo/``)."""

from __future__ import annotations

from airflow_provider_postgres_cdc.demo.run import DAGS


def test_the_demo_points_at_the_example_dags() -> None:
    for dag_id in ("postgres_cdc_initial_snapshot", "postgres_cdc_microbatch"):
        assert (DAGS / f"{dag_id}.py").is_file(), DAGS
