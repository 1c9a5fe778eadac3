"""Randomized fidelity: seeded hostile schemas through snapshot, two CDC batches and the ack, lake == source.

Each seed (``workload.Workload``) builds 2-4 tables with hostile names over the type catalogue, in
every table shape (primary key, REPLICA IDENTITY FULL with and without a key, no key with
identity DEFAULT or NOTHING), loads rows with exact duplicates and TOAST-sized values, and takes
the snapshot; then two rounds of transactions (inserts, updates that leave TOAST untouched, key
changes, deleting one of two identical rows, TRUNCATE, savepoint rollbacks, aborted transactions,
and mid-stream ADD COLUMN [DEFAULT], DROP COLUMN and int4 -> int8), each drained, applied by the
Spark job and acknowledged, exactly as the pipeline does without Airflow. After the snapshot and
after each round every table must be equal twice over: by ``verify.compare_tables`` (multiset,
the product's type mapping) and by ``exact.compare_exact`` (PostgreSQL's own text of every row).

``make test`` runs the seeds in ``DEFAULT_SEEDS``. More: ``POSTGRES_CDC_FIDELITY_SEEDS=100`` (seeds
1-100), ``=200-299`` (a range) or ``=7,42`` (a list). A failure names the command replaying its seed.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import psycopg2
import pytest
from pyspark.sql import SparkSession

from airflow_provider_postgres_cdc.engine.drain import DrainSettings, drain_batch
from airflow_provider_postgres_cdc.engine.snapshot import take_snapshot
from airflow_provider_postgres_cdc.formats.lake import LakeConfig, local_lake
from airflow_provider_postgres_cdc.formats.manifest import Manifest
from airflow_provider_postgres_cdc.spark.apply_batch import apply_manifest
from airflow_provider_postgres_cdc.spark.session import register_lake
from airflow_provider_postgres_cdc.testing import PostgresCluster
from tests.integration.fidelity.exact import compare_all
from tests.integration.fidelity.seeds import parse_seeds
from tests.integration.fidelity.steps import acknowledge
from tests.integration.fidelity.workload import Transaction, Workload
from tests.pg_majors import DEFAULT, PG18

pytestmark = [pytest.mark.integration, pytest.mark.spark]

SEEDS_ENV = "POSTGRES_CDC_FIDELITY_SEEDS"
DEFAULT_SEEDS = [1, 4, 33]  # together: every shape, value family and workload step of the generator
PG18_SEED = 1  # also run on PostgreSQL 18 (tests/pg_majors.py)
SLOT = "fidelity"


def replay_command(seed: int) -> str:
    return f"{SEEDS_ENV}={seed}-{seed} python -m pytest tests/integration/fidelity/test_fidelity.py -q"


class SeedFailureError(AssertionError):
    pass


class Pipeline:
    """One seed's pipeline: the snapshot, then drain -> apply -> ack per round, as the DAGs run it."""

    def __init__(self, spark: SparkSession, dsn: str, publication: str, root: Path) -> None:
        self.spark = spark
        self.dsn = dsn
        self.publication = publication
        self.staging = str(root / "staging")
        self.lake: LakeConfig = local_lake(str(root / "lake"), catalog=f"fidelity_{uuid.uuid4().hex[:8]}")
        (root / "lake").mkdir(parents=True, exist_ok=True)
        register_lake(spark, self.lake)
        self.changes = 0

    def snapshot(self) -> None:
        path, _ = take_snapshot(self.dsn, SLOT, [self.publication], self.staging)
        apply_manifest(self.spark, path, self.lake)

    def batch(self) -> Manifest:
        result = drain_batch(self.dsn, DrainSettings(SLOT, (self.publication,), self.staging))
        manifest = result.manifest
        self.changes += manifest.stats.changes
        if manifest.tables:  # the apply operator skips an empty batch
            apply_manifest(self.spark, result.manifest_uri, self.lake)
        self.ack(manifest)
        return manifest

    def ack(self, manifest: Manifest) -> None:
        acknowledge(self.dsn, SLOT, self.lake, manifest)


def run_sql(dsn: str, transactions: list[Transaction], script: Path) -> None:
    """Run each statement on its own (autocommit: BEGIN/COMMIT are statements) and log it as SQL."""
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    try:
        with conn.cursor() as cur, script.open("a") as log:
            for transaction in transactions:
                for statement in transaction:
                    text = statement.as_string(conn)
                    log.write(text + ";\n")
                    cur.execute(text)
    finally:
        conn.close()


def check(pipeline: Pipeline, workload: Workload) -> tuple[int, list[str]]:
    """(rows compared, problems): verify's multiset comparison and the exact one, every table."""
    tables = [(t.schema, t.name) for t in workload.tables]
    return compare_all(pipeline.dsn, pipeline.publication, pipeline.lake, tables)


@pytest.mark.timeout(1200)
@pytest.mark.parametrize(
    ("seed", "pg_cluster"),
    [pytest.param(s, DEFAULT, id=f"seed{s}") for s in parse_seeds(os.environ.get(SEEDS_ENV), DEFAULT_SEEDS)]
    + [pytest.param(PG18_SEED, PG18, id=f"seed{PG18_SEED}-pg18")],
    indirect=["pg_cluster"],
)
def test_lake_equals_source_for_seed(
    seed: int,
    spark: SparkSession,
    pg_cluster: PostgresCluster,
    pg_dbname: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    started = time.monotonic()
    dsn = pg_cluster.dsn(pg_dbname)
    workload = Workload(seed)
    script = tmp_path / f"fidelity-seed-{seed}.sql"
    pipeline = Pipeline(spark, dsn, workload.publication, tmp_path)
    compared = differences = 0
    stage, failure = "setup", None
    try:
        run_sql(dsn, [workload.setup, *workload.initial], script)
        stage = "snapshot"
        pipeline.snapshot()
        rows, problems = check(pipeline, workload)
        compared += rows
        for number, transactions in enumerate(workload.rounds, 1):
            if problems:
                break
            stage = f"round {number}"
            run_sql(dsn, transactions, script)
            with script.open("a") as log:
                log.write(f"-- end of round {number}: drain, apply, ack\n")
            pipeline.batch()
            rows, problems = check(pipeline, workload)
            compared += rows
        differences = len(problems)
    except Exception as exc:  # reported below with the seed and how to replay it
        problems, differences, failure = [f"{type(exc).__name__}: {exc}"], 1, exc
    with capsys.disabled():
        print(
            f"\nfidelity seed {seed}: {len(workload.tables)} tables, {pipeline.changes} changes, "
            f"{compared} rows compared, {differences} differences, {time.monotonic() - started:.1f} s"
        )
    if problems:
        raise SeedFailureError(
            f"seed {seed} failed at {stage}; replay it alone with:\n    {replay_command(seed)}\n"
            f"tables:\n{workload.describe()}\nSQL run so far: {script}\n\n" + "\n\n".join(problems)
        ) from failure
