"""End to end: a pgbench TPC-B backlog caught up by the CDC DAG, against two baselines measured here.

    make lake-jars && POSTGRES_CDC_SPARK_JARS=... .venv/bin/python benchmarks/end_to_end.py \
        [--changes 1000000] [--scale 10] [--max-messages 1000000]

1. A throwaway PostgreSQL gets ``pgbench -i`` (``--scale`` 10: 1M accounts) and a publication of
   its four tables; the example initial snapshot DAG loads them into a local lake.
2. pgbench's TPC-B writers commit until the slot holds at least ``--changes`` changes (each
   transaction: three updates and one insert), then stop.
3. The baselines, on copies of the slot: the server's own decoding through the SQL interface
   (``count(*)`` of ``pg_logical_slot_peek_binary_changes``), and ``pg_recvlogical`` to /dev/null.
4. One run of the example CDC DAG is triggered under Airflow's scheduler (LocalExecutor and API
   server, as in production); its catch-up starts run after run until the slot is caught up.
   End to end is the first run's start to the last run's end; per stage, the sum of the drain,
   apply and ack tasks' durations over the runs; the rest is Airflow's scheduling between tasks
   and runs.
5. The lake must equal the source.

It prints changes/s end to end and per stage, and the ratios to both baselines.
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
import time
from pathlib import Path

from example_dags import example_dags_sandbox, pipeline_conf

from airflow_provider_postgres_cdc.engine.verify import compare_tables, format_report
from airflow_provider_postgres_cdc.formats.lake import local_lake
from airflow_provider_postgres_cdc.testing import PostgresCluster

CDC = "postgres_cdc_microbatch"
PUBLICATION = "bench_pub"
SLOT = "bench_cdc"
CHANGES_PER_TRANSACTION = 4  # TPC-B: accounts, tellers and branches updated, one history row


def _pending(pg: PostgresCluster, slot: str, what: str) -> int:
    ((count,),) = pg.execute(
        f"SELECT {what} FROM pg_logical_slot_peek_binary_changes("
        f"'{slot}', NULL, NULL, 'proto_version', '1', 'publication_names', '{PUBLICATION}')",
        "bench",
    )
    return int(count)


def _timed(label: str, func: object) -> float:
    started = time.perf_counter()
    func()  # type: ignore[operator]
    seconds = time.perf_counter() - started
    print(f"{label:44s} {seconds:8.2f} s", flush=True)
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--changes", type=int, default=1_000_000, help="backlog to build, in changes")
    parser.add_argument("--scale", type=int, default=10, help="pgbench scale (100,000 accounts each)")
    parser.add_argument("--max-messages", type=int, default=1_000_000, help="the CDC runs' batch bound")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="end-to-end-"))
    (root / "lake").mkdir()
    lake = local_lake(str(root / "lake"))
    conf = pipeline_conf(SLOT, PUBLICATION, root / "staging", max_messages=args.max_messages)
    settings = {"shared_buffers": "512MB", "max_wal_size": "4GB", "logical_decoding_work_mem": "256MB"}
    with PostgresCluster(settings) as pg:
        pg.execute("CREATE DATABASE bench")
        pgbench = str(pg.bindir / "pgbench")
        subprocess.run([pgbench, "-i", "-q", "-s", str(args.scale), pg.dsn("bench")], check=True)
        pg.execute(f"CREATE PUBLICATION {PUBLICATION} FOR ALL TABLES", "bench")
        sandbox = example_dags_sandbox(root / "airflow", pg.uri("bench"), lake)
        _timed(
            "initial snapshot DAG", lambda: sandbox.dags_test("postgres_cdc_initial_snapshot", conf).check()
        )

        transactions = -(-args.changes // CHANGES_PER_TRANSACTION)
        clients = 2
        per_client = -(-transactions // clients)
        _timed(
            f"pgbench: {per_client * clients:,} TPC-B transactions",
            lambda: subprocess.run(
                [
                    pgbench,
                    "-n",
                    "-c",
                    str(clients),
                    "-j",
                    str(clients),
                    "-t",
                    str(per_client),
                    pg.dsn("bench"),
                ],
                check=True,
                capture_output=True,
            ),
        )
        changes = per_client * clients * CHANGES_PER_TRANSACTION
        (end,) = pg.execute("SELECT pg_current_wal_flush_lsn()::text")[0]
        pg.execute(f"SELECT pg_copy_logical_replication_slot('{SLOT}', 'bench_recv')", "bench")
        peek_s = _timed("SQL peek count (server decoding only)", lambda: _pending(pg, SLOT, "count(*)"))
        recv_s = _timed(
            "pg_recvlogical to /dev/null",
            lambda: subprocess.run(
                [
                    str(pg.bindir / "pg_recvlogical"), "-d", pg.dsn("bench"), "--slot", "bench_recv",
                    "--start", "-o", "proto_version=1", "-o", f"publication_names={PUBLICATION}",
                    "-f", "/dev/null", "--endpos", end, "--no-loop",
                ],
                check=True,
            ),
        )  # fmt: skip
        pg.execute("SELECT pg_drop_replication_slot('bench_recv')", "bench")

        with sandbox.services() as services:
            started = time.monotonic()
            services.trigger(CDC, conf).check()
            runs = services.wait_for_runs(CDC, 1).check().runs
            total_s = time.monotonic() - started
            stages: dict[str, float] = {"drain": 0.0, "apply": 0.0, "ack": 0.0}
            for run in runs:
                path = f"/dags/{CDC}/dagRuns/{run.run_id}/taskInstances"
                for task in services.api("GET", path)["task_instances"]:
                    stage = str(task["task_id"]).rsplit(".", 1)[-1]
                    if stage in stages:
                        stages[stage] += float(task["duration"] or 0.0)
        left = _pending(pg, SLOT, "count(*)")
        results = compare_tables(pg.dsn("bench"), [PUBLICATION], lake)
    if not all(r.equal for r in results):
        print("FAILED: the lake differs from the source\n" + format_report(results))
        return 1
    print(f"\n{changes:,} changes, {len(runs)} CDC run(s) of at most {args.max_messages:,} messages; "
          f"{left} message(s) left in the slot")  # fmt: skip
    print(f"{'':28s} {'seconds':>8s} {'changes/s':>12s}")
    print(f"{'SQL peek count':28s} {peek_s:8.1f} {changes / peek_s:12,.0f}")
    print(f"{'pg_recvlogical':28s} {recv_s:8.1f} {changes / recv_s:12,.0f}")
    for stage, seconds in stages.items():
        print(f"{stage + ' (sum over runs)':28s} {seconds:8.1f} {changes / seconds:12,.0f}")
    print(f"{'scheduling, between tasks':28s} {total_s - sum(stages.values()):8.1f}")
    print(f"{'end to end':28s} {total_s:8.1f} {changes / total_s:12,.0f}")
    drain_s = stages["drain"]
    print(f"\nend to end / pg_recvlogical = {recv_s / total_s:.3f}x; / SQL peek = {peek_s / total_s:.3f}x")
    print(f"drain / pg_recvlogical = {recv_s / drain_s:.2f}x; / SQL peek = {peek_s / drain_s:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
