"""The bad-input catalogue: every error a user can meet, caused for real, with the words its message
must hold (the fix among them). README.md's "Troubleshooting" table is checked against CATALOGUE.

Each case runs what a user runs (an engine function, an operator, the ``pgcdc`` command) against
the real server: the session's cluster, or a throwaway one where the server itself must be wrong
(``wal_level=replica``; a 1 MB ``max_slot_wal_keep_size`` to lose a slot). The Spark cases are marked
``spark``: run them under the machine's lock (``-m spark``), the others with ``-m "not spark"``.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from psycopg2 import sql

from airflow_provider_postgres_cdc.engine.drain import DrainResult, DrainSettings, drain_batch
from airflow_provider_postgres_cdc.engine.snapshot import SnapshotProgress, take_snapshot
from airflow_provider_postgres_cdc.errors import RECOVERY_DAG
from airflow_provider_postgres_cdc.formats.lake import LakeConfig
from airflow_provider_postgres_cdc.formats.lsn import Lsn
from airflow_provider_postgres_cdc.pgoutput.columnar import BatchDecoder
from airflow_provider_postgres_cdc.replication import connect, connect_replication, create_slot
from airflow_provider_postgres_cdc.testing import PostgresCluster, S3Server

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

README = Path(__file__).resolve().parents[3] / "README.md"
CAPTURES = Path(__file__).resolve().parents[2] / "data" / "pgoutput"


@dataclass(frozen=True, slots=True)
class BadInput:
    """One row of the catalogue: what is wrong, what the user runs, what they get, what to do.

    ``error`` is the exception's class name (or ``exit 1`` for the command); ``words`` must all be
    in its message; ``fix`` is the README's advice, in a sentence.
    """

    key: str
    cause: str
    operation: str
    error: str
    words: tuple[str, ...]
    fix: str
    spark: bool = False


CATALOGUE: tuple[BadInput, ...] = (
    BadInput(
        "wal-level",
        "`wal_level` is not `logical`",
        "`pgcdc check`",
        "exit 1",
        ("FAIL WalLevelError", "ALTER SYSTEM SET wal_level = 'logical';", "restart the server"),
        "Run `ALTER SYSTEM SET wal_level = 'logical';` as a superuser and restart PostgreSQL.",
    ),
    BadInput(
        "no-replication",
        "the role lacks the REPLICATION attribute",
        "snapshot, drain",
        "PrivilegeError",
        ("may not use replication", 'ALTER ROLE "catalogue_plain" REPLICATION;'),
        "As a superuser: `ALTER ROLE <role> REPLICATION;`.",
    ),
    BadInput(
        "no-select",
        "the role lacks SELECT on a published table",
        "snapshot",
        "PrivilegeError",
        (
            "lacks SELECT on published table public.closed_t",
            'GRANT SELECT ON public.closed_t TO "catalogue_copier";',
        ),
        "As the table's owner: `GRANT SELECT ON <table> TO <role>;`.",
    ),
    BadInput(
        "missing-slot",
        "the slot does not exist",
        "drain",
        "SlotNotFoundError",
        ("does not exist", "postgres_cdc_initial_snapshot", RECOVERY_DAG),
        f"A new pipeline: the initial snapshot creates it. A dropped slot: trigger `{RECOVERY_DAG}`.",
    ),
    BadInput(
        "active-slot",
        "another connection is streaming from the slot",
        "drain",
        "SlotActiveError",
        ("is active (pid", "max_active_runs=1"),
        "One consumer per slot: stop the other consumer; run the pipeline DAG with `max_active_runs=1`.",
    ),
    BadInput(
        "lost-slot",
        "the slot was invalidated (`wal_status = lost`, `max_slot_wal_keep_size` exceeded)",
        "drain",
        "SlotLostError",
        ("wal_status = lost", RECOVERY_DAG, "reloads every table"),
        f"Trigger `{RECOVERY_DAG}`: it recreates the slot and reloads every table.",
    ),
    BadInput(
        "missing-publication",
        "the publication does not exist in that database",
        "drain, snapshot",
        "PublicationNotFoundError",
        ("missing_pub", "not found in database", "CREATE PUBLICATION"),
        "Create it with `CREATE PUBLICATION` (or `PostgresCdcHook.create_publication`) in the source "
        "database.",
    ),
    BadInput(
        "unwritable-staging",
        "the staging location cannot be written (read-only, permissions, disk full)",
        "drain",
        "StagingNotWritableError",
        ("cannot create", "Read-only file system", "Check the staging location"),
        "Fix the staging location's permissions or mount; the slot did not move, so run the drain again.",
    ),
    BadInput(
        "refused-staging",
        "the staging bucket does not exist, or the object store refuses the staging connection's keys",
        "drain, snapshot, staging retention",
        "StagingAccessError",
        ("refused access to bucket 'staging'", "access key id and secret", "the slot did not move"),
        "Create the bucket or correct the `aws` connection named by `staging_conn_id` (key id, secret, "
        "endpoint); nothing moved, run the task again.",
    ),
    BadInput(
        "unreachable-catalog",
        "the lake connection points at a catalog that cannot be opened",
        "ack",
        "LakeCatalogError",
        ("cannot open Iceberg catalog", "check that the catalog is up and the lake connection's URL"),
        "Correct the lake connection (catalog type, URI, warehouse, credentials); the slot stays put.",
    ),
    BadInput(
        "refused-catalog",
        "the REST catalog refuses the lake connection's client id and secret, or is down",
        "apply, ack",
        "LakeCatalogError",
        ("lake connection 'catalogue_rest'", "cannot open Iceberg catalog", "URL, credentials"),
        "Correct the connection's login and password (OAuth2 client id and secret) or its host; the "
        "slot stays put, run the task again.",
    ),
    BadInput(
        "missing-warehouse",
        "the lake's `s3://` warehouse bucket does not exist",
        "apply, maintenance (before spark-submit); the Spark jobs",
        "LakeStorageError",
        (
            "bucket 'nowhere' of the lake's warehouse s3://nowhere/lake does not exist",
            "correct the lake connection's warehouse",
            "the slot did not move",
        ),
        "Create the bucket, or correct the lake connection's `warehouse` (and `s3.endpoint`); nothing was "
        "acknowledged, run the task again.",
        spark=True,
    ),
    BadInput(
        "refused-warehouse",
        "the object store refuses the lake's S3 keys when the Spark job writes the warehouse",
        "apply, maintenance",
        "LakeStorageError",
        (
            "refused the Spark job's credentials for bucket 'warehouse'",
            "Status Code: 403",
            "s3.secret-access-key",
            "the slot did not move",
        ),
        "Correct `s3.access-key-id` / `s3.secret-access-key` in the lake connection's properties (or the "
        "credentials the catalog vends); nothing was acknowledged, run the task again.",
        spark=True,
    ),
    BadInput(
        "catalog-gone",
        "the REST catalog goes down while the Spark job runs, before its commit",
        "apply job",
        "CatalogError",
        ("stopped answering during the job", "failed to respond", "the slot did not move"),
        "Bring the catalog back (or correct the lake connection's URL); nothing was acknowledged, run the "
        "task again: tables that hold the batch already are skipped.",
        spark=True,
    ),
    BadInput(
        "foreign-manifest",
        "the ack was given a manifest drained from another slot",
        "ack",
        "ManifestSlotMismatchError",
        ("belongs to slot 'cdc', not 'cdc_other'", "pass the manifest drained from this slot"),
        "Pass the ack the manifest its own slot's drain produced.",
    ),
    BadInput(
        "slot-short",
        "the batch ends past this server's WAL: it was drained from another server (a primary that died "
        "before its standby had everything)",
        "ack",
        "SlotShortOfBatchError",
        (
            "short of the batch's end",
            "The slot is not acknowledged",
            "Point the connection at the server the batch was drained from",
            RECOVERY_DAG,
        ),
        "Point the source connection at the server the batch was drained from; if that server is gone, "
        f"drop the slot (`SELECT pg_drop_replication_slot('<slot>')`) and trigger `{RECOVERY_DAG}` to "
        "reload the lake from this one. The slot did not move.",
    ),
    BadInput(
        "incompatible-schema",
        "a column's type changed in a way Iceberg cannot promote (int to text)",
        "apply job",
        "ResnapshotNeededError",
        (
            "column 'qty' changed",
            "which is not a widening",
            "nothing of this batch was applied",
            "airflow dags trigger postgres_cdc_backfill_tables",
        ),
        "Re-snapshot the table with the `postgres_cdc_backfill_tables` command the message prints, "
        "then re-run the apply.",
        spark=True,
    ),
    BadInput(
        "malformed-pgoutput",
        "pgoutput bytes the decoder cannot read",
        "drain, `pgcdc peek`",
        "PgOutputDecodeError",
        ("cannot decode pgoutput message 'I'", "the slot did not move", "pgcdc peek"),
        "Nothing was staged: save what `pgcdc peek` prints there and report it with the server version.",
    ),
    BadInput(
        "copy-cut",
        "the snapshot's COPY stream ended early: the server restarted or the backend was terminated",
        "snapshot",
        "ConnectionLostError",
        ("lost the connection copying table public.small", "discarded", "run it again"),
        "Run the snapshot again: the partial copy was discarded and its slot dropped.",
    ),
    BadInput(
        "drain-cut",
        "the drain's stream ended early: the server restarted or the backend was terminated",
        "drain",
        "ConnectionLostError",
        ("while reading slot 'cdc'", "The slot did not move", "run the drain again"),
        "Run the drain again: nothing of the batch was kept and it starts from the same position.",
    ),
    BadInput(
        "dead-snapshot",
        "the connection holding the exported snapshot ended",
        "snapshot",
        "SnapshotLostError",
        ("can no longer be imported", "run it again", "idle_in_transaction_session_timeout"),
        "Run it again; if it recurs, find what ends idle connections (timeouts, proxies, kill jobs).",
    ),
    BadInput(
        "dropped-table",
        "a published table was dropped during the snapshot copy",
        "snapshot",
        "TableDroppedError",
        ("public.z", "dropped or renamed during the snapshot copy", "run it"),
        "Run the snapshot again; the dropped table is no longer part of it.",
    ),
)


# --- what each case runs ------------------------------------------------------------------------


@dataclass
class Outcome:
    """What the user saw: the error's class name (or ``exit N``) and its message (or output)."""

    error: str
    message: str


def raised(run: Callable[[], object]) -> Outcome:
    with pytest.raises(Exception) as info:
        run()
    return Outcome(type(info.value).__name__, str(info.value))


@dataclass
class Env:
    """A case's surroundings: the session cluster, a fresh database, a scratch directory."""

    pg: PostgresCluster
    db: str
    tmp: Path
    request: pytest.FixtureRequest
    monkeypatch: pytest.MonkeyPatch

    @property
    def dsn(self) -> str:
        return self.pg.dsn(self.db)

    def sql(self, statement: str) -> None:
        self.pg.execute(statement, self.db)

    def slot(self, *names: str) -> None:
        conn = connect(self.dsn)
        for name in names:
            create_slot(conn, name)
        conn.close()

    def drain(self, slot: str = "cdc", publication: str = "pub", staging: str | None = None) -> DrainResult:
        return drain_batch(
            self.dsn, DrainSettings(slot, (publication,), staging or str(self.tmp / "staging"))
        )


def _role(env: Env, name: str, attributes: str) -> None:
    env.pg.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(name)))
    env.pg.execute(sql.SQL("CREATE ROLE {} " + attributes).format(sql.Identifier(name)))
    env.request.addfinalizer(lambda: _drop_role(env, name))


def _drop_role(env: Env, name: str) -> None:
    env.pg.drop_database(env.db)  # the role owns grants in it
    env.pg.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(name)))


def wal_level(env: Env) -> Outcome:
    replica: PostgresCluster = env.request.getfixturevalue("replica_cluster")
    result = subprocess.run(
        [sys.executable, "-m", "airflow_provider_postgres_cdc.cli", "check", "--dsn", replica.dsn()],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return Outcome(f"exit {result.returncode}", result.stdout + result.stderr)


def no_replication(env: Env) -> Outcome:
    _role(env, "catalogue_plain", "LOGIN")
    env.sql('CREATE TABLE t (id int PRIMARY KEY); GRANT SELECT ON t TO "catalogue_plain";')
    env.sql("CREATE PUBLICATION pub FOR TABLE t")
    return raised(
        lambda: take_snapshot(env.pg.dsn(env.db, user="catalogue_plain"), "s", ["pub"], str(env.tmp))
    )


def no_select(env: Env) -> Outcome:
    _role(env, "catalogue_copier", "LOGIN REPLICATION")
    env.sql(
        "CREATE TABLE open_t (id int PRIMARY KEY); CREATE TABLE closed_t (id int PRIMARY KEY);"
        'GRANT SELECT ON open_t TO "catalogue_copier"; CREATE PUBLICATION pub FOR TABLE open_t, closed_t;'
    )
    return raised(
        lambda: take_snapshot(env.pg.dsn(env.db, user="catalogue_copier"), "s", ["pub"], str(env.tmp))
    )


def _published(env: Env) -> None:
    env.sql("CREATE TABLE t (id int PRIMARY KEY, qty int); CREATE PUBLICATION pub FOR TABLE t")


def missing_slot(env: Env) -> Outcome:
    _published(env)
    return raised(lambda: env.drain("nope"))


def active_slot(env: Env) -> Outcome:
    _published(env)
    env.slot("cdc")
    repl = connect_replication(env.dsn)
    try:
        with repl.cursor() as cur:
            cur.start_replication(slot_name="cdc", options={"proto_version": "1", "publication_names": "pub"})
            env.pg.wait_for("SELECT active FROM pg_replication_slots WHERE slot_name = 'cdc'", env.db)
            return raised(env.drain)
    finally:
        repl.close()


def lost_slot(env: Env) -> Outcome:
    tiny: PostgresCluster = env.request.getfixturevalue("tiny_wal_cluster")
    tiny.execute("CREATE TABLE t (id int PRIMARY KEY, pad text); CREATE PUBLICATION pub FOR TABLE t")
    conn = connect(tiny.dsn())
    create_slot(conn, "cdc")
    conn.close()
    tiny.execute("INSERT INTO t SELECT g, repeat('x', 100) FROM generate_series(1, 1000) g")
    for _ in range(6):  # each switch ends a 16 MB segment; the checkpoint removes what the cap drops
        tiny.execute("SELECT pg_switch_wal()")
        tiny.execute("INSERT INTO t VALUES (-1, 'x') ON CONFLICT (id) DO UPDATE SET pad = 'y'")
        tiny.execute("CHECKPOINT")
        if tiny.execute("SELECT wal_status FROM pg_replication_slots WHERE slot_name = 'cdc'") == [("lost",)]:
            break
    assert tiny.execute("SELECT wal_status FROM pg_replication_slots") == [("lost",)]
    return raised(lambda: drain_batch(tiny.dsn(), DrainSettings("cdc", ("pub",), str(env.tmp))))


def missing_publication(env: Env) -> Outcome:
    _published(env)
    env.slot("cdc")
    return raised(lambda: env.drain(publication="missing_pub"))


def unwritable_staging(env: Env) -> Outcome:
    staging: Path = env.request.getfixturevalue("tmpfs")
    remount: Callable[[Path, str], None] = env.request.getfixturevalue("remount")
    remount(staging, "ro")  # root ignores file modes; a read-only mount stops it too
    _published(env)
    env.slot("cdc")
    env.sql("INSERT INTO t VALUES (1, 1)")
    return raised(lambda: env.drain(staging=str(staging)))


def refused_staging(env: Env) -> Outcome:
    from airflow_provider_postgres_cdc.engine.object_store import S3Options

    s3: S3Server = env.request.getfixturevalue("s3_server")
    _published(env)
    env.slot("cdc")
    wrong = S3Options(s3.access_key, "not-the-secret", endpoint_url=s3.endpoint_url)
    settings = DrainSettings("cdc", ("pub",), "s3://staging/catalogue", staging_options=wrong)
    return raised(lambda: drain_batch(env.dsn, settings))


def _lake_ack(env: Env, slot: str, manifest: str, lake_root: Path) -> Outcome:
    from airflow_provider_postgres_cdc.formats.lake import local_lake
    from airflow_provider_postgres_cdc.hooks.lake import connection_json
    from airflow_provider_postgres_cdc.operators.ack import PostgresCdcAckOperator

    env.monkeypatch.setenv("AIRFLOW_CONN_CATALOGUE_SRC", env.pg.uri(env.db))
    env.monkeypatch.setenv("AIRFLOW_CONN_CATALOGUE_LAKE", connection_json(local_lake(str(lake_root))))
    ack = PostgresCdcAckOperator(
        task_id="ack", slot_name=slot, manifest=manifest, lake_conn_id="catalogue_lake",
        postgres_conn_id="catalogue_src",
    )  # fmt: skip
    return raised(lambda: ack.execute({}))  # type: ignore[arg-type]


def unreachable_catalog(env: Env) -> Outcome:
    _published(env)
    env.slot("cdc")
    env.sql("INSERT INTO t SELECT g, g FROM generate_series(1, 10) g")
    batch = env.drain()
    # The SQLite catalog file would live in a directory that does not exist: it cannot be opened.
    return _lake_ack(env, "cdc", batch.manifest_uri, env.tmp / "no" / "such" / "lake")


def refused_catalog(env: Env) -> Outcome:
    """A batch whose apply meets a REST catalog that refuses the connection's client secret."""
    import json

    from airflow_provider_postgres_cdc.operators.spark_apply import PostgresCdcSparkApplyOperator
    from airflow_provider_postgres_cdc.testing.s3 import S3Server

    _published(env)
    env.slot("cdc")
    env.sql("INSERT INTO t SELECT g, g FROM generate_series(1, 10) g")
    batch = env.drain()
    with S3Server(buckets=(), table_buckets=["warehouse"]) as s3:
        connection = json.loads(s3.iceberg_connection_json("warehouse")) | {"password": "not-the-secret"}
        env.monkeypatch.setenv("AIRFLOW_CONN_CATALOGUE_REST", json.dumps(connection))
        apply = PostgresCdcSparkApplyOperator(
            task_id="apply", manifest=batch.manifest_uri, lake_conn_id="catalogue_rest"
        )
        return raised(lambda: apply.execute({}))  # type: ignore[arg-type]


def _job(lake: LakeConfig, manifest: str) -> Outcome:
    """The apply job as spark-submit runs it (``main``), in the run's shared session: its error line."""
    from airflow_provider_postgres_cdc.spark import apply_batch
    from airflow_provider_postgres_cdc.spark.session import local_session, register_lake

    register_lake(local_session("postgres-cdc-bad-inputs", cores=1), lake)
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        status = apply_batch.main(["--catalog", lake.catalog, "--manifest", manifest])
    found = re.search(r"^apply_batch\.py: error: (\w+): (.*)$", stderr.getvalue(), flags=re.MULTILINE)
    assert status == 2 and found, stderr.getvalue()[-3000:]
    return Outcome(found[1], found[2])


def _snapshot(env: Env, rows: int = 10) -> str:
    """A published table ``t`` of ``rows`` rows, its snapshot staged (slot ``cdc``): the manifest."""
    _published(env)
    env.sql(f"INSERT INTO t SELECT g, g FROM generate_series(1, {rows}) g")
    return take_snapshot(env.dsn, "cdc", ["pub"], str(env.tmp / "staging"))[0]


def _unique(name: str) -> str:
    """A catalog name of its own in the run's shared Spark session."""
    return f"{name}_{uuid.uuid4().hex[:8]}"


def _applied_end(lake: LakeConfig) -> Lsn | None:
    """Where the lake table of ``public.t`` stands, read with pyiceberg (None: no pipeline commit)."""
    from airflow_provider_postgres_cdc.engine.lake_catalog import load_table, open_catalog, table_state

    table = load_table(open_catalog(lake), lake, "public", "t")
    state = table_state(table) if table is not None else None
    return state.applied_end_lsn if state is not None else None


def missing_warehouse(env: Env) -> Outcome:
    """A SQLite catalog whose warehouse names a bucket the store lacks: the apply operator stops
    before spark-submit, in seconds; the job itself (submitted by hand) says the same."""
    from airflow_provider_postgres_cdc.hooks.lake import connection_json
    from airflow_provider_postgres_cdc.operators.spark_apply import PostgresCdcSparkApplyOperator

    s3: S3Server = env.request.getfixturevalue("s3_server")
    manifest = _snapshot(env)
    storage = {k: v for k, v in s3.rest_catalog_properties("warehouse").items() if k.startswith("s3.")}
    lake = LakeConfig(
        _unique("nowhere"),
        {
            "type": "jdbc", "uri": f"jdbc:sqlite:{env.tmp}/catalog.db", "warehouse": "s3://nowhere/lake",
            "io-impl": "org.apache.iceberg.aws.s3.S3FileIO", **storage,
        },
    )  # fmt: skip
    env.monkeypatch.setenv("AIRFLOW_CONN_CATALOGUE_NOWHERE", connection_json(lake))
    apply = PostgresCdcSparkApplyOperator(
        task_id="apply", manifest=manifest, lake_conn_id="catalogue_nowhere"
    )
    started = time.monotonic()
    preflight = raised(lambda: apply.execute({}))  # type: ignore[arg-type]
    assert time.monotonic() - started < 10, "the preflight should not wait for spark-submit"
    assert preflight.error == "LakeStorageError", preflight
    assert "lake connection 'catalogue_nowhere': bucket 'nowhere'" in preflight.message
    assert "Nothing was submitted and the slot did not move" in preflight.message
    outcome = _job(lake, manifest)
    assert _applied_end(lake) is None  # nothing applied
    return outcome


def refused_warehouse(env: Env) -> Outcome:
    """A REST catalog that takes its credentials while the store refuses the job's S3 secret."""
    s3: S3Server = env.request.getfixturevalue("s3_server")
    manifest = _snapshot(env)
    properties = s3.rest_catalog_properties("warehouse")
    wrong = {**properties, "s3.secret-access-key": "not-the-secret"}
    lake = LakeConfig(_unique("refused"), wrong, namespace_prefix=_unique("ns") + "_", names="portable")
    outcome = _job(lake, manifest)
    assert _applied_end(replace(lake, properties=properties)) is None  # nothing applied
    return outcome


def catalog_gone(env: Env) -> Outcome:
    """A batch whose apply loses the REST catalog at the table's commit: the table stays at its snapshot."""
    from airflow_provider_postgres_cdc.spark.apply_batch import apply_manifest
    from airflow_provider_postgres_cdc.spark.session import local_session, register_lake
    from tests.integration.lake.catalog_cut import CatalogCut

    s3: S3Server = env.request.getfixturevalue("s3_server")
    snapshot = _snapshot(env)
    properties = s3.rest_catalog_properties("warehouse")
    lake = LakeConfig(_unique("gone"), properties, namespace_prefix=_unique("ns") + "_", names="portable")
    cut = CatalogCut(s3.host, s3.iceberg_port, table=lake.identifier("public", "t")[1])
    through = replace(
        lake, properties={**properties, "uri": cut.url, "oauth2-server-uri": f"{cut.url}/v1/oauth/tokens"}
    )
    try:
        spark = local_session("postgres-cdc-bad-inputs", cores=1)
        register_lake(spark, through)
        apply_manifest(spark, snapshot, through)
        loaded = _applied_end(lake)
        env.sql("INSERT INTO t SELECT g, g FROM generate_series(11, 20) g")
        batch = env.drain()
        cut.armed.set()
        outcome = _job(through, batch.manifest_uri)
    finally:
        cut.close()
    assert cut.cut.is_set() and loaded is not None
    assert _applied_end(lake) == loaded  # nothing of the batch applied
    return outcome


def slot_short(env: Env) -> Outcome:
    """An empty batch whose end lies past the server's WAL, as one drained from a lost primary."""
    from airflow_provider_postgres_cdc.engine.staging import StagingLocation
    from airflow_provider_postgres_cdc.replication import describe_slot

    _published(env)
    env.slot("cdc")
    env.sql("CREATE TABLE other (id int); INSERT INTO other VALUES (1)")  # not published: nothing staged
    batch = env.drain()
    elsewhere = replace(batch.manifest, end_lsn=Lsn(batch.manifest.end_lsn + (1 << 30)))
    location = StagingLocation.resolve(str(env.tmp / "staging"))
    uri = location.write_manifest(str(env.tmp / "staging" / "cdc" / batch.manifest.batch_id), elsewhere)
    (env.tmp / "lake").mkdir()
    conn = connect(env.dsn)
    before = describe_slot(conn, "cdc").confirmed_flush_lsn
    outcome = _lake_ack(env, "cdc", uri, env.tmp / "lake")
    assert describe_slot(conn, "cdc").confirmed_flush_lsn == before
    conn.close()
    return outcome


def foreign_manifest(env: Env) -> Outcome:
    _published(env)
    env.slot("cdc", "cdc_other")
    env.sql("INSERT INTO t SELECT g, g FROM generate_series(1, 10) g")
    batch = env.drain()
    (env.tmp / "lake").mkdir()
    return _lake_ack(env, "cdc_other", batch.manifest_uri, env.tmp / "lake")


def incompatible_schema(env: Env) -> Outcome:
    from airflow_provider_postgres_cdc.formats.lake import local_lake
    from airflow_provider_postgres_cdc.spark.apply_batch import apply_manifest
    from airflow_provider_postgres_cdc.spark.session import local_session, register_lake

    _published(env)
    env.sql("INSERT INTO t SELECT g, g FROM generate_series(1, 10) g")
    snapshot_path, _ = take_snapshot(env.dsn, "cdc", ["pub"], str(env.tmp / "staging"))
    (env.tmp / "lake").mkdir()
    lake = local_lake(str(env.tmp / "lake"), catalog="catalogue_lake")
    # The run's shared session when one is up (tests/integration/conftest.py): left running for the
    # tests after this one; stopping it here would stop theirs.
    spark = local_session("postgres-cdc-bad-inputs", cores=1)
    register_lake(spark, lake)
    apply_manifest(spark, snapshot_path, lake)
    env.sql("ALTER TABLE t ALTER COLUMN qty TYPE text; INSERT INTO t VALUES (11, 'eleven')")
    batch = env.drain()
    return raised(lambda: apply_manifest(spark, batch.manifest_uri, lake))


def malformed_pgoutput(env: Env) -> Outcome:
    raw = json.loads((CAPTURES / "proto1.json").read_text())
    messages = [bytes.fromhex(m["data"]) for m in raw["messages"]]
    lsns = [int(Lsn.parse(m["lsn"])) for m in raw["messages"]]
    first_insert = next(i for i, m in enumerate(messages) if m[:1] == b"I")
    # Cut the captured Insert inside its tuple: what a damaged stream would carry.
    messages[first_insert] = messages[first_insert][: len(messages[first_insert]) // 2]
    return raised(lambda: BatchDecoder(1).decode(messages, lsns))


def _two_tables(env: Env) -> None:
    env.sql(
        "CREATE TABLE a (id int PRIMARY KEY); INSERT INTO a SELECT generate_series(1, 1000);"
        "CREATE TABLE z (id int PRIMARY KEY); INSERT INTO z SELECT generate_series(1, 1000);"
        "CREATE PUBLICATION pub FOR TABLE a, z;"
    )


def copy_cut(env: Env) -> Outcome:
    """Terminate the backend whose COPY of ``small`` waits on a lock taken once the plan is made."""
    env.sql(
        "CREATE TABLE big (id int PRIMARY KEY); INSERT INTO big SELECT generate_series(1, 10000);"
        "CREATE TABLE small (id int PRIMARY KEY); INSERT INTO small VALUES (1);"
        "CREATE PUBLICATION pub FOR TABLE big, small;"
    )
    locker = connect(env.dsn, autocommit=False)
    cut: list[int] = []

    def on_progress(progress: SnapshotProgress) -> None:
        if progress.phase == "planned":
            with locker.cursor() as cur:
                cur.execute("LOCK TABLE small IN ACCESS EXCLUSIVE MODE")
        elif not cut:
            cut.extend(
                row[0]
                for row in env.pg.execute(
                    "SELECT pg_terminate_backend(pid)::int FROM pg_stat_activity "
                    "WHERE wait_event_type = 'Lock' AND query LIKE 'COPY %'",
                    env.db,
                )
            )

    try:
        return raised(
            lambda: take_snapshot(
                env.dsn,
                "cdc",
                ["pub"],
                str(env.tmp),
                parallelism=1,
                progress_interval=0.05,
                on_progress=on_progress,
            )
        )
    finally:
        locker.close()


class _OnFirstPiece(logging.Handler):
    """Runs ``action`` on the drain's first progress record, while staging waits for it."""

    def __init__(self, action: Callable[[], object]) -> None:
        super().__init__()
        self.action = action
        self.done = False

    def emit(self, record: logging.LogRecord) -> None:
        if str(record.msg).startswith("drain %s: %d changes") and not self.done:
            self.done = True
            self.action()


def drain_cut(env: Env) -> Outcome:
    """Terminate the drain's backend (the holder of its slot lock, which runs the peek's calls)
    once the drain staged its first piece: the ~25 MB window is far more than the socket buffers
    and the pieces in flight hold, so the read is not over. Whether that backend is sending a call
    or has handed one to the socket buffers, the drain's next read from it fails."""
    env.sql("CREATE TABLE big (id int PRIMARY KEY, pad text); CREATE PUBLICATION pub FOR TABLE big;")
    env.slot("cdc")
    for first in range(1, 250_000, 25_000):  # pieces are staged per committed transaction
        env.sql(
            f"INSERT INTO big SELECT g, md5(g::text) || repeat('x', 60) "
            f"FROM generate_series({first}, {first + 24_999}) g"
        )
    settings = DrainSettings(
        "cdc", ("pub",), str(env.tmp), progress_seconds=0, chunk_bytes=256 << 10, chunk_messages=20_000
    )
    terminated: list[tuple[Any, ...]] = []
    handler = _OnFirstPiece(
        lambda: terminated.extend(
            env.pg.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND granted"
            )
        )
    )
    logger = logging.getLogger("airflow_provider_postgres_cdc.engine.drain")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        outcome = raised(lambda: drain_batch(env.dsn, settings))
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert terminated == [(True,)], "the peek had ended before the cut"
    return outcome


def dead_snapshot(env: Env) -> Outcome:
    _two_tables(env)

    def kill_holder(progress: SnapshotProgress) -> None:
        if progress.phase == "planned":
            env.pg.execute(
                "SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity "
                "WHERE backend_type = 'walsender' AND datname = current_database()",
                env.db,
            )

    return raised(lambda: take_snapshot(env.dsn, "cdc", ["pub"], str(env.tmp), on_progress=kill_holder))


def dropped_table(env: Env) -> Outcome:
    _two_tables(env)

    def drop_z(progress: SnapshotProgress) -> None:
        if progress.phase == "planned":
            env.sql("DROP TABLE z")

    return raised(lambda: take_snapshot(env.dsn, "cdc", ["pub"], str(env.tmp), on_progress=drop_z))


RUNS: dict[str, Callable[[Env], Outcome]] = {
    "wal-level": wal_level,
    "no-replication": no_replication,
    "no-select": no_select,
    "missing-slot": missing_slot,
    "active-slot": active_slot,
    "lost-slot": lost_slot,
    "missing-publication": missing_publication,
    "unwritable-staging": unwritable_staging,
    "refused-staging": refused_staging,
    "unreachable-catalog": unreachable_catalog,
    "refused-catalog": refused_catalog,
    "missing-warehouse": missing_warehouse,
    "refused-warehouse": refused_warehouse,
    "catalog-gone": catalog_gone,
    "foreign-manifest": foreign_manifest,
    "slot-short": slot_short,
    "incompatible-schema": incompatible_schema,
    "malformed-pgoutput": malformed_pgoutput,
    "copy-cut": copy_cut,
    "drain-cut": drain_cut,
    "dead-snapshot": dead_snapshot,
    "dropped-table": dropped_table,
}


@pytest.fixture(scope="module")
def s3_server() -> Iterator[S3Server]:
    """S3 with a staging bucket, and an Iceberg REST catalog whose warehouse is ``s3://warehouse/``."""
    with S3Server(buckets=["staging"], table_buckets=["warehouse"]) as server:
        yield server


@pytest.fixture(scope="module")
def replica_cluster() -> Iterator[PostgresCluster]:
    with PostgresCluster({"wal_level": "replica"}) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def tiny_wal_cluster() -> Iterator[PostgresCluster]:
    """WAL past 1 MB behind a slot may be removed: ``pg_switch_wal`` + ``CHECKPOINT`` lose it."""
    settings = {
        "max_slot_wal_keep_size": "1MB",
        "wal_keep_size": "0",
        "min_wal_size": "32MB",
        "max_wal_size": "64MB",
        "checkpoint_timeout": "1h",
    }
    with PostgresCluster(settings) as cluster:
        yield cluster


def _param(case: BadInput) -> Any:
    return pytest.param(case, id=case.key, marks=[pytest.mark.spark] if case.spark else [])


@pytest.mark.parametrize("case", [_param(case) for case in CATALOGUE])
def test_bad_input_fails_with_the_fix_in_its_message(
    case: BadInput,
    pg_cluster: PostgresCluster,
    pg_dbname: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if case.spark and not os.environ.get("POSTGRES_CDC_SPARK_JARS"):
        pytest.skip("POSTGRES_CDC_SPARK_JARS is not set: the Iceberg runtime jars are needed")
    outcome = RUNS[case.key](Env(pg_cluster, pg_dbname, tmp_path, request, monkeypatch))
    assert outcome.error == case.error, outcome
    missing = [word for word in case.words if word not in outcome.message]
    assert not missing, f"{case.error} message lacks {missing}: {outcome.message}"


def test_every_case_has_a_run() -> None:
    assert sorted(RUNS) == sorted(case.key for case in CATALOGUE)


# --- the README's troubleshooting table ---------------------------------------------------------


def readme_row(case: BadInput) -> str:
    """The README table row of a case: cause | what fails | error | what to do."""
    return f"| {case.cause} | {case.operation} | `{case.error}` | {case.fix} |"


def troubleshooting_section(text: str) -> str:
    match = re.search(r"^## Troubleshooting\n(.*?)(?=^## |\Z)", text, flags=re.MULTILINE | re.DOTALL)
    assert match, "README.md has no '## Troubleshooting' section"
    return match.group(1)


def test_readme_troubleshooting_lists_every_case() -> None:
    section = troubleshooting_section(README.read_text(encoding="utf-8"))
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| Cause")]
    rows = [row for row in rows if not set(row) <= set("|- ")]
    expected = [readme_row(case) for case in CATALOGUE]
    assert rows == expected, "README.md's Troubleshooting table differs; it should read:\n" + "\n".join(
        expected
    )
