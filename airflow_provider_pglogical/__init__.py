"""Batch change-data-capture from PostgreSQL logical replication, orchestrated by Airflow.

Layers, arrows pointing down only (README "Architecture"; ``tests/unit/test_layers.py`` enforces it):
Airflow faces (hooks, operators, sensors, triggers, task_groups) -> ``engine`` -> ``replication``
(psycopg2) and ``pgoutput`` (pure decoder) -> ``values`` (Arrow) -> ``formats`` and ``errors``
(standard library, shipped to the Spark job). ``spark/`` is the job; ``cli/``, ``testing/`` and
``demo/`` sit beside the faces. Nothing below the faces imports Airflow.
"""

from airflow_provider_pglogical import moved_modules

__version__ = "0.2.0"

moved_modules.install()
