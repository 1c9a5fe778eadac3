"""Peak memory of draining one huge transaction, against the drain's ``max_memory_bytes``.

One transaction inserts ``--gigabytes`` GB of row data (rows of about 200 bytes: 5M rows per
GB), then each transport drains it in a child process whose peak RSS (``wait4``'s
``ru_maxrss``) is reported next to the setting and next to the RSS of the same child draining
an empty window (the fixed overhead: interpreter, numpy, pyarrow, psycopg2). docs/DESIGN.md's
invariant 4 holds when ``peak - fixed overhead`` stays under the setting and does not grow with
the transaction.

    flock /tmp/pgl-heavy.lock .venv/bin/python benchmarks/big_transaction.py --gigabytes 1
    flock /tmp/pgl-heavy.lock .venv/bin/python benchmarks/big_transaction.py --gigabytes 2
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from psycopg2 import sql

from airflow_provider_postgres_cdc.replication import connect, create_slot
from airflow_provider_postgres_cdc.testing import PostgresCluster

ROWS_PER_GB = 5_000_000
_CHILD = """
import json, sys, time
from airflow_provider_postgres_cdc.engine.drain import DrainSettings, drain_batch
dsn, staging, transport, memory = sys.argv[1:5]
started = time.monotonic()
result = drain_batch(dsn, DrainSettings("big_slot", ("big_pub",), staging, transport=transport,
                                        max_messages=None, max_memory_bytes=int(memory)))
print(json.dumps({"changes": result.manifest.stats.changes, "seconds": time.monotonic() - started}))
"""


def drain_in_child(dsn: str, transport: str, memory: int) -> tuple[dict[str, float], int]:
    """Drain in a fresh interpreter; returns its report and its peak RSS in bytes."""
    staging = tempfile.mkdtemp(prefix="postgres-cdc-big-")
    try:
        child = subprocess.Popen(
            [sys.executable, "-c", _CHILD, dsn, staging, transport, str(memory)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert child.stdout is not None
        output = child.stdout.read()
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
        if child.returncode:
            raise SystemExit(f"the {transport} drain failed with exit code {child.returncode}")
        return json.loads(output.strip().splitlines()[-1]), usage.ru_maxrss * 1024
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gigabytes", type=float, default=1.0)
    parser.add_argument("--max-memory-mb", type=int, default=256)
    parser.add_argument("--transports", nargs="+", default=["peek", "stream"])
    args = parser.parse_args()
    memory = args.max_memory_mb << 20
    rows = int(args.gigabytes * ROWS_PER_GB)
    settings = {"max_wal_size": "16GB", "shared_buffers": "256MB", "work_mem": "64MB"}
    with PostgresCluster(settings) as cluster:
        cluster.execute(
            "CREATE TABLE big (id bigint, payload text); ALTER TABLE big REPLICA IDENTITY FULL; "
            "CREATE PUBLICATION big_pub FOR TABLE big"
        )
        conn = connect(cluster.dsn())
        create_slot(conn, "big_slot")
        conn.close()
        dsn = cluster.dsn()
        _, fixed = drain_in_child(dsn, "peek", memory)  # an empty window: the fixed overhead
        started = time.monotonic()
        cluster.execute(
            sql.SQL("INSERT INTO big SELECT g, repeat(md5(g::text), 6) FROM generate_series(1, {}) g").format(
                sql.Literal(rows)
            )
        )
        print(
            f"one transaction of {rows:,} rows (~{args.gigabytes:g} GB) in {time.monotonic() - started:.0f} s"
        )
        print(f"max_memory_bytes {memory >> 20} MiB; fixed overhead (empty drain) {fixed / 2**20:.0f} MiB")
        for transport in args.transports:
            report, peak = drain_in_child(dsn, transport, memory)
            print(
                f"{transport:6s} {int(report['changes']):>11,} changes {report['seconds']:7.1f} s  "
                f"peak RSS {peak / 2**20:6.0f} MiB = fixed + {(peak - fixed) / 2**20:4.0f} MiB "
                f"({(peak - fixed) / memory:.2f} of the setting)"
            )


if __name__ == "__main__":
    main()
