"""Staged input for the apply job built per docs/FORMATS.md with pyarrow, and a reference model.

The model applies changes one at a time to a dict, the way the source database did; the job's
set-based result must equal it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

Row = dict[str, Any]
COMMIT_TIME = datetime(2026, 11, 21, 6, 0, tzinfo=UTC)


def lsn_text(value: int) -> str:
    return f"{value >> 32:X}/{value & 0xFFFFFFFF:X}"


@dataclass
class Change:
    """One staged change: ``row`` is the new row (I/U), ``old`` the old key or row (U with K/O, D)."""

    op: str
    commit_lsn: int
    seq: int
    row: Row | None = None
    old: Row | None = None
    unchanged: list[str] = field(default_factory=list)
    xid: int = 0
    time: datetime | None = None  # its commit time (default: COMMIT_TIME)


def ins(lsn: int, seq: int, **row: Any) -> Change:
    return Change("I", lsn, seq, row=row)


def upd(lsn: int, seq: int, *, old: Row | None = None, unchanged: tuple[str, ...] = (), **row: Any) -> Change:
    return Change("U", lsn, seq, row=row, old=old, unchanged=list(unchanged))


def dele(lsn: int, seq: int, **old: Any) -> Change:
    return Change("D", lsn, seq, old=old)


def trunc(lsn: int, seq: int) -> Change:
    return Change("T", lsn, seq)


@dataclass
class TableDef:
    schema: str
    table: str
    columns: list[tuple[str, pa.DataType]]
    key: list[str]
    replica_identity: str = "d"

    @property
    def dirname(self) -> str:
        return f"{self.schema}.{self.table}"

    @property
    def names(self) -> list[str]:
        return [n for n, _ in self.columns]

    def key_of(self, row: Row) -> tuple[Any, ...]:
        cols = self.names if self.replica_identity == "f" else self.key
        return tuple(row.get(c) for c in cols)

    def manifest_entry(self, rows: int, files: list[str]) -> dict[str, Any]:
        return {
            "schema": self.schema,
            "table": self.table,
            "path": self.dirname,
            "columns": [
                {
                    "name": n,
                    "pg_type": "",
                    "type_oid": 0,
                    "typmod": -1,
                    "arrow_type": str(t),
                    "key": n in self.key,
                }
                for n, t in self.columns
            ],
            "key_columns": [] if self.replica_identity == "f" else self.key,
            "replica_identity": self.replica_identity,
            "rows": rows,
            "files": files,
            "row_filter": None,
            "column_list": None,
            "warnings": [],
        }


def change_table(tdef: TableDef, changes: list[Change]) -> pa.Table:
    """Arrow table of changes with exactly the FORMATS.md ``_pgl_*`` columns."""
    cols: dict[str, pa.Array] = {}
    for name, typ in tdef.columns:
        cols[name] = pa.array([(c.row or {}).get(name) for c in changes], type=typ)
    old_type = pa.struct(tdef.columns)
    cols["_pgl_op"] = pa.array([c.op for c in changes], pa.string())
    cols["_pgl_commit_lsn"] = pa.array([c.commit_lsn for c in changes], pa.int64())
    cols["_pgl_end_lsn"] = pa.array([c.commit_lsn + 40 for c in changes], pa.int64())
    cols["_pgl_seq"] = pa.array([c.seq for c in changes], pa.int64())
    cols["_pgl_xid"] = pa.array([c.xid or c.commit_lsn for c in changes], pa.int64())
    cols["_pgl_commit_time"] = pa.array(
        [c.time or COMMIT_TIME for c in changes], pa.timestamp("us", tz="UTC")
    )
    cols["_pgl_unchanged"] = pa.array([c.unchanged for c in changes], pa.list_(pa.string()))
    cols["_pgl_old"] = pa.array(
        [None if c.old is None else {n: c.old.get(n) for n in tdef.names} for c in changes], old_type
    )
    cols["_pgl_truncate_flags"] = pa.array([0 if c.op == "T" else None for c in changes], pa.int8())
    return pa.table(cols)


class Stager:
    """Writes snapshot and batch directories with their ``_manifest.json`` under ``root/<slot>``."""

    def __init__(self, root: Path, slot: str = "slot1") -> None:
        self.root = root / slot
        self.slot = slot

    def _manifest(self, kind: str, batch_id: str, start: int, end: int, entries: list[dict[str, Any]]) -> str:
        directory = self.root / batch_id
        directory.mkdir(parents=True, exist_ok=True)
        manifest = {
            "format_version": 1,
            "kind": kind,
            "slot": self.slot,
            "database": "db",
            "batch_id": batch_id,
            "start_lsn": lsn_text(start),
            "end_lsn": lsn_text(end),
            "created_at": "2026-11-21T06:00:00Z",
            "tables": entries,
            "stats": {"changes": 0, "transactions": 0, "bytes": 0, "seconds": 0.0},
        }
        if kind == "snapshot":
            manifest["snapshot_name"] = "00000003-00000002-1"
        path = directory / "_manifest.json"
        path.write_text(json.dumps(manifest))
        return str(path)

    def snapshot(self, lsn: int, tables: list[tuple[TableDef, list[Row]]]) -> str:
        batch_id = f"snapshot-{lsn:016X}"
        entries = []
        for tdef, rows in tables:
            (self.root / batch_id / tdef.dirname).mkdir(parents=True, exist_ok=True)
            table = pa.table({n: pa.array([r.get(n) for r in rows], type=t) for n, t in tdef.columns})
            rel = f"{tdef.dirname}/part-00000.parquet"
            pq.write_table(table, self.root / batch_id / rel)
            entries.append(tdef.manifest_entry(len(rows), [rel]))
        return self._manifest("snapshot", batch_id, lsn, lsn, entries)

    def batch(self, start: int, end: int, tables: list[tuple[TableDef, list[Part]]]) -> str:
        """A batch; each table's changes come as one or more part files (a list per file).

        A part given as ``(TableDef, changes)`` is written with that relation version's columns
        (a mid-batch ALTER TABLE); the manifest describes the table's last version.
        """
        batch_id = f"batch-{start:016X}-{end:016X}"
        entries = []
        for tdef, parts in tables:
            (self.root / batch_id / tdef.dirname).mkdir(parents=True, exist_ok=True)
            files = []
            last = tdef
            for i, part in enumerate(parts):
                version, changes = part if isinstance(part, tuple) else (tdef, part)
                rel = f"{tdef.dirname}/part-{i:05d}.parquet"
                pq.write_table(change_table(version, changes), self.root / batch_id / rel)
                files.append(rel)
                last = version
            entries.append(last.manifest_entry(sum(len(changes_of(p)) for p in parts), files))
        return self._manifest("batch", batch_id, start, end, entries)


Part = list[Change] | tuple[TableDef, list[Change]]


def changes_of(part: Part) -> list[Change]:
    return part[1] if isinstance(part, tuple) else part


def model_apply(
    tdef: TableDef, table: dict[tuple[Any, ...], Row], changes: list[Change], base_lsn: int
) -> None:
    """Apply ``changes`` to ``table`` one at a time, in commit order, like the source did."""
    for c in sorted(changes, key=lambda c: (c.commit_lsn, c.seq)):
        if c.commit_lsn < base_lsn:
            continue
        if c.op == "T":
            table.clear()
        elif c.op == "D":
            assert c.old is not None
            table.pop(tdef.key_of(c.old), None)
        else:
            assert c.row is not None
            old_key = tdef.key_of(c.old) if c.old is not None else tdef.key_of(c.row)
            previous = table.get(old_key, {})
            new = {n: previous.get(n) if n in c.unchanged else c.row.get(n) for n in tdef.names}
            if c.old is not None:
                table.pop(old_key, None)
            table[tdef.key_of(new)] = new


def multiset_apply(tdef: TableDef, table: list[Row], changes: list[Change], base_lsn: int) -> None:
    """``model_apply`` for a table without a key (FULL identity or none): ``table`` is a list of
    rows, identical rows count, and an UPDATE or DELETE changes one row equal to its old row.

    A ``u`` column keeps the old row's value (a FULL identity's old tuple carries it).
    """
    for c in sorted(changes, key=lambda c: (c.commit_lsn, c.seq)):
        if c.commit_lsn < base_lsn:
            continue
        if c.op == "T":
            table.clear()
            continue
        if c.op in ("U", "D"):
            assert c.old is not None
            old = {n: c.old.get(n) for n in tdef.names}
            table.remove(old)  # one of the equal rows; ValueError: the stream is not the source's
        if c.op in ("I", "U"):
            assert c.row is not None
            table.append({n: (c.old or {}).get(n) if n in c.unchanged else c.row.get(n) for n in tdef.names})


def rows_of(table: dict[tuple[Any, ...], Row], names: list[str]) -> list[tuple[Any, ...]]:
    return sorted((tuple(r.get(n) for n in names) for r in table.values()), key=repr)


# The orders table most apply tests use: a key, a TOAST-sized payload, a decimal.
ORDERS = TableDef(
    "public",
    "orders",
    [("id", pa.int64()), ("name", pa.string()), ("payload", pa.string()), ("amount", pa.decimal128(10, 2))],
    ["id"],
)
