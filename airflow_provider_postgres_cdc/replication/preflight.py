"""Preflight: is this server and role ready for logical replication? Each gap is one specific error."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from airflow_provider_postgres_cdc.errors import (
    PrerequisiteError,
    PrivilegeError,
    ReplicationCapacityError,
    ServerVersionError,
    WalLevelError,
)
from airflow_provider_postgres_cdc.replication.connection import RAW_SERVER_ENCODING

# Row filters and column lists in publications arrived in PostgreSQL 15.
MIN_SERVER_VERSION = 150000

_PREFLIGHT_SQL = """
SELECT current_setting('server_version_num')::int,
       current_setting('server_version'),
       current_setting('wal_level'),
       current_setting('max_replication_slots')::int,
       (SELECT count(*) FROM pg_replication_slots)::int,
       current_setting('max_wal_senders')::int,
       (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'walsender')::int,
       current_user,
       r.rolsuper,
       r.rolreplication,
       r.rolcanlogin,
       current_setting('server_encoding'),
       current_setting('client_encoding'),
       current_database()
FROM pg_roles r
WHERE r.rolname = current_user
"""


@dataclass(frozen=True, slots=True)
class PreflightReport:
    """What the server and role look like, as far as logical replication is concerned."""

    server_version_num: int
    server_version: str
    wal_level: str
    max_replication_slots: int
    used_replication_slots: int
    max_wal_senders: int
    used_wal_senders: int
    role: str
    is_superuser: bool
    has_replication: bool
    can_login: bool
    server_encoding: str
    client_encoding: str
    database: str

    def problems(self) -> list[PrerequisiteError]:
        """Every unmet prerequisite, each as the exception that explains its fix."""
        found: list[PrerequisiteError] = []
        if self.server_version_num < MIN_SERVER_VERSION:
            found.append(
                ServerVersionError(
                    f"PostgreSQL {self.server_version} is too old: version 15 or later is required "
                    "(publication row filters and column lists). Upgrade the server."
                )
            )
        if self.wal_level != "logical":
            found.append(
                WalLevelError(
                    f"wal_level is '{self.wal_level}', logical decoding needs 'logical'. Run "
                    "\"ALTER SYSTEM SET wal_level = 'logical';\" as a superuser and restart the server "
                    "(a reload is not enough)."
                )
            )
        if self.used_replication_slots >= self.max_replication_slots:
            found.append(
                ReplicationCapacityError(
                    f"all {self.max_replication_slots} replication slots are in use "
                    f"(max_replication_slots). Drop unused slots (see 'pgcdc slots') or run "
                    f"'ALTER SYSTEM SET max_replication_slots = {self.max_replication_slots + 10};' "
                    "and restart the server."
                )
            )
        if self.used_wal_senders >= self.max_wal_senders:
            found.append(
                ReplicationCapacityError(
                    f"all {self.max_wal_senders} WAL senders are busy (max_wal_senders). Run "
                    f"'ALTER SYSTEM SET max_wal_senders = {self.max_wal_senders + 10};' "
                    "and restart the server."
                )
            )
        if not self.can_login:
            found.append(PrivilegeError(f'role "{self.role}" cannot log in: ALTER ROLE "{self.role}" LOGIN;'))
        if not (self.is_superuser or self.has_replication):
            found.append(
                PrivilegeError(
                    f'role "{self.role}" has neither REPLICATION nor SUPERUSER, which creating and reading '
                    f'replication slots require. As a superuser run: ALTER ROLE "{self.role}" REPLICATION;'
                )
            )
        return found

    def warnings(self) -> list[str]:
        """What works, but not as a user may expect: said before the first load, not after."""
        found: list[str] = []
        if self.server_encoding == RAW_SERVER_ENCODING:
            found.append(
                f"database {self.database!r} is SQL_ASCII: the server stores text as unchecked bytes. "
                "Valid UTF-8 is staged as it is; any other byte is staged as the code point "
                "U+10FE00 + byte, exactly and recoverably (docs/FORMATS.md, 'Text from a SQL_ASCII "
                "database'). Names that are not valid UTF-8 stop the load: rename them. Converting "
                "the database to UTF8 (dump, then restore into a UTF8 database) avoids both."
            )
        return found

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def inspect_prerequisites(conn: Any) -> PreflightReport:
    """Read the facts preflight judges, raising nothing (for display by the CLI)."""
    with conn.cursor() as cur:
        cur.execute(_PREFLIGHT_SQL)
        row = cur.fetchone()
    if row is None:
        raise PrivilegeError("current_user has no pg_roles entry; cannot check prerequisites")
    return PreflightReport(*row)


def check_prerequisites(conn: Any) -> PreflightReport:
    """Raise the first unmet prerequisite's specific error; return the report when all are met."""
    report = inspect_prerequisites(conn)
    problems = report.problems()
    if problems:
        first = problems[0]
        if len(problems) > 1:
            rest = "; ".join(str(p) for p in problems[1:])
            first.args = (f"{first.args[0]} (also: {rest})",)
        raise first
    return report
