"""The Spark copy engine's side here: the JDBC connection and the job spec ``spark/snapshot_jdbc.py`` reads.

The job runs under ``spark-submit``; every JDBC partition imports the same exported snapshot
(``session_init``) and selects one ``ctid`` range with each column in its output-function text
form, which the job types exactly as the local engine does. Afterwards :func:`collect_staged`
inventories the part files it wrote, so both engines hand the same :class:`TableCopy` list to the
manifest.
"""

from __future__ import annotations

import posixpath
import re
import urllib.parse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg2.extensions
import pyarrow as pa
import pyarrow.parquet as pq

from airflow_provider_postgres_cdc.engine.snapshot.exported import IMPORT_SNAPSHOT, WORKER_OPTIONS
from airflow_provider_postgres_cdc.engine.snapshot.plan import ColumnPlan, TableCopy, TablePlan
from airflow_provider_postgres_cdc.engine.staging import StagingLocation
from airflow_provider_postgres_cdc.errors import SparkEngineUnsupportedError
from airflow_provider_postgres_cdc.formats.layout import is_part_file
from airflow_provider_postgres_cdc.formats.manifest import sibling_name
from airflow_provider_postgres_cdc.replication.connection import SESSION_OPTIONS, ConnParams, stores_raw_text
from airflow_provider_postgres_cdc.values import overflow

SPARK_JOB_PATH = str(Path(__file__).resolve().parents[2] / "spark" / "snapshot_jdbc.py")
"""The Spark copy engine's job file, for ``spark-submit``."""
SPARK_PASSWORD_ENV = "POSTGRES_CDC_JDBC_PASSWORD"
"""Environment variable the Spark job reads the JDBC password from (``PASSWORD_ENV`` there)."""
POSTGRESQL_JDBC_PACKAGE = "org.postgresql:postgresql:42.7.8"
"""PostgreSQL's official JDBC driver as a Maven coordinate (``spark-submit --packages``): the job's
default driver when no jars are given, the same on every operating system and cluster manager."""
_SNAPSHOT_NAME = re.compile(r"^[0-9A-F]+(-[0-9A-F]+)+$")


def _spark_can_type(data_type: pa.DataType) -> bool:
    """Whether ``spark/snapshot_jdbc.py`` can cast text to this staged type exactly."""
    return not pa.types.is_list(data_type)


def _spark_column(column: ColumnPlan) -> dict[str, Any]:
    """A column of the Spark job spec; ``sibling`` names its overflow column when values may not fit."""
    may_overflow = overflow.may_need_sibling(column.type_oid, column.typmod)
    return {
        "name": column.name,
        "arrow_type": str(column.arrow_type),
        "sibling": sibling_name(column.name) if may_overflow else None,
    }


def jdbc_connection(conn_params: ConnParams) -> tuple[str, dict[str, str], str | None]:
    """``(jdbc url, properties without password, password)`` for the same database as ``conn_params``.

    libpq keywords with a PostgreSQL JDBC equivalent are carried over (TLS settings, application
    name, timeouts, ``options``); keepalives become ``tcpKeepAlive``. Unix-socket hosts have no
    JDBC form and are refused.
    """
    params = dict(psycopg2.extensions.parse_dsn(conn_params) if isinstance(conn_params, str) else conn_params)
    host = str(params.get("host") or "localhost")
    if host.startswith("/"):
        raise SparkEngineUnsupportedError(
            f"the Spark copy engine needs a TCP host; {host!r} is a Unix socket directory. Use the "
            "server's host name or address in the connection."
        )
    port = str(params.get("port") or 5432)
    dbname = str(params.get("dbname") or params.get("user") or "")
    url = f"jdbc:postgresql://{host}:{port}/{urllib.parse.quote(dbname, safe='')}"
    renames = {
        "user": "user",
        "sslmode": "sslmode",
        "sslrootcert": "sslrootcert",
        "sslcert": "sslcert",
        "sslkey": "sslkey",
        "application_name": "ApplicationName",
        "connect_timeout": "connectTimeout",
        "options": "options",
    }
    properties = {jdbc: str(params[libpq]) for libpq, jdbc in renames.items() if params.get(libpq)}
    if str(params.get("keepalives", "1")) != "0":
        properties["tcpKeepAlive"] = "true"
    password = params.get("password")
    return url, properties, None if password is None else str(password)


def spark_job_spec(
    plans: Sequence[TablePlan],
    catalog: Any,
    *,
    database: str,
    snapshot_name: str,
    location: StagingLocation,
    batch_dir: str,
    jdbc_url: str,
    jdbc_properties: dict[str, str],
) -> dict[str, Any]:
    """The description ``spark/snapshot_jdbc.py`` reads: where to read from, what, and where to write.

    ``catalog`` is a connection to the source database (it quotes the queries). ``jdbc_properties``
    must not contain the password: the job takes it from the environment (see
    :func:`jdbc_connection`).
    """
    if "password" in jdbc_properties:
        raise ValueError("pass the JDBC password through the environment, not the job spec")
    unsupported = [
        f"{plan.qualified}.{column.name} ({column.arrow_type})"
        for plan in plans
        for column in plan.columns
        if not _spark_can_type(column.arrow_type)
    ]
    if unsupported:
        raise SparkEngineUnsupportedError(
            f"the Spark copy engine cannot type {', '.join(unsupported)} (arrays need the local "
            "engine's text conversion); use copy_engine='local' or choose other tables"
        )
    if stores_raw_text(catalog):
        raise SparkEngineUnsupportedError(
            f"database {database!r} is SQL_ASCII: the Spark copy engine reads through JDBC as "
            "UTF-8, which the server refuses for stored bytes that are not UTF-8; use "
            "copy_engine='local', which stages them by the SQL_ASCII rule (docs/FORMATS.md)"
        )
    session = " ".join(filter(None, [jdbc_properties.get("options"), WORKER_OPTIONS, SESSION_OPTIONS]))
    tables = []
    for plan in plans:
        tables.append(
            {
                "name": plan.qualified,
                "output": location.uri_of(posixpath.join(batch_dir, plan.dir_name), hadoop=True),
                "queries": [
                    plan.select(block_range, as_text=True).as_string(catalog)
                    for block_range in plan.block_ranges
                ],
                "columns": [_spark_column(column) for column in plan.columns],
            }
        )
    if not _SNAPSHOT_NAME.match(snapshot_name):
        raise SparkEngineUnsupportedError(f"unexpected exported snapshot name {snapshot_name!r}")
    return {
        "jdbc_url": jdbc_url,
        "properties": {**jdbc_properties, "options": session},
        "session_init": f"{IMPORT_SNAPSHOT}; SET TRANSACTION SNAPSHOT '{snapshot_name}'",
        "tables": tables,
    }


def collect_staged(location: StagingLocation, batch_dir: str, plans: Sequence[TablePlan]) -> list[TableCopy]:
    """Inventory part files another engine (Spark) wrote into the table directories.

    Files other than ``part-*.parquet`` (Spark's ``_SUCCESS``, checksum files) are removed so the
    directory holds exactly what the manifest lists.
    """
    copies = []
    for plan in plans:
        directory = posixpath.join(batch_dir, plan.dir_name)
        files, rows, size, fields = [], 0, 0, set()
        for path in location.list_files(directory):
            name = posixpath.basename(path)
            if not is_part_file(name):
                location.filesystem.delete_file(path)
                continue
            info = location.filesystem.get_file_info(path)
            with location.filesystem.open_input_file(path) as handle:
                staged = pq.ParquetFile(handle)
                rows += staged.metadata.num_rows
                fields.update(staged.schema_arrow.names)
            size += info.size or 0
            files.append(posixpath.relpath(path, batch_dir))
        copies.append(TableCopy(plan, tuple(files), rows, size, tuple(sorted(fields))))
    return copies
