"""``make demo`` finds the example DAGs it runs (it broke when the demo moved into ``demo/``)."""

from __future__ import annotations

from airflow_provider_pglogical.demo.run import DAGS


def test_the_demo_points_at_the_example_dags() -> None:
    for dag_id in ("pglogical_initial_snapshot", "pglogical_cdc_microbatch"):
        assert (DAGS / f"{dag_id}.py").is_file(), DAGS
