"""The demo's DAG file uses only what the installed package ships: the factories, not the examples."""

from __future__ import annotations

from pathlib import Path

from airflow.dag_processing.dagbag import DagBag

from airflow_provider_postgres_cdc.demo.run import write_dags

PIPELINE = {
    "postgres_conn_id": "shop_db",
    "publications": "shop",
    "slot_name": "shop_cdc",
    "staging": "/demo/staging",
    "lake_conn_id": "shop_lake",
    "spark_conn_id": "spark_local",
}


def test_the_demo_writes_a_dag_file_building_both_dags_from_the_factories(tmp_path: Path) -> None:
    path = write_dags(tmp_path / "dags", PIPELINE)
    bag = DagBag(dag_folder=str(path))
    assert bag.import_errors == {}
    assert set(bag.dags) == {"postgres_cdc_initial_snapshot", "postgres_cdc_microbatch"}
    for dag in bag.dags.values():
        defaults = {name: dag.params[name] for name in PIPELINE}
        assert defaults == PIPELINE, dag.dag_id
    assert "dags_examples" not in path.read_text()
