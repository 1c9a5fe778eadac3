"""Batch change-data-capture from PostgreSQL logical replication (pgoutput) into Iceberg, with Airflow.

The layers, and the rule that arrows point down only, are described in docs/ARCHITECTURE.md and
checked by ``tests/unit/test_import_graph.py``.
"""

__version__ = "0.3.0"
