"""Opening normal and logical-replication psycopg2 connections with the settings CDC needs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import psycopg2
import psycopg2.extensions
import psycopg2.extras

from airflow_provider_postgres_cdc.errors import PrivilegeError

# Replication connections sit idle for long stretches (holding an exported snapshot, or
# between keepalives); TCP keepalives stop middleboxes from silently dropping them.
KEEPALIVE_DEFAULTS: dict[str, Any] = {
    "keepalives": 1,
    "keepalives_idle": 30,
    "keepalives_interval": 10,
    "keepalives_count": 5,
}

# ISO dates, UTC, ISO-8601 intervals, hex bytea and exact floats make the text form of values
# stable, which values/arrow_types.py relies on, whatever the server's, database's, role's
# or connection's defaults are: they come last in ``options``, so nothing overrides them.
# client_encoding=UTF8 makes the server convert text (values, and names in pgoutput's Relation
# messages: pgoutput converts to the session's client encoding too) from the database's
# encoding, so a LATIN1, WIN1252 or EUC_JP database reaches the decoder as UTF-8.
SESSION_OPTIONS = (
    "-c DateStyle=ISO -c TimeZone=UTC -c IntervalStyle=iso_8601 -c extra_float_digits=3 -c bytea_output=hex "
    "-c client_encoding=UTF8"
)
# A SQL_ASCII database stores bytes unchecked; the server cannot convert them and refuses to send
# those that are not valid UTF-8 to a UTF8 client, so its data is read as stored (raw_text.py).
RAW_SERVER_ENCODING = "SQL_ASCII"

ConnParams = str | Mapping[str, Any]


def libpq_arguments(params: ConnParams, extra: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """Split ``params`` into a DSN string and keyword arguments, with our defaults under them."""
    if isinstance(params, str):
        dsn, kwargs = params, {}
        given: Mapping[str, Any] = psycopg2.extensions.parse_dsn(params) if params else {}
    else:
        dsn, kwargs = "", dict(params)
        given = params
    for key, value in KEEPALIVE_DEFAULTS.items():
        if key not in given and key not in extra:
            kwargs[key] = value
    options = [given.get("options"), extra.get("options"), SESSION_OPTIONS]
    kwargs.update(extra)
    kwargs["options"] = " ".join(str(option) for option in options if option)
    return dsn, kwargs


def connect(params: ConnParams, *, autocommit: bool = True, **extra: Any) -> Any:
    """A normal connection (autocommit by default: catalog queries must not hold snapshots).

    ``params`` is a libpq DSN or a mapping of libpq keywords; ``extra`` adds keywords
    (``options`` is appended to ours rather than replacing it).
    """
    dsn, kwargs = libpq_arguments(params, extra)
    conn = psycopg2.connect(dsn, **kwargs)
    conn.autocommit = autocommit
    return conn


def connect_replication(params: ConnParams, **extra: Any) -> Any:
    """A ``LogicalReplicationConnection`` (``replication=database``) to the same database."""
    dsn, kwargs = libpq_arguments(params, extra)
    try:
        return psycopg2.connect(
            dsn, connection_factory=psycopg2.extras.LogicalReplicationConnection, **kwargs
        )
    except psycopg2.OperationalError as exc:
        if "replication role" not in str(exc):
            raise
        user = kwargs.get("user") or (psycopg2.extensions.parse_dsn(dsn).get("user") if dsn else None)
        raise missing_replication(user, exc) from None


def missing_replication(role: str | None, exc: BaseException) -> PrivilegeError:
    """The error for a role without the REPLICATION attribute, with the statement that fixes it."""
    name = f'"{role}"' if role else "<role>"
    detail = str(exc).strip().splitlines()[-1].split("FATAL:")[-1].strip()
    return PrivilegeError(
        f"role {name} may not use replication ({detail}). As a superuser run: ALTER ROLE {name} REPLICATION;"
    )


def is_connection_loss(exc: BaseException) -> bool:
    """Whether a psycopg2 error means the connection itself broke, not that a statement failed.

    libpq reports a connection closed inside COPY as a bare ``DatabaseError`` ("error with status
    PGRES_COPY_OUT and no message from the libpq"); a terminated backend or a server shutting
    down as ``OperationalError`` (``AdminShutdown`` among them); a closed connection object as
    ``InterfaceError``.
    """
    if isinstance(exc, psycopg2.OperationalError | psycopg2.InterfaceError):
        return True
    return type(exc) is psycopg2.DatabaseError


def connection_lost_detail(exc: BaseException) -> str:
    """The first line of a connection error: what libpq or the server said, nothing else."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def stores_raw_text(conn: Any) -> bool:
    """Whether the connection's database is SQL_ASCII: text is bytes the server never checked."""
    return bool(conn.info.parameter_status("server_encoding") == RAW_SERVER_ENCODING)


def read_raw_text(conn: Any) -> bool:
    """On a SQL_ASCII database, switch this session to send text as stored; say whether it did.

    For the connections that stream data (snapshot COPY, peek, START_REPLICATION), whose bytes
    go through ``raw_text.escape_raw_text``. psycopg2 keeps encoding queries and decoding
    results as UTF-8 (it does not notice ``SET client_encoding``): which is what names that
    are valid UTF-8 are, and the only names the lake can hold.
    """
    if not stores_raw_text(conn):
        return False
    with conn.cursor() as cur:
        cur.execute("SET client_encoding = 'SQL_ASCII'")
    return True
