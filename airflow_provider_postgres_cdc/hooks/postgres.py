"""``PostgresCdcHook``: the Airflow face of the replication layer (connections, slots, publications)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import psycopg2
import psycopg2.extensions
from airflow.sdk import BaseHook

from airflow_provider_postgres_cdc import replication
from airflow_provider_postgres_cdc.errors import ConnectionExtrasError
from airflow_provider_postgres_cdc.formats.lsn import Lsn
from airflow_provider_postgres_cdc.replication import (
    CreatedSlot,
    PreflightReport,
    PublicationInfo,
    PublishedTable,
    SlotInfo,
    TableSpec,
)
from airflow_provider_postgres_cdc.replication.publications import published_tables
from airflow_provider_postgres_cdc.replication.slots import SNAPSHOT_HOLDER_OPTIONS

if TYPE_CHECKING:
    from airflow_provider_postgres_cdc.engine.health import SlotHealth

LIBPQ_KEYWORDS_DOC = "https://www.postgresql.org/docs/current/libpq-connect.html#LIBPQ-PARAMKEYWORDS"

# Extras that Airflow's PostgresHook (apache-airflow-providers-postgres) reads for itself: the
# same ``postgres`` connection may serve both hooks, so these are ignored here, not refused.
POSTGRES_HOOK_EXTRAS = frozenset(
    {
        "aws_conn_id",
        "azure_conn_id",
        "cluster-identifier",
        "cursor",
        "enable_log_db_messages",
        "iam",
        "redshift",
        "redshift-serverless",
        "workgroup-name",
    }
)
POSTGRES_HOOK_EXTRA_PREFIX = "sqlalchemy_"  # sqlalchemy_scheme, sqlalchemy_query, ...


def is_libpq_keyword(key: str) -> bool:
    """Whether libpq itself knows ``key`` as a connection keyword (asked through its own parser)."""
    if not key.isidentifier():  # "a b" or "host=x dbname" would parse as other keywords
        return False
    try:
        psycopg2.extensions.parse_dsn(f"{key}=x")
    except psycopg2.ProgrammingError:
        return False
    return True


def _is_postgres_hook_extra(key: str) -> bool:
    return key in POSTGRES_HOOK_EXTRAS or key.startswith(POSTGRES_HOOK_EXTRA_PREFIX)


def _iam_requested(value: Any) -> bool:
    """PostgresHook's ``iam`` extra is on (JSON ``true``, or ``"true"`` from a URI's query)."""
    return bool(value) and str(value).strip().lower() not in ("false", "0", "no", "off")


def sort_extras(conn_id: str, extras: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The extras of a ``postgres`` connection that are libpq keywords, and those PostgresHook's own.

    libpq keywords (``sslmode``, ``application_name``, ``options``, ...) pass through. Extras that
    PostgresHook documents for itself (``cursor``, ``sqlalchemy_*``, ``aws_conn_id``, ...) are
    returned by name, for the caller to warn about and leave out. ``iam`` (on) and any other key
    raise :class:`ConnectionExtrasError`: a misspelt ``sslmode`` must not connect without TLS.
    """
    if _iam_requested(extras.get("iam")):
        raise ConnectionExtrasError(
            f"connection {conn_id!r} sets the extra iam: IAM database authentication (AWS RDS, Aurora, "
            "Redshift, Azure Entra ID) is not supported by airflow-provider-postgres-cdc. Remove iam (and "
            "aws_conn_id or azure_conn_id) from the connection's extras and authenticate the replication "
            "role with the connection's password, a client certificate (extras sslcert and sslkey) or a "
            "passfile extra"
        )
    passed: dict[str, Any] = {}
    ignored: list[str] = []
    unknown: list[str] = []
    for key, value in extras.items():
        if is_libpq_keyword(key):
            passed[key] = value
        elif _is_postgres_hook_extra(key):
            ignored.append(key)
        else:
            unknown.append(key)
    if unknown:
        names = ", ".join(repr(key) for key in sorted(unknown))
        raise ConnectionExtrasError(
            f"connection {conn_id!r} has extras that are neither libpq connection keywords nor extras of "
            f"Airflow's PostgresHook: {names}. Correct their names (libpq keywords: {LIBPQ_KEYWORDS_DOC}) "
            "or remove them from the connection's extras"
        )
    return passed, sorted(ignored)


class PostgresCdcHook(BaseHook):
    """Connections to a PostgreSQL database for logical replication, and slot/publication management.

    The source is a standard Airflow ``postgres`` connection (the type of the Postgres provider's
    ``PostgresHook``): host, port, login, password and database. Its extras are read this way:

    * libpq connection keywords (``sslmode``, ``sslrootcert``, ``application_name``, ``options``,
      ``connect_timeout``, ``target_session_attrs``, ...) are passed to libpq as they are;
    * extras that ``PostgresHook`` documents for itself (``cursor``, ``sqlalchemy_*``,
      ``aws_conn_id``, ``redshift``, ``enable_log_db_messages``, ...) are ignored, with one warning
      naming them, so one connection can serve both hooks;
    * ``iam`` set to true is refused (IAM authentication is not supported), and so is any other
      extra, with a :class:`~airflow_provider_postgres_cdc.errors.ConnectionExtrasError` naming
      every such key: a misspelt ``sslmode`` must not quietly connect without TLS.

    TCP keepalives are on unless the extras say otherwise. Each ``get_conn``/``get_replication_conn``
    call opens a new connection that the caller closes (``connection()`` does it for you); nothing
    connects at construction. For example::

        AIRFLOW_CONN_SHOP_DB='{"conn_type": "postgres", "host": "db", "port": 5432, "login": "cdc",
          "password": "...", "schema": "shop", "extra": {"sslmode": "verify-full"}}'

    :param postgres_conn_id: the Airflow connection id (a ``postgres`` connection).
    """

    conn_name_attr = "postgres_conn_id"
    default_conn_name = "postgres_default"
    conn_type = "postgres"
    hook_name = "PostgreSQL logical replication"

    def __init__(self, postgres_conn_id: str = default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.postgres_conn_id = postgres_conn_id

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        """The connection form as for any ``postgres`` connection: the schema field is the database."""
        return {
            "hidden_fields": [],
            "relabeling": {"schema": "Database"},
            "placeholders": {
                "host": "db.example.com",
                "port": "5432",
                "schema": "the database whose tables are published",
                "login": "a role with REPLICATION (or rds_replication) and SELECT on the tables",
                "extra": '{"sslmode": "verify-full", "application_name": "airflow-postgres-cdc"}',
            },
        }

    def connection_params(self) -> dict[str, Any]:
        """libpq keywords for the connection (contains the password: never log it).

        Raises :class:`~airflow_provider_postgres_cdc.errors.ConnectionExtrasError` for an extra
        that is not a libpq keyword (see the class docstring).
        """
        conn = self.get_connection(self.postgres_conn_id)
        return self._libpq_params(conn, conn.extra_dejson)

    def _libpq_params(self, conn: Any, extras: Mapping[str, Any]) -> dict[str, Any]:
        """libpq keywords from the connection's fields and its libpq extras (which may override them)."""
        passed, ignored = sort_extras(self.postgres_conn_id, extras)
        if ignored:
            self.log.warning(
                "connection %r: ignoring the extras %s: they configure Airflow's PostgresHook "
                "(apache-airflow-providers-postgres), not airflow-provider-postgres-cdc, which passes "
                "only libpq keywords to the server",
                self.postgres_conn_id,
                ", ".join(repr(key) for key in ignored),
            )
        params: dict[str, Any] = {
            "host": conn.host,
            "port": conn.port,
            "user": conn.login,
            "password": conn.password,
            "dbname": conn.schema,
            **passed,
        }
        return {key: value for key, value in params.items() if value not in (None, "")}

    def get_conn(self, **extra: Any) -> Any:
        """A new autocommit psycopg2 connection; ``extra`` adds libpq keywords."""
        return replication.connect(self.connection_params(), **extra)

    def get_replication_conn(self, **extra: Any) -> Any:
        """A new psycopg2 ``LogicalReplicationConnection`` to the same database."""
        return replication.connect_replication(self.connection_params(), **extra)

    @contextlib.contextmanager
    def connection(self) -> Iterator[Any]:
        """A normal connection that is closed on exit."""
        conn = self.get_conn()
        try:
            yield conn
        finally:
            conn.close()

    def test_connection(self) -> tuple[bool, str]:
        """Used by the Airflow UI's Test button: connects and runs the preflight checks."""
        try:
            report = self.check_prerequisites()
        except Exception as exc:
            return False, str(exc)
        return True, f"ready for logical replication: PostgreSQL {report.server_version}, role {report.role}"

    def check_prerequisites(self) -> PreflightReport:
        """Raise the specific error of the first unmet prerequisite (wal_level, slots, privileges, ...)."""
        with self.connection() as conn:
            return replication.check_prerequisites(conn)

    def create_publication(self, name: str, tables: Sequence[TableSpec] = (), **options: Any) -> None:
        """See :func:`airflow_provider_postgres_cdc.replication.create_publication`."""
        with self.connection() as conn:
            replication.create_publication(conn, name, tables, **options)

    def publish_tables(self, name: str, tables: Sequence[TableSpec]) -> list[str]:
        """See :func:`airflow_provider_postgres_cdc.replication.publish_tables` (one transaction)."""
        conn = self.get_conn(autocommit=False)
        try:
            return replication.publish_tables(conn, name, tables)
        finally:
            conn.close()

    def alter_publication(self, name: str, **changes: Any) -> None:
        """See :func:`airflow_provider_postgres_cdc.replication.alter_publication`."""
        with self.connection() as conn:
            replication.alter_publication(conn, name, **changes)

    def drop_publication(self, name: str, *, if_exists: bool = True) -> None:
        with self.connection() as conn:
            replication.drop_publication(conn, name, if_exists=if_exists)

    def describe_publications(self, names: Sequence[str]) -> list[PublicationInfo]:
        with self.connection() as conn:
            return replication.describe_publications(conn, names)

    def published_tables(self, names: Sequence[str]) -> list[PublishedTable]:
        """Tables the publications publish together, with their combined row filter and column list."""
        with self.connection() as conn:
            return published_tables(conn, names)

    def create_slot(self, name: str, *, temporary: bool = False, two_phase: bool = False) -> CreatedSlot:
        """Create a pgoutput slot without exporting a snapshot (its stream starts now)."""
        with self.connection() as conn:
            return replication.create_slot(conn, name, temporary=temporary, two_phase=two_phase)

    def create_slot_with_snapshot(self, name: str, *, temporary: bool = False) -> tuple[CreatedSlot, Any]:
        """Create a slot exporting its snapshot; returns the slot and the replication connection.

        The snapshot lives only while that connection is open and idle, so it is handed to
        the caller, who closes it after the copy. ``idle_in_transaction_session_timeout``
        is turned off for it, because that timeout would otherwise end the holder mid-copy.
        """
        repl_conn = self.get_replication_conn(options=SNAPSHOT_HOLDER_OPTIONS)
        try:
            return replication.create_slot_with_snapshot(repl_conn, name, temporary=temporary), repl_conn
        except BaseException:
            repl_conn.close()
            raise

    def describe_slot(self, name: str) -> SlotInfo:
        with self.connection() as conn:
            return replication.describe_slot(conn, name)

    def list_slots(self, *, this_database_only: bool = True) -> list[SlotInfo]:
        with self.connection() as conn:
            database = conn.get_dsn_parameters().get("dbname") if this_database_only else None
            return replication.list_slots(conn, database=database)

    def slot_lag_bytes(self, name: str) -> int:
        with self.connection() as conn:
            return replication.slot_lag_bytes(conn, name)

    def advance_slot(self, name: str, lsn: Lsn | str, *, whole: bool = False) -> Lsn:
        """Advance the slot's confirmed position (never backwards); returns the new position.

        ``whole``: refuse (``SlotShortOfBatchError``) rather than stop short of ``lsn``."""
        with self.connection() as conn:
            return replication.advance_slot(conn, name, Lsn(lsn), whole=whole)

    def drop_slot(self, name: str, *, if_exists: bool = True) -> bool:
        with self.connection() as conn:
            return replication.drop_slot(conn, name, if_exists=if_exists)

    async def aconnection_params(self) -> dict[str, Any]:
        """:meth:`connection_params` for an event loop (a trigger): the lookup does not block it.

        Contains the password: never log it, and never put it in trigger kwargs (triggers take
        the connection id and call this where they run).
        """
        # Imported here: only triggers need it. common-compat (a declared dependency)
        # picks the non-blocking lookup each Airflow version offers (aget_connection, aextra_dejson).
        from airflow.providers.common.compat.connection import get_async_connection, get_async_extra_dejson

        conn = await get_async_connection(self.postgres_conn_id, hook=self)
        return self._libpq_params(conn, await get_async_extra_dejson(conn))

    def slot_health(
        self, name: str, publications: Sequence[str] = (), *, previous: SlotHealth | None = None
    ) -> SlotHealth:
        """Measure a slot: lag, WAL safety, spill/stream counters, and with ``publications`` the
        age of its oldest unconfirmed change (see :mod:`airflow_provider_postgres_cdc.engine.health.measure`;
        ``previous``, the last measurement of a repeated check, spares a peek when still valid)."""
        from airflow_provider_postgres_cdc.engine.health import assess_slot

        with self.connection() as conn:
            return assess_slot(conn, name, publications, previous=previous)

    def all_slot_health(self, publications: Sequence[str] = ()) -> list[SlotHealth]:
        """:meth:`slot_health` of every slot on the server (ages only for this database's slots)."""
        from airflow_provider_postgres_cdc.engine.health import assess_slots

        with self.connection() as conn:
            return assess_slots(conn, publications)
