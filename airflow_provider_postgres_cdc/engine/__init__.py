"""The Airflow-free engine: snapshot, drain, staging, retention, slot health, lake reads and verify.

It drives the ``replication`` layer and the ``pgoutput`` decoder and writes staged Parquet; the
Airflow faces (hooks, operators, sensors, triggers) call it and nothing here imports Airflow.
"""
