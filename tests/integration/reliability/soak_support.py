"""The crash soak's pipeline: the soak workload, writers racing the steps, crashes, and the audits.

``SoakPipeline`` runs the pipeline's own steps in this process (``drain_batch`` with the SQL peek
or protocol 2 streaming, picked per drain; the apply job's ``apply_manifest``; the ack's check
and ``advance_slot``), and each crash exactly as a killed worker leaves it: a drain SIGKILLed in
its own process, the apply job submitted with ``spark-submit`` (as the operator submits it) and
its process group SIGKILLed, ``airflow dags test`` of the CDC DAG SIGKILLed with its tasks and
spark-submit, an apply whose ack never ran, an apply run twice, and a re-snapshot of one table
from a temporary slot racing the CDC apply. Recovery is what a user does: run the round (drain,
apply, ack) again. Two more kinds (``LATER_CRASHES``) draw from a random source of their own: a
batch applied and not acknowledged whose staging is lost, so that the next drain reads a longer
window from the same slot position; and the initial snapshot SIGKILLed during its copy (its own
process) or its load (the spark-submit job), then simply run again.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from random import Random

import psycopg2
import pyarrow.parquet as pq
from pyiceberg.exceptions import NoSuchTableError
from pyspark.sql import SparkSession

from airflow_provider_postgres_cdc.engine.drain import DrainSettings, Transport, drain_batch
from airflow_provider_postgres_cdc.engine.lake_catalog import open_catalog, unapplied_tables
from airflow_provider_postgres_cdc.engine.snapshot import rerun_snapshot, take_snapshot
from airflow_provider_postgres_cdc.engine.staging import read_manifest
from airflow_provider_postgres_cdc.errors import ResnapshotNeededError, SlotActiveError, SlotExistsError
from airflow_provider_postgres_cdc.formats.lake import LakeConfig, local_lake
from airflow_provider_postgres_cdc.formats.lsn import Lsn
from airflow_provider_postgres_cdc.formats.manifest import Manifest
from airflow_provider_postgres_cdc.hooks.lake import connection_json
from airflow_provider_postgres_cdc.replication import connect, describe_slot, peek_calls
from airflow_provider_postgres_cdc.spark.apply_batch import apply_manifest
from airflow_provider_postgres_cdc.spark.session import register_lake
from airflow_provider_postgres_cdc.testing import AirflowSandbox
from tests.integration.e2e.e2e_support import SPARK_LOCAL, pipeline_conf, spark_submit_command
from tests.integration.fidelity.steps import acknowledge
from tests.integration.fidelity.workload import Transaction

SLOT = "soak"
CRASHES = ["drain_kill", "apply_kill", "dag_kill", "ack_lost", "apply_twice", "resnapshot_race"]
# Drawn from the seed's fault source (``SoakPipeline.faults``), so each seed keeps what it drew of
# CRASHES: a CDC round's crash is "staging_lost" one time in len(CRASHES) + 1, and the initial
# snapshot is killed half the time, during its copy or its load.
LATER_CRASHES = ["staging_lost", "snapshot_kill_copy", "snapshot_kill_load"]
SHORT_WINDOWS = [10, 50, 200]  # max_messages of the drain whose staging is lost
TRANSPORTS: list[Transport] = ["peek", "stream"]  # each drain picks one: SQL peek, or protocol 2 streaming
# The peek's first call, drawn per drain: small ones split even a soak batch into several calls.
FIRST_PEEK_CALLS = [20, 200, peek_calls.FIRST_CALL_MESSAGES]
CDC_DAG = "postgres_cdc_microbatch"
CHANGE_KEY = ("_pgl_commit_lsn", "_pgl_seq")

# One drain, run in its own process so that it can be SIGKILLed mid-window.
DRAIN_SCRIPT = """
import json, sys
from airflow_provider_postgres_cdc.engine.drain import DrainSettings, drain_batch
from airflow_provider_postgres_cdc.replication import peek_calls
args = json.loads(sys.argv[1])
peek_calls.FIRST_CALL_MESSAGES = args["first_call"]
settings = DrainSettings(
    args["slot"], (args["publication"],), args["staging"], transport=args["transport"], chunk_bytes=4096
)
drain_batch(args["dsn"], settings)
"""
# The initial snapshot's copy, run in its own process so that it can be SIGKILLed mid-copy.
SNAPSHOT_SCRIPT = """
import json, sys
from airflow_provider_postgres_cdc.engine.snapshot import take_snapshot
args = json.loads(sys.argv[1])
take_snapshot(args["dsn"], args["slot"], [args["publication"]], args["staging"])
"""


def backfill_table(message: str) -> str:
    """The table a ``ResnapshotNeededError`` names, read from the backfill command it prints."""
    match = re.search(r"--conf ('(?:[^']|'\"'\"')*')", message)  # shell-quoted: it's is 'it'"'"'s'
    if match is None:
        raise AssertionError(f"the re-snapshot error names no backfill command: {message}")
    tables = json.loads(shlex.split(match.group(1))[0])["tables"]
    assert len(tables) == 1, message
    return str(tables[0])


class Writer(threading.Thread):
    """Commits a round's transactions, in order, on one connection, while the pipeline runs."""

    def __init__(self, dsn: str, transactions: list[Transaction], script: Path, rng: Random) -> None:
        super().__init__(name="soak-writer", daemon=True)
        self.dsn = dsn
        self.transactions = transactions
        self.script = script
        self.pauses = [rng.uniform(0.0, 0.6) for _ in transactions]
        self.error: BaseException | None = None
        self.halfway = threading.Event()  # half the transactions are committed (or the writer failed)

    def run(self) -> None:
        try:
            conn = psycopg2.connect(self.dsn)
            conn.autocommit = True  # BEGIN / COMMIT / ROLLBACK are statements of the workload
            try:
                with conn.cursor() as cur, self.script.open("a") as log:
                    for done, (transaction, pause) in enumerate(
                        zip(self.transactions, self.pauses, strict=True)
                    ):
                        if 2 * done >= len(self.transactions):
                            self.halfway.set()
                        time.sleep(pause)
                        for statement in transaction:
                            text = statement.as_string(conn)
                            log.write(text + ";\n")
                            cur.execute(text)
            finally:
                conn.close()
        except BaseException as exc:  # re-raised by finish() in the test's thread
            self.error = exc
        finally:
            self.halfway.set()

    def finish(self) -> None:
        self.join(timeout=300)
        if self.is_alive():
            raise AssertionError("the writer did not finish within 300 s")
        if self.error is not None:
            raise AssertionError(f"the writer failed: {self.error}") from self.error


@dataclass
class SoakPipeline:
    """One seed's pipeline, its crash log and its slot audit."""

    spark: SparkSession
    dsn: str
    publication: str
    root: Path
    rng: Random
    sandbox: AirflowSandbox  # for the DAG run that ``dag_kill`` kills; its connections are set here
    source_uri: str
    faults: Random  # the LATER_CRASHES' own random source
    lake: LakeConfig = field(init=False)
    staging: Path = field(init=False)
    crashes: list[str] = field(default_factory=list)
    positions: list[Lsn] = field(default_factory=list)  # confirmed_flush_lsn after every step
    resnapshots: dict[str, Lsn] = field(default_factory=dict)  # table -> latest consistent point
    backfills: list[str] = field(default_factory=list)  # tables the apply asked to re-snapshot
    changes: int = 0

    def __post_init__(self) -> None:
        self.staging = self.root / "staging"
        (self.root / "lake").mkdir(parents=True, exist_ok=True)
        self.lake = local_lake(str(self.root / "lake"), catalog=f"soak_{self.root.name[-8:]}")
        register_lake(self.spark, self.lake)
        self.sandbox.connections = {
            "soak": self.source_uri,
            "spark_local": SPARK_LOCAL,
            "lake": connection_json(self.lake),
        }

    # --- the pipeline's steps -------------------------------------------------------------------

    def snapshot(self) -> None:
        """The initial snapshot DAG: its copy, then its load (a re-run converges whatever died)."""
        apply_manifest(self.spark, self.snapshot_copy(), self.lake)
        self.audit("snapshot")

    def snapshot_copy(self) -> str:
        """The snapshot task, as the operator runs it again when its slot exists; the manifest's URI."""
        try:
            return take_snapshot(self.dsn, SLOT, [self.publication], str(self.staging))[0]
        except SlotExistsError as exc:
            rerun = rerun_snapshot(self.dsn, SLOT, str(self.staging), exc, lake=self.lake)
        if rerun.staged is not None:
            return rerun.staged[0]
        assert rerun.action == "restart", rerun.reason
        return take_snapshot(self.dsn, SLOT, [self.publication], str(self.staging))[0]

    def drain(self, max_messages: int | None = None, rng: Random | None = None) -> tuple[Manifest, str]:
        """The drain task with its retries: a killed drain's backend may hold the slot a moment."""
        rng = rng or self.rng
        transport = rng.choice(TRANSPORTS)
        settings = DrainSettings(SLOT, (self.publication,), str(self.staging), transport=transport)
        if max_messages is not None:
            settings = replace(settings, max_messages=max_messages)
        deadline = time.monotonic() + 60
        default_first, peek_calls.FIRST_CALL_MESSAGES = (
            peek_calls.FIRST_CALL_MESSAGES,
            rng.choice(FIRST_PEEK_CALLS),
        )
        try:
            while True:
                try:
                    result = drain_batch(self.dsn, settings)
                    break
                except SlotActiveError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.5)
        finally:
            peek_calls.FIRST_CALL_MESSAGES = default_first
        if not result.reused:
            self.changes += result.manifest.stats.changes
        return result.manifest, result.manifest_uri

    def apply(self, manifest: Manifest, uri: str) -> None:
        """The apply task; when it stops for a re-snapshot, the user's fix: the backfill, then a re-run."""
        if not manifest.tables:  # the apply operator skips an empty batch
            return
        for _ in range(len(manifest.tables) + 1):
            try:
                apply_manifest(self.spark, uri, self.lake)
                return
            except ResnapshotNeededError as exc:  # e.g. DROP and ADD COLUMN with no change between
                table = backfill_table(str(exc))
                self.backfills.append(table)
                self.resnapshot(table)
        raise AssertionError(f"batch {manifest.batch_id} still needs re-snapshots after {self.backfills}")

    def resnapshot(self, table: str) -> None:
        """The backfill DAG: a snapshot of one table from a temporary slot, loaded."""
        path, snap = take_snapshot(
            self.dsn, SLOT, [self.publication], str(self.staging), tables=[table], slot_mode="temporary"
        )
        apply_manifest(self.spark, path, self.lake)
        self.resnapshots[table] = max(snap.end_lsn, self.resnapshots.get(table, snap.end_lsn))

    def ack(self, manifest: Manifest) -> None:
        acknowledge(self.dsn, SLOT, self.lake, manifest)

    def round(self) -> Manifest:
        """One CDC run, as the DAG runs it (and as a user re-runs it after a crash)."""
        manifest, uri = self.drain()
        self.apply(manifest, uri)
        self.ack(manifest)
        self.audit("round")
        return manifest

    # --- crashes: each leaves the pipeline as a killed worker would, then audits the slot -------

    def crash(self, kind: str) -> None:
        crashes: dict[str, Callable[[], str]] = {
            "drain_kill": self._drain_kill,
            "apply_kill": self._apply_kill,
            "dag_kill": self._dag_kill,
            "ack_lost": self._ack_lost,
            "apply_twice": self._apply_twice,
            "resnapshot_race": self._resnapshot_race,
            "staging_lost": self._staging_lost,
            "snapshot_kill_copy": self._snapshot_kill_copy,
            "snapshot_kill_load": self._snapshot_kill_load,
        }
        self.crashes.append(crashes[kind]())
        self.audit(kind)

    def _drain_kill(self) -> str:
        """SIGKILL the drain after its first staged part file, or after a random delay."""
        args = {
            "dsn": self.dsn, "slot": SLOT, "publication": self.publication, "staging": str(self.staging),
            "transport": self.rng.choice(TRANSPORTS), "first_call": self.rng.choice(FIRST_PEEK_CALLS),
        }  # fmt: skip
        wait_for_part = self.rng.random() < 0.5
        delay = self.rng.uniform(0.05, 1.0)
        started = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-c", DRAIN_SCRIPT, json.dumps(args)], start_new_session=True
        )
        parts: list[Path] = []
        while proc.poll() is None:
            parts = [  # of the batch being written: earlier batches are complete (with a manifest)
                p
                for p in (self.staging / SLOT).glob("batch-*/*/part-*.parquet")
                if not (p.parent.parent / "_manifest.json").exists()
            ]
            if (parts if wait_for_part else time.monotonic() - started >= delay) or (
                time.monotonic() - started > 120
            ):
                break
            time.sleep(0.01)
        if proc.poll() is not None:
            return (
                f"drain_kill: drain finished first ({time.monotonic() - started:.1f} s, rc {proc.returncode})"
            )
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        trigger = "after its first part file" if wait_for_part else "at a random delay"
        took = time.monotonic() - started
        return f"drain_kill: SIGKILL {trigger}, {took:.1f} s in, {len(parts)} part(s) staged"

    def _apply_kill(self) -> str:
        """SIGKILL the spark-submit apply's process group after its first table commits, or a delay."""
        manifest, uri = self.drain()
        if not manifest.tables:
            return "apply_kill: empty batch, nothing to kill"
        return "apply_kill: " + self._kill_apply(manifest, uri, self.rng)

    def _kill_apply(self, manifest: Manifest, uri: str, rng: Random) -> str:
        """Submit the apply job of ``manifest`` and SIGKILL its process group after its first table
        commits, or at a random delay; says how it went."""
        pending = len(unapplied_tables(self.lake, manifest))
        after_commit = rng.random() < 0.5
        delay = rng.uniform(5.0, 40.0)
        started = time.monotonic()
        with tempfile.TemporaryDirectory() as scratch:
            args, env = spark_submit_command(uri, self.lake, scratch)
            proc = subprocess.Popen(
                args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
            )
            left = pending
            while proc.poll() is None and time.monotonic() - started < 300:
                if after_commit:
                    left = len(unapplied_tables(self.lake, manifest))
                    if left < pending:
                        break
                elif time.monotonic() - started >= delay:
                    break
                time.sleep(0.2)
            if proc.poll() is not None:
                return f"job ended first (rc {proc.returncode}, {time.monotonic() - started:.1f} s)"
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        left = len(unapplied_tables(self.lake, manifest))
        trigger = "after its first table committed" if after_commit else "at a random delay"
        return (
            f"SIGKILL of the process group {trigger}, {time.monotonic() - started:.1f} s in, "
            f"{pending - left}/{pending} tables committed"
        )

    def _dag_kill(self) -> str:
        """SIGKILL ``airflow dags test`` of the CDC DAG (its process group: the tasks and spark-submit).

        At a random delay, a moment after its drain staged the batch, or after the batch's first
        table committed: wherever the run is, the kill leaves it as a dead worker machine would.
        """
        self.sandbox.migrate()
        trigger = self.rng.choice(["delay", "staged", "committed"])
        delay = self.rng.uniform(3.0, 30.0) if trigger == "delay" else self.rng.uniform(0.0, 10.0)
        conf = pipeline_conf(SLOT, self.staging, conn_id="soak", publication=self.publication)
        before = {d for d, _ in self.batches()}
        airflow = str(Path(sys.executable).with_name("airflow"))
        started = time.monotonic()
        staged: Manifest | None = None
        staged_at = started
        with (self.root / "dag-runs.log").open("a") as log:
            proc = subprocess.Popen(
                [airflow, "dags", "test", CDC_DAG, "--conf", json.dumps(conf)],
                env=self.sandbox.environment(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        while proc.poll() is None and time.monotonic() - started < 300:
            now = time.monotonic()
            if staged is None:
                new = [m for d, m in self.batches() if d not in before]
                if new:
                    staged, staged_at = new[0], now
                    self.changes += staged.stats.changes
            if trigger == "delay" and now - started >= delay:
                break
            if trigger == "staged" and staged is not None and now - staged_at >= delay:
                break
            if (
                trigger == "committed"
                and staged is not None
                and staged.tables
                and len(unapplied_tables(self.lake, staged)) < len(staged.tables)
            ):
                break
            time.sleep(0.2)
        took = time.monotonic() - started
        if proc.poll() is not None:
            return f"dag_kill: the DAG run ended first (rc {proc.returncode}, {took:.1f} s, {trigger})"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        if staged is None:
            return f"dag_kill: SIGKILL ({trigger}) {took:.1f} s in, before the drain staged a batch"
        left = len(unapplied_tables(self.lake, staged)) if staged.tables else 0
        return (
            f"dag_kill: SIGKILL ({trigger}) {took:.1f} s in, batch {staged.batch_id} staged, "
            f"{len(staged.tables) - left}/{len(staged.tables)} tables committed"
        )

    def _staging_lost(self) -> str:
        """A short batch applied, not acknowledged, and its staged files lost (a lifecycle rule, the
        retention, a changed staging path): the recovery round reads a longer window from there."""
        max_messages = self.faults.choice(SHORT_WINDOWS)
        manifest, uri = self.drain(max_messages, self.faults)
        self.apply(manifest, uri)
        shutil.rmtree(self.staging / SLOT / manifest.batch_id)
        self.changes -= manifest.stats.changes  # the longer window drains them again
        return (
            f"staging_lost: batch {manifest.batch_id} of {manifest.stats.changes} changes "
            f"(max_messages {max_messages}) applied, not acknowledged, its staging deleted"
        )

    def _snapshot_kill_copy(self) -> str:
        """SIGKILL the initial snapshot's copy after its first part file, or at a random delay (before
        its slot exists, perhaps); then the user's re-run of the snapshot DAG."""
        args = {"dsn": self.dsn, "slot": SLOT, "publication": self.publication, "staging": str(self.staging)}
        wait_for_part = self.faults.random() < 0.5
        delay = self.faults.uniform(0.05, 1.0)
        started = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-c", SNAPSHOT_SCRIPT, json.dumps(args)], start_new_session=True
        )
        parts: list[Path] = []
        while proc.poll() is None and time.monotonic() - started < 120:
            parts = list((self.staging / SLOT).glob("snapshot-*/*/part-*.parquet"))
            if parts if wait_for_part else time.monotonic() - started >= delay:
                break
            time.sleep(0.01)
        took = time.monotonic() - started
        if proc.poll() is not None:
            outcome = f"the copy finished first ({took:.1f} s, rc {proc.returncode})"
        else:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            trigger = "after its first part file" if wait_for_part else "at a random delay"
            outcome = f"SIGKILL {trigger}, {took:.1f} s in, {len(parts)} part(s) staged"
        self.snapshot()
        return f"snapshot_kill_copy: {outcome}; re-run"

    def _snapshot_kill_load(self) -> str:
        """SIGKILL the initial snapshot's load (the spark-submit job); then the user's re-run."""
        uri = self.snapshot_copy()
        outcome = self._kill_apply(read_manifest(uri), uri, self.faults)
        self.snapshot()
        return f"snapshot_kill_load: {outcome}; re-run"

    def _ack_lost(self) -> str:
        manifest, uri = self.drain()
        self.apply(manifest, uri)
        return f"ack_lost: batch {manifest.batch_id} applied, not acknowledged"

    def _apply_twice(self) -> str:
        manifest, uri = self.drain()
        self.apply(manifest, uri)
        self.apply(manifest, uri)
        self.ack(manifest)
        return f"apply_twice: batch {manifest.batch_id} applied twice, acknowledged"

    def _resnapshot_race(self) -> str:
        """A re-snapshot of one table (temporary slot) loaded while the CDC apply of a batch runs."""
        manifest, uri = self.drain()
        conn = connect(self.dsn)
        try:
            with conn.cursor() as cur:
                cur.execute(
                    "SELECT schemaname::text || '.' || tablename::text FROM pg_publication_tables "
                    "WHERE pubname = %s ORDER BY 1",
                    (self.publication,),
                )
                table = self.rng.choice([r[0] for r in cur.fetchall()])
        finally:
            conn.close()
        errors: list[BaseException] = []

        def resnapshot() -> None:
            try:
                self.resnapshot(table)
            except BaseException as exc:  # re-raised below
                errors.append(exc)

        racer = threading.Thread(target=resnapshot, name="soak-resnapshot")
        racer.start()
        self.apply(manifest, uri)
        racer.join(timeout=600)
        if errors:
            raise AssertionError(f"the re-snapshot of {table} failed: {errors[0]}") from errors[0]
        self.ack(manifest)
        return f"resnapshot_race: {table} re-snapshotted while batch {manifest.batch_id} applied"

    # --- audits ---------------------------------------------------------------------------------

    def confirmed(self) -> Lsn:
        conn = connect(self.dsn)
        try:
            position = describe_slot(conn, SLOT).confirmed_flush_lsn
        finally:
            conn.close()
        assert position is not None
        return position

    def batches(self) -> list[tuple[Path, Manifest]]:
        """Every complete staged batch (a half-written one has no manifest)."""
        return [
            (d, read_manifest(str(d / "_manifest.json")))
            for d in sorted((self.staging / SLOT).glob("batch-*"))
            if (d / "_manifest.json").exists()
        ]

    def audit(self, step: str) -> None:
        """The slot never goes backwards, and never passes a batch not committed to all its tables."""
        position = self.confirmed()
        if self.positions and position < self.positions[-1]:
            raise AssertionError(f"after {step}: the slot went backwards, {self.positions[-1]} -> {position}")
        self.positions.append(position)
        for _, manifest in self.batches():
            if manifest.end_lsn <= position:
                missing = unapplied_tables(self.lake, manifest)
                if missing:
                    raise AssertionError(
                        f"after {step}: the slot is at {position}, past batch {manifest.batch_id} "
                        f"(end {manifest.end_lsn}), which {missing} do not hold"
                    )

    def changelog_problems(self, tables: list[tuple[str, str]]) -> list[str]:
        """Every staged change in its table's changelog exactly once.

        A re-snapshotted table's changelog starts again at the re-snapshot's consistent point:
        there, only the staged changes at or above it must be logged (still once each).
        """
        staged: dict[tuple[str, str], Counter[tuple[int, int]]] = {t: Counter() for t in tables}
        for batch_dir, manifest in self.batches():
            for entry in manifest.tables:
                for part in entry.files:  # the manifest's change files (not its missing-values file)
                    keys = pq.read_table(batch_dir / part, columns=list(CHANGE_KEY)).to_pydict()
                    staged[(entry.schema, entry.table)].update(zip(*keys.values(), strict=True))
        catalog = open_catalog(self.lake)
        problems = []
        for schema, table in tables:
            try:
                log = catalog.load_table(self.lake.changelog_identifier(schema, table))
                logged = Counter(
                    zip(*log.scan(selected_fields=CHANGE_KEY).to_arrow().to_pydict().values(), strict=True)
                )
            except NoSuchTableError:
                logged = Counter()
            expected = staged[(schema, table)]
            point = self.resnapshots.get(f"{schema}.{table}")
            if point is not None:
                expected = Counter({k: n for k, n in expected.items() if k[0] >= int(point)})
                logged = Counter({k: n for k, n in logged.items() if k[0] >= int(point)})
            twice = [k for k, n in logged.items() if n > 1]
            missing = expected - logged
            extra = logged - expected
            if twice or missing or extra:
                problems.append(
                    f"changelog of {schema}.{table}: {len(twice)} changes logged more than once, "
                    f"{sum(missing.values())} staged but not logged, "
                    f"{sum(extra.values())} logged but not staged"
                )
        return problems
