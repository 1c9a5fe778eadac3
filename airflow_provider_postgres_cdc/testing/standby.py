"""A hot standby of a test-kit cluster, on the same machine: for failover and standby-decoding tests.

:class:`PostgresStandby` copies a running :class:`~.postgres.PostgresCluster` with
``pg_basebackup`` through a physical slot on the primary, and streams from it as a hot standby
with ``hot_standby_feedback``. From PostgreSQL 17 it also synchronizes the primary's failover
slots (``sync_replication_slots``; ``primary_conninfo`` names a database for that), and
:meth:`PostgresStandby.guard_failover_slots` makes the primary hold logical consumers back until
this standby has the WAL (``synchronized_standby_slots``). :meth:`PostgresStandby.promote` turns it
into a primary, e.g. after :meth:`PostgresCluster.kill` of the old one.

Example::

    with PostgresCluster(major=18) as primary, PostgresStandby(primary) as standby:
        standby.guard_failover_slots()
        ...
        primary.kill()
        standby.promote()
"""

from __future__ import annotations

import os
import pwd
import time
from collections.abc import Mapping

from psycopg2 import sql

from airflow_provider_postgres_cdc.testing.postgres import PostgresCluster

__all__ = ["PostgresStandby"]

FAILOVER_SLOTS_MAJOR = 17


class PostgresStandby(PostgresCluster):
    """A physical hot standby of ``primary`` (started, on its own port and directory).

    :param primary: the running cluster to copy and follow.
    :param physical_slot: the physical slot on the primary that keeps this standby's WAL and
        carries its ``hot_standby_feedback``; created when missing.
    :param settings: ``postgresql.conf`` overrides on top of the standby settings.
    """

    def __init__(
        self,
        primary: PostgresCluster,
        *,
        physical_slot: str = "standby_physical",
        settings: Mapping[str, str] | None = None,
    ) -> None:
        if not primary.running:
            raise RuntimeError("start the primary before its standby")
        conninfo = primary.dsn("postgres").replace("'", "\\'")
        standby = {
            **primary.settings,
            "hot_standby": "on",
            "hot_standby_feedback": "on",
            "primary_slot_name": f"'{physical_slot}'",
            "primary_conninfo": f"'{conninfo} application_name=standby'",
        }
        if primary.major >= FAILOVER_SLOTS_MAJOR:
            standby["sync_replication_slots"] = "on"
        super().__init__({**standby, **(settings or {})}, bindir=primary.bindir, superuser=primary.superuser)
        self.primary = primary
        self.physical_slot = physical_slot

    def _create_datadir(self) -> None:
        """The primary's data directory as ``pg_basebackup`` copies it, marked as a standby."""
        exists = self.primary.execute(
            sql.SQL("SELECT count(*) FROM pg_replication_slots WHERE slot_name = {}").format(
                sql.Literal(self.physical_slot)
            )
        )[0][0]
        if not exists:
            self.primary.execute(
                sql.SQL("SELECT pg_create_physical_replication_slot({}, true)").format(
                    sql.Literal(self.physical_slot)
                )
            )
        self._run(
            [
                str(self.bindir / "pg_basebackup"),
                "-d",
                self.primary.dsn("postgres"),
                "-D",
                str(self.datadir),
                "-X",
                "stream",
                "-S",
                self.physical_slot,
                "--checkpoint=fast",
                "--no-sync",
            ]
        )
        signal_file = self.datadir / "standby.signal"
        signal_file.touch()
        if self._run_as:
            owner = pwd.getpwnam(self._run_as)
            os.chown(signal_file, owner.pw_uid, owner.pw_gid)

    def guard_failover_slots(self) -> None:
        """Make the primary send logical changes only once this standby has them.

        ``synchronized_standby_slots`` names this standby's physical slot: a failover slot is then
        never ahead of its synchronized copy here (PostgreSQL 17+).
        """
        self.primary.execute(
            sql.SQL("ALTER SYSTEM SET synchronized_standby_slots = {}").format(
                sql.Literal(self.physical_slot)
            )
        )
        self.primary.execute("SELECT pg_reload_conf()")

    def wait_replayed(self, timeout: float = 30.0) -> None:
        """Wait until this standby has replayed everything the primary has flushed so far."""
        target = self.primary.execute("SELECT pg_current_wal_flush_lsn()::text")[0][0]
        self.wait_for(
            sql.SQL("SELECT pg_last_wal_replay_lsn() >= {}::pg_lsn").format(sql.Literal(target)),
            timeout=timeout,
        )

    def slot_sync_ready(self, slot: str, dbname: str) -> bool:
        """Whether ``slot`` is synchronized here, persistent, and at the primary's confirmed position.

        A synchronized slot stays temporary (dropped at promotion) until the primary's slot has
        moved its ``restart_lsn`` and ``catalog_xmin`` past what this standby holds. A slot moves
        them only when it consumes past a ``running_xacts`` record (a checkpoint, the bgwriter
        about every 15 s, or ``pg_log_standby_snapshot()``): an acknowledged batch after such a
        record makes a pipeline's slot sync-ready.
        """
        confirmed = self.primary.execute(
            sql.SQL("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = {}").format(
                sql.Literal(slot)
            ),
            dbname,
        )
        if not confirmed:
            return False
        rows = self.execute(
            sql.SQL(
                "SELECT synced AND NOT temporary AND confirmed_flush_lsn >= {}::pg_lsn "
                "FROM pg_replication_slots WHERE slot_name = {}"
            ).format(sql.Literal(confirmed[0][0]), sql.Literal(slot)),
            dbname,
        )
        return bool(rows and rows[0][0])

    def wait_slot_sync_ready(self, slot: str, dbname: str, timeout: float = 10.0) -> bool:
        """Poll :meth:`slot_sync_ready` for up to ``timeout`` seconds; whether it became true.

        The slot sync worker naps between rounds (up to 30 s while nothing changes), so a copy
        catches up with the primary's last acknowledgement a moment after it.
        """
        deadline = time.monotonic() + timeout
        while not self.slot_sync_ready(slot, dbname):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.2)
        return True

    def hold_slot_sync(self, timeout: float = 30.0) -> None:
        """Stop synchronizing slots here: the copies stay where they are from now on.

        As when the primary's last acknowledgements never reached this standby before a failover:
        ``sync_replication_slots`` is turned off and the slot sync worker waited for until it
        exits. The copies already sync-ready survive a promotion.
        """
        self.execute("ALTER SYSTEM SET sync_replication_slots = off")
        self.execute("SELECT pg_reload_conf()")
        self.wait_for(
            "SELECT count(*) = 0 FROM pg_stat_activity WHERE backend_type = 'slotsync worker'",
            timeout=timeout,
        )

    def promote(self, timeout: int = 60) -> None:
        """``pg_ctl promote``: end recovery; this server then accepts writes on a new timeline."""
        self._run([str(self.bindir / "pg_ctl"), "-D", str(self.datadir), "-w", "-t", str(timeout), "promote"])
