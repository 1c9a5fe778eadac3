"""Batch change-data-capture from PostgreSQL logical replication, orchestrated by Airflow.

Layers (arrows point down only): Airflow hooks/operators/sensors/triggers -> engine
(snapshot, drain, staging, lake) -> ``pgoutput`` decoder and ``replication`` layer.
Nothing below the Airflow faces imports Airflow.
"""

__version__ = "0.1.0"
