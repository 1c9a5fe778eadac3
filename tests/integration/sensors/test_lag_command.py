"""`pgcdc lag` against the throwaway cluster: table, JSON, spill counters, ages and exit codes."""

from __future__ import annotations

import argparse
import json

import pytest

from airflow_provider_postgres_cdc.cli.lag import register
from airflow_provider_postgres_cdc.errors import SlotNotFoundError
from tests.integration.sensors.slot_lag_support import PASSWORD, PublishedSlot

pytestmark = pytest.mark.integration


def lag_command(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    parser = argparse.ArgumentParser(prog="pgcdc")
    register(parser.add_subparsers())
    args = parser.parse_args(["lag", *argv])
    code = args.func(args)
    return code, capsys.readouterr().out


def table_rows(out: str) -> list[dict[str, str]]:
    """The aligned table's rows as dicts (cells such as "668 kB" contain spaces: cut by header offsets)."""
    lines = out.splitlines()
    header = next(line for line in lines if line.startswith("slot "))
    body = lines[lines.index(header) + 1 :]
    names = header.split()
    starts = [header.index(" " + name) + 1 if i else 0 for i, name in enumerate(names)]
    ends = [*starts[1:], None]
    rows = []
    for line in body:
        if not line.strip():
            break
        rows.append({name: line[a:b].strip() for name, a, b in zip(names, starts, ends, strict=True)})
    return rows


def spill_a_large_transaction(published: PublishedSlot) -> None:
    """Decode a 1 MB transaction with 64 kB of decoding memory: the server spills it to disk."""
    published.write(5000)
    with published.connect() as conn, conn.cursor() as cur:
        cur.execute("SET logical_decoding_work_mem = '64kB'")
        cur.execute(
            "SELECT count(*) FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, "
            "'proto_version', '1', 'publication_names', %s)",
            (published.slot, published.publication),
        )
    conn.close()


def test_lag_table_shows_spill_counters_and_exits_zero_when_healthy(
    published: PublishedSlot, capsys: pytest.CaptureFixture[str]
) -> None:
    spill_a_large_transaction(published)
    code, out = lag_command(
        capsys,
        "--postgres-conn-id",
        published.conn_id,
        "--slot-name",
        published.slot,
        "--publications",
        published.publication,
    )
    assert code == 0, out
    (cells,) = table_rows(out)
    assert cells["slot"] == published.slot
    assert cells["wal_status"] == "reserved"
    assert int(cells["spill_txns"]) >= 1
    assert cells["spill_bytes"].endswith(("kB", "MB"))
    assert cells["oldest_pending"].endswith("s ago")
    assert "unlimited" in out.splitlines()[0]
    assert "spilling to disk: lag_slot" in out
    assert PASSWORD not in out


def test_lag_json_lists_every_slot_with_its_age(
    published: PublishedSlot, capsys: pytest.CaptureFixture[str]
) -> None:
    published.write(10)
    code, out = lag_command(
        capsys,
        "--dsn",
        published.cluster.dsn(published.dbname),
        "--json",
        "--publications",
        published.publication,
    )
    assert code == 0
    slots = {entry["slot_name"]: entry for entry in json.loads(out)}
    ours = slots[published.slot]
    assert ours["status"] == "ok" and ours["problems"] == []
    assert ours["lag_bytes"] > 0 and ours["lag_age_seconds"] >= 0
    assert ours["oldest_unconfirmed_commit"] is not None
    assert ours["stats"]["spill_txns"] == 0


def test_lag_fails_on_a_floor_the_server_cannot_meet(
    published: PublishedSlot, capsys: pytest.CaptureFixture[str]
) -> None:
    # The session cluster has no max_slot_wal_keep_size: safe_wal_size is NULL, a floor cannot apply.
    code, out = lag_command(capsys, "--postgres-conn-id", published.conn_id, "--min-safe-wal", "1GB")
    assert code == 0, out


def test_lag_of_a_missing_slot_is_an_error(
    published: PublishedSlot, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SlotNotFoundError, match="missing_slot"):
        lag_command(capsys, "--postgres-conn-id", published.conn_id, "--slot-name", "missing_slot")


def test_lag_flags_an_inactive_stale_slot(
    published: PublishedSlot, capsys: pytest.CaptureFixture[str]
) -> None:
    published.write(10)
    code, out = lag_command(
        capsys,
        "--postgres-conn-id",
        published.conn_id,
        "--slot-name",
        published.slot,
        "--publications",
        published.publication,
        "--stale-after",
        "0",
    )
    assert code == 0
    assert "STALE" in out and "is inactive and stale" in out
