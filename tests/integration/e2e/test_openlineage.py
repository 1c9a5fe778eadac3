"""OpenLineage from real DAG runs on Spark 4.1: the openlineage provider's listener and file transport.

One initial snapshot and one CDC run of the example DAGs (``airflow dags test``, real PostgreSQL,
real ``spark-submit``), with ``[openlineage] transport`` set to the file transport. The source has
hostile names (a schema with a dot, a table with a dot, a space, ``%`` and non-ASCII), a column
list and a row filter. The events must hold a START and a COMPLETE for every task, and the
datasets and facets docs/OBSERVABILITY.md promises.

The jobs run on Spark 4.1 with Iceberg 1.12, deployed as a user would (docs/LAKE.md, "Versions"):
Airflow in the test virtualenv (Spark provider 5.6, pyspark 3.5), the worker's environment pointing
at Spark 4.1 elsewhere (``SPARK_HOME`` with its ``bin`` first on ``PATH``, so the Spark connection's
plain ``spark-submit`` is 4.1's), the jobs' Python a virtualenv holding pyspark (and its Connect
client), and the 4.1 lake jars (tests/spark_lines.py). Iceberg's own snapshot summaries must say
that Spark 4.1 and Iceberg 1.12 wrote every table, and the lake must equal its source.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import jsonschema
import pytest

from airflow_provider_postgres_cdc.assets import cut_asset, table_asset
from airflow_provider_postgres_cdc.engine.lake_catalog import latest_cut, open_catalog, owned_tables
from airflow_provider_postgres_cdc.engine.verify import compare_tables, format_report
from airflow_provider_postgres_cdc.formats.lake import LakeConfig, tag_name
from airflow_provider_postgres_cdc.formats.lsn import Lsn
from airflow_provider_postgres_cdc.lineage.facets import schema_of
from airflow_provider_postgres_cdc.replication import connect, describe_slot
from airflow_provider_postgres_cdc.testing import AssetEventRecord, PostgresCluster
from tests.integration.e2e.e2e_support import make_lake, pipeline_conf, pipeline_sandbox
from tests.spark_lines import SPARK_41, spark_line_named

SLOT = "lineage_slot"
PUBLICATION = "lineage_pub"
SCHEMA, TABLE = "Sales.EU", "v1.2 orders%ü"
pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.airflow]

SOURCE_DDL = f"""
CREATE SCHEMA "{SCHEMA}";
CREATE TABLE "{SCHEMA}"."{TABLE}" (id int PRIMARY KEY, "qty €" int, note text, secret text);
CREATE TABLE public.customers (id bigint PRIMARY KEY, name text, amount numeric(10,2));
INSERT INTO "{SCHEMA}"."{TABLE}" SELECT i, i * 10, 'n' || i, 's' || i FROM generate_series(1, 8) i;
INSERT INTO public.customers SELECT i, 'c' || i, i * 1.5 FROM generate_series(1, 5) i;
CREATE PUBLICATION {PUBLICATION} FOR TABLE "{SCHEMA}"."{TABLE}" (id, "qty €", note) WHERE (id % 2 = 0),
    public.customers;
"""
CHANGES = f"""
INSERT INTO "{SCHEMA}"."{TABLE}" VALUES (10, 100, 'ten', 'x'), (11, 110, 'eleven', 'x');
UPDATE public.customers SET name = 'renamed' WHERE id = 2;
DELETE FROM public.customers WHERE id = 3;
"""


@dataclass(frozen=True)
class Runs:
    """The events of both DAG runs, and what they must name."""

    events: list[dict[str, Any]]
    database: str
    dsn: str
    source_namespace: str
    lake: LakeConfig
    acked: Lsn
    assets: list[AssetEventRecord]

    def task_events(self, job: str, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["job"]["name"] == job and e["eventType"] == kind]

    def one(self, job: str, kind: str) -> dict[str, Any]:
        (event,) = self.task_events(job, kind)
        return event

    def lake_table(self, schema: str, table: str, suffix: str = "") -> tuple[str, str]:
        """A lake table's dataset: its location, where Spark's JDBC catalog puts it in the warehouse."""
        return "file", f"{self.lake.properties['warehouse']}/{self.lake.namespace(schema)}/{table}{suffix}"


@pytest.fixture(scope="module")
def pg_cluster(pg_default_cluster: PostgresCluster) -> PostgresCluster:
    """The session's default server, for this module's module-scoped pipeline (tests/conftest.py)."""
    return pg_default_cluster


@pytest.fixture(scope="module")
def runs(pg_cluster: PostgresCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    tmp = tmp_path_factory.mktemp("openlineage")
    database = f"lineage_{uuid.uuid4().hex[:8]}"
    pg_cluster.create_database(database)
    with pg_cluster.connect(database) as conn, conn.cursor() as cur:
        cur.execute(SOURCE_DDL)
    lake, lake_conn = make_lake(tmp / "lake")
    events_file = tmp / "openlineage.jsonl"
    sandbox = pipeline_sandbox(
        tmp / "airflow",
        pg_cluster.uri(database),
        lake_conn,
        source_conn_id="src",
        env={
            **spark_line_named(SPARK_41).worker_env(),
            "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps(
                {"type": "file", "log_file_path": str(events_file), "append": True}
            ),
            "AIRFLOW__OPENLINEAGE__NAMESPACE": "lineage_test",
            # `airflow dags test` serves the task's XCom reads from an in-process API whose thread a
            # forked child lacks: the snapshot's and drain's COMPLETE (they read their XCom) would
            # hang in the provider's default fork until its timeout. A worker's supervisor is a real
            # process, where the fork works; the thread is the provider's option for such methods.
            "AIRFLOW__OPENLINEAGE__EXECUTE_IN_THREAD": "True",
        },
    )
    conf = pipeline_conf(SLOT, tmp / "staging", conn_id="src", publication=PUBLICATION)
    try:
        for_log = [sandbox.dags_test("postgres_cdc_initial_snapshot", conf).check()]
        with pg_cluster.connect(database) as conn, conn.cursor() as cur:
            cur.execute(CHANGES)
        for_log.append(sandbox.dags_test("postgres_cdc_microbatch", conf).check())
        for run in for_log:
            (tmp / f"{run.dag_id}.log").write_text(run.output, encoding="utf-8")
        conn = connect(pg_cluster.dsn(database))
        acked = describe_slot(conn, SLOT).confirmed_flush_lsn
        conn.close()
        assert acked is not None
        lines = events_file.read_text(encoding="utf-8").splitlines()
        yield Runs(
            [json.loads(line) for line in lines if line.strip()],
            database,
            pg_cluster.dsn(database),
            f"postgres://{pg_cluster.host}:{pg_cluster.port}",
            lake,
            acked,
            sandbox.asset_events(),
        )
    finally:
        pg_cluster.drop_database(database)


def by_name(datasets: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["namespace"], d["name"]): d for d in datasets}


def symlinks(dataset: dict[str, Any]) -> list[tuple[str, str, str]]:
    return [(s["namespace"], s["name"], s["type"]) for s in dataset["facets"]["symlinks"]["identifiers"]]


def fields(dataset: dict[str, Any]) -> dict[str, str]:
    return {f["name"]: f["type"] for f in dataset["facets"]["schema"]["fields"]}


def assert_valid(facet: dict[str, Any], name: str) -> None:
    """A custom facet as emitted validates against its shipped schema, and names that schema."""
    assert facet["_schemaURL"].endswith(f"{name}.json#/$defs/{name}")
    _, own = schema_of(name)["$defs"][name]["allOf"]
    jsonschema.validate(facet, own)


def test_every_task_emits_start_and_complete(runs: Runs) -> None:
    jobs = {
        "postgres_cdc_initial_snapshot": ("postgres_cdc_snapshot.snapshot", "postgres_cdc_snapshot.load"),
        "postgres_cdc_microbatch": (
            "postgres_cdc.wait_for_lag", "postgres_cdc.drain", "postgres_cdc.apply", "postgres_cdc.ack",
        ),
    }  # fmt: skip
    for dag, tasks in jobs.items():
        for task in tasks:
            for kind in ("START", "COMPLETE"):
                assert len(runs.task_events(f"{dag}.{task}", kind)) == 1, (dag, task, kind)
    assert {e["job"]["namespace"] for e in runs.events} == {"lineage_test"}


def test_snapshot_reads_the_published_tables_with_their_filter_and_column_list(runs: Runs) -> None:
    event = runs.one("postgres_cdc_initial_snapshot.postgres_cdc_snapshot.snapshot", "COMPLETE")
    inputs = by_name(event["inputs"])
    hostile = inputs[runs.source_namespace, f"{runs.database}.{SCHEMA}.{TABLE}"]
    plain = inputs[runs.source_namespace, f"{runs.database}.public.customers"]
    assert len(inputs) == 2 and event["outputs"] == []  # staging is no dataset
    assert fields(hostile) == {"id": "int4", "qty €": "int4", "note": "text"}  # "secret" is not published
    assert fields(plain)["amount"].startswith("numeric")
    publication = hostile["facets"]["postgresCdcPublication"]
    assert publication["rowFilter"] == "(((id % 2) = 0))"  # as PostgreSQL deparses it
    assert publication["columnList"] == ["id", "qty €", "note"]
    assert publication["publications"] == [PUBLICATION]
    assert "rowFilter" not in plain["facets"]["postgresCdcPublication"]  # every row: no filter
    assert_valid(plain["facets"]["postgresCdcPublication"], "PostgresCdcPublicationDatasetFacet")
    assert_valid(publication, "PostgresCdcPublicationDatasetFacet")
    batch = event["run"]["facets"]["postgresCdcBatch"]
    assert batch["kind"] == "snapshot" and batch["slot"] == SLOT and batch["startLsn"] == batch["endLsn"]
    assert batch["cutTag"] == tag_name(Lsn.parse(batch["endLsn"]))
    assert batch["rows"] == 4 + 5  # even ids of 1..8, and every customer
    assert_valid(batch, "PostgresCdcBatchRunFacet")


def test_load_writes_the_lake_tables_with_column_lineage_and_rows(runs: Runs) -> None:
    start = runs.one("postgres_cdc_initial_snapshot.postgres_cdc_snapshot.load", "START")
    event = runs.one("postgres_cdc_initial_snapshot.postgres_cdc_snapshot.load", "COMPLETE")
    lake_table, customers = runs.lake_table(SCHEMA, TABLE), runs.lake_table("public", "customers")
    assert lake_table[1].endswith("/lake/warehouse/Sales%2EEU/v1.2 orders%ü")
    outputs = by_name(event["outputs"])
    assert set(outputs) == {lake_table, customers}  # no changelog for a load
    # START, before the tables exist, names them where Spark's integration would: where they then are
    assert set(by_name(start["outputs"])) == set(outputs)
    # a JDBC catalog has no Spark symlink (its jdbc: URI has no host): the catalog's own name only
    assert symlinks(outputs[lake_table]) == [("iceberg://lake", "Sales%2EEU.v1.2 orders%ü", "TABLE")]
    source = f"{runs.database}.{SCHEMA}.{TABLE}"
    assert set(by_name(event["inputs"])) == {
        (runs.source_namespace, source),
        (runs.source_namespace, f"{runs.database}.public.customers"),
    }
    table = outputs[lake_table]
    assert fields(table) == {"id": "int", "qty €": "int", "note": "string"}  # Iceberg's types, read back
    assert table["outputFacets"]["outputStatistics"]["rowCount"] == 4
    lineage = table["facets"]["columnLineage"]["fields"]
    assert set(lineage) == {"id", "qty €", "note"}
    (origin,) = lineage["qty €"]["inputFields"]
    assert (origin["namespace"], origin["name"], origin["field"]) == (runs.source_namespace, source, "qty €")
    assert origin["transformations"][0]["subtype"] == "IDENTITY"
    assert outputs[customers]["outputFacets"]["outputStatistics"]["rowCount"] == 5


def test_cdc_run_carries_the_lsn_window_and_the_cut(runs: Runs) -> None:
    drain = runs.one("postgres_cdc_microbatch.postgres_cdc.drain", "COMPLETE")
    apply = runs.one("postgres_cdc_microbatch.postgres_cdc.apply", "COMPLETE")
    ack = runs.one("postgres_cdc_microbatch.postgres_cdc.ack", "COMPLETE")
    window = drain["run"]["facets"]["postgresCdcBatch"]
    assert window["kind"] == "batch" and Lsn.parse(window["endLsn"]) == runs.acked
    assert Lsn.parse(window["startLsn"]) < runs.acked
    assert window["cutTag"] == tag_name(runs.acked)
    assert window["changes"] == 3 and window["transactions"] == 1  # id 11 is filtered out
    for event in (apply, ack):
        assert event["run"]["facets"]["postgresCdcBatch"] == window
    assert {d["name"] for d in drain["inputs"]} == {
        f"{runs.database}.{SCHEMA}.{TABLE}",
        f"{runs.database}.public.customers",
    }
    outputs = by_name(apply["outputs"])
    hostile, customers = runs.lake_table(SCHEMA, TABLE), runs.lake_table("public", "customers")
    changelog_name = runs.lake_table("public", "customers", "__pgl_changelog")
    assert set(outputs) == {
        hostile, runs.lake_table(SCHEMA, TABLE, "__pgl_changelog"), customers, changelog_name,
    }  # fmt: skip
    stats = {key: d["outputFacets"]["outputStatistics"]["rowCount"] for key, d in outputs.items()}
    assert stats[hostile] == 1 and stats[customers] == 2
    changelog = outputs[changelog_name]
    assert symlinks(changelog) == [("iceberg://lake", "public.customers__pgl_changelog", "TABLE")]
    assert {"id", "name", "amount"} <= set(changelog["facets"]["columnLineage"]["fields"])
    assert set(fields(changelog)) - set(changelog["facets"]["columnLineage"]["fields"])  # its own columns
    assert set(by_name(ack["inputs"])) == {hostile, customers}
    assert [(d["namespace"], d["name"]) for d in ack["outputs"]] == [("postgres-cdc://lake", SLOT)]


def test_hostile_tables_get_their_own_asset_events(runs: Runs) -> None:
    """The same runs' Asset events (Airflow's metadata database): one per table and load or batch,
    under valid, distinct URIs however the tables are named, and the cut once acknowledged."""
    hostile, customers = (
        table_asset(runs.lake, *name).uri for name in ((SCHEMA, TABLE), ("public", "customers"))
    )
    assert hostile.isascii() and " " not in hostile and hostile != customers
    by_task: dict[str, dict[str, dict[str, Any]]] = {}
    for event in runs.assets:
        by_task.setdefault(str(event.source_task_id), {})[event.uri] = event.extra
    loads, applied = by_task["postgres_cdc_snapshot.load"], by_task["postgres_cdc.apply"]
    assert set(loads) == set(applied) == {hostile, customers}
    assert (loads[hostile]["kind"], loads[hostile]["rows_inserted"], loads[customers]["rows_inserted"]) == (
        "snapshot",
        4,
        5,
    )
    assert loads[hostile]["table"] == f"{SCHEMA}.{TABLE}"
    rows = {uri: (e["rows_inserted"], e["rows_updated"], e["rows_deleted"]) for uri, e in applied.items()}
    assert rows == {hostile: (1, 0, 0), customers: (0, 1, 1)}  # id 11 is outside the row filter
    (cut,) = by_task["postgres_cdc.ack"].items()
    # Only the ack announces a cut: a snapshot load is no acknowledged cut, and schedules nothing
    # downstream of it (test_scheduled_cdc).
    assert [task for task, events in by_task.items() if cut[0] in events] == ["postgres_cdc.ack"]
    assert cut[0] == cut_asset(runs.lake, SLOT).uri and Lsn.parse(cut[1]["lsn"]) == runs.acked
    assert cut[1]["tag"] == tag_name(runs.acked) == applied[hostile]["tag"]


def test_spark_41_and_iceberg_112_wrote_a_lake_equal_to_its_source(runs: Runs) -> None:
    results = compare_tables(runs.dsn, [PUBLICATION], runs.lake)
    assert all(r.equal for r in results), format_report(results)
    assert {r.table for r in results} == {f"{SCHEMA}.{TABLE}", "public.customers"}
    cut = latest_cut(runs.lake, SLOT)  # tagged by the 4.1 apply, then acknowledged
    assert cut is not None and cut.lsn == runs.acked
    tables = owned_tables(open_catalog(runs.lake), runs.lake, SLOT)
    assert len(tables) == 2
    for table in tables:
        summary = table.current_snapshot().summary
        assert summary["engine-name"] == "spark" and summary["engine-version"].startswith("4.1."), summary
        assert summary["iceberg-version"].startswith("Apache Iceberg 1.12."), summary
