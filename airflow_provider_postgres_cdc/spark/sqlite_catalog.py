"""A SQLite catalog's tables, made before a Spark session opens it (``formats.lake.jdbc_defaults``).

Iceberg's JDBC catalog on SQLite is opened with ``jdbc.init-catalog-tables=false``: its own
start-up check of its tables would hold a read lock for as long as it lives and lock every other
writer of the file out. So the tables are made here by an Iceberg ``JdbcCatalog`` of the same
``uri`` and ``jdbc.*`` properties that is closed at once, which releases that lock with its
connection: Iceberg's own DDL, and nothing of it stays open.
"""

from __future__ import annotations

import logging
from typing import Any

from pyspark.sql import SparkSession

from airflow_provider_postgres_cdc.formats.lake import INIT_CATALOG_TABLES

log = logging.getLogger(__name__)


def create_catalog_tables(spark: SparkSession, catalog: str) -> None:
    """Create the tables of ``catalog`` when the session opens it without creating them.

    Only a catalog configured with ``jdbc.init-catalog-tables=false`` (a SQLite one, unless its
    lake says otherwise) is touched. A failure is only logged: the job's own first use of the
    catalog reports an unreachable catalog with the fix (``spark/iceberg.py``).
    """
    prefix = f"spark.sql.catalog.{catalog}."
    properties = {key[len(prefix) :]: value for key, value in _conf(spark).items() if key.startswith(prefix)}
    if properties.get(INIT_CATALOG_TABLES, "").lower() != "false":
        return
    wanted = {key: value for key, value in properties.items() if key.startswith("jdbc.")}
    wanted.update(uri=properties.get("uri", ""), warehouse=properties.get("warehouse", ""))
    wanted[INIT_CATALOG_TABLES] = "true"
    jvm: Any = spark._jvm
    maker = jvm.org.apache.iceberg.jdbc.JdbcCatalog()
    try:
        maker.initialize(catalog, wanted)
    except Exception as exc:  # the catalog's first use says what is wrong
        log.warning("could not create the tables of catalog %s: %s", catalog, str(exc).splitlines()[0][:300])
        return
    maker.close()


def _conf(spark: SparkSession) -> dict[str, str]:
    """Every property set in the session: spark-submit's ``--conf`` and those set at run time."""
    jvm: Any = spark._jvm
    settings = spark._jsparkSession.conf().getAll()  # type: ignore[union-attr]
    return dict(jvm.scala.collection.JavaConverters.mapAsJavaMapConverter(settings).asJava())
