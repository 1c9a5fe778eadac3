"""Oracle tables: assembled transactions -> typed change tables, one Python object per value.

The same tables :class:`~airflow_provider_postgres_cdc.pgoutput.columnar.BatchDecoder` builds,
reached plainly: each change's values are collected into Python lists per relation version and
handed to the package's :func:`~airflow_provider_postgres_cdc.pgoutput.arrow.build_batches`
(the typing and layout are shared; finding the rows, their order and their raw values is what
this compares).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from airflow_provider_postgres_cdc.errors import PgOutputDecodeError
from airflow_provider_postgres_cdc.pgoutput.arrow import (
    DEFAULT_MAX_ROWS,
    MIXED_FORMATS,
    UNCHANGED_OLD,
    RawColumns,
    TableChanges,
    VersionKeys,
    build_batches,
    check_stageable,
    table_relation,
)
from airflow_provider_postgres_cdc.pgoutput.messages import Relation, TupleData, TupleKind
from tests.oracle.assembly import RowChange, Transaction, committed_transactions


class _RowsOf:
    """Python lists of one relation version's rows."""

    def __init__(self, relation: Relation) -> None:
        self.relation = relation
        width = len(relation.columns)
        self.op: list[str] = []
        self.meta: list[tuple[int, int, int, int, int]] = []
        self.unchanged: list[list[str]] = []
        self.new: list[list[bytes | None]] = [[] for _ in range(width)]
        self.new_rows: list[int] = []
        self.old: list[list[bytes | None]] = [[] for _ in range(width)]
        self.old_rows: list[int] = []
        self.kinds: list[set[int]] = [set() for _ in range(width)]  # value kinds seen per column
        self.truncate_flags: list[int | None] = []

    def add(self, txn: Transaction, seq: int, change: RowChange) -> None:
        names = [c.name for c in self.relation.columns]
        self.op.append(change.op)
        self.meta.append((txn.commit_lsn, txn.end_lsn, seq, txn.xid, txn.commit_time))
        new, old = change.new, change.old
        position = len(self.op) - 1
        self.unchanged.append(
            [] if new is None else [names[i] for i in range(len(names)) if new.is_unchanged(i)]
        )
        if new is not None:
            self.new_rows.append(position)
            self._collect(self.new, new)
        if old is not None:
            self.old_rows.append(position)
            self._collect(self.old, old)
        self.truncate_flags.append(change.truncate_options)

    def _collect(self, target: list[list[bytes | None]], data: TupleData) -> None:
        for i, value in enumerate(data.values):
            target[i].append(value)
            if value is not None:
                self.kinds[i].add(data.kinds[i])

    def _arrays(self, columns: list[list[bytes | None]]) -> list[pa.Array]:
        arrays = []
        for values, kinds in zip(columns, self.kinds, strict=True):
            if kinds == {TupleKind.BINARY}:
                arrays.append(pa.array(values, pa.binary()))
            elif TupleKind.BINARY in kinds:
                raise PgOutputDecodeError(MIXED_FORMATS, message_type="?", offset=0)
            else:
                arrays.append(pa.array([_text(v) for v in values], pa.string()))
        return arrays

    def columns(self) -> RawColumns:
        lsns = np.array([m[:2] for m in self.meta], dtype=np.uint64).astype(np.int64).reshape(-1, 2)
        meta = np.array([m[2:] for m in self.meta], dtype=np.int64).reshape(-1, 3)
        check_stageable(lsns[:, 0], lsns[:, 1], meta[:, 2])
        return RawColumns(
            op=pa.array(self.op, pa.string()),
            commit_lsn=lsns[:, 0],
            end_lsn=lsns[:, 1],
            seq=meta[:, 0],
            xid=meta[:, 1],
            commit_time=meta[:, 2],
            unchanged=pa.array(self.unchanged, pa.list_(pa.string())),
            truncate_flags=pa.array(self.truncate_flags, pa.int8()),
            new=self._arrays(self.new),
            new_rows=np.array(self.new_rows, dtype=np.int64),
            old=self._arrays(self.old),
            old_rows=np.array(self.old_rows, dtype=np.int64),
        )


def _text(value: bytes | None) -> str | None:
    try:
        return None if value is None else value.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PgOutputDecodeError(
            f"text value is not valid UTF-8: {exc.reason}", message_type="?", offset=0
        ) from None


def transactions_to_tables(
    transactions: Iterable[Transaction], *, max_rows: int = DEFAULT_MAX_ROWS
) -> list[TableChanges]:
    """Typed change tables of committed transactions, one per relation version, in commit order."""
    groups: dict[tuple[object, ...], _RowsOf] = {}
    keys = VersionKeys()
    for txn in transactions:
        for seq, change in enumerate(txn.changes):
            _check_text_values(change)
            key = keys.key(change.relation)
            rows = groups.get(key)
            if rows is None:
                rows = groups[key] = _RowsOf(table_relation(change.relation))
            rows.add(txn, seq, change)
    return [
        TableChanges(rows.relation, build_batches(rows.relation, rows.columns(), max_rows))
        for rows in groups.values()
    ]


def _check_text_values(change: RowChange) -> None:
    if change.old is not None and TupleKind.UNCHANGED_TOAST in change.old.kinds:
        raise PgOutputDecodeError(UNCHANGED_OLD, message_type=change.op, offset=0)


def reference_tables(
    messages: Sequence[bytes], protocol_version: int, *, max_rows: int = DEFAULT_MAX_ROWS
) -> list[TableChanges]:
    """The oracle's change tables of raw messages."""
    return transactions_to_tables(committed_transactions(messages, protocol_version), max_rows=max_rows)


def _comparable(data_type: pa.DataType) -> pa.DataType:
    """Timestamps as integers: a mutated commit time may lie outside Python's datetime range."""
    if pa.types.is_timestamp(data_type):
        return pa.int64()
    if pa.types.is_struct(data_type):
        return pa.struct([pa.field(f.name, _comparable(f.type)) for f in data_type])
    if pa.types.is_list(data_type):
        return pa.list_(_comparable(data_type.value_type))
    return data_type


def normalised(table: pa.Table) -> list[dict[str, Any]]:
    """Rows with NaN made comparable (NaN != NaN would fail an equal pair)."""
    table = table.cast(pa.schema([pa.field(f.name, _comparable(f.type)) for f in table.schema]))
    return [
        {k: "NaN" if isinstance(v, float) and math.isnan(v) else v for k, v in r.items()}
        for r in table.to_pylist()
    ]


def assert_same_tables(decoded: Sequence[TableChanges], oracle: Sequence[TableChanges]) -> None:
    """The decoder's tables equal the oracle's: relation versions, schemas and rows."""
    assert [t.relation for t in decoded] == [t.relation for t in oracle]
    for ours, theirs in zip(decoded, oracle, strict=True):
        assert ours.to_table().schema == theirs.to_table().schema
        assert normalised(ours.to_table()) == normalised(theirs.to_table())
