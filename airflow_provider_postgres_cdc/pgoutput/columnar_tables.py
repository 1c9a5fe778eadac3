"""Committed rows of a columnar batch -> one typed change table per relation version, in commit order."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pyarrow as pa

from airflow_provider_postgres_cdc.pgoutput.arrow import (
    UNCHANGED_OLD,
    Int64Array,
    RawColumns,
    TableChanges,
    VersionKeys,
    as_text,
    build_batches,
    table_relation,
)
from airflow_provider_postgres_cdc.pgoutput.columnar_buffer import MessageBuffer
from airflow_provider_postgres_cdc.pgoutput.columnar_transactions import CommittedRows, TransactionColumns
from airflow_provider_postgres_cdc.pgoutput.columnar_tuples import parse_rows, unchanged_lists
from airflow_provider_postgres_cdc.pgoutput.messages import MessageType, Relation, TupleKind

_OPS = pa.array(["I", "U", "D", "T"], pa.string())
_OP_CODE = np.zeros(256, dtype=np.int64)
_OP_CODE[MessageType.UPDATE] = 1
_OP_CODE[MessageType.DELETE] = 2


def relation_tables(
    batch: MessageBuffer,
    rows: CommittedRows,
    per_txn: TransactionColumns,
    max_rows: int,
    text_columns: Mapping[str, frozenset[str]],
) -> list[TableChanges]:
    """Group the rows by relation version and build each version's table (``text_columns``: see
    :func:`.arrow.as_text`)."""
    relation_ids = batch.be32(batch.starts[rows.msg] + 1 + rows.prefix) if len(rows.msg) else rows.msg
    combined = (rows.gen << 32) | relation_ids
    unique, first_row, inverse = np.unique(combined, return_index=True, return_inverse=True)
    # (txn ordinal, seq, relation, truncate index or -1 - unique position), keyed in commit order
    events: list[tuple[int, int, Relation, int]] = []
    for position, key in enumerate(unique.tolist()):
        gen, relation_id = key >> 32, key & 0xFFFFFFFF
        relation = batch.generations[gen].get(relation_id)
        if relation is None:
            culprit = int(np.flatnonzero(inverse == position)[0])
            batch.fail_message(int(rows.msg[culprit]), gen, int(rows.prefix[culprit]))
        row = int(first_row[position])
        events.append((int(rows.txn[row]), int(rows.seq[row]), relation, -1 - position))
    events += [(o, s, r, index) for index, (o, s, r, _) in enumerate(rows.truncates)]
    events.sort(key=lambda event: event[:2])
    version_keys = VersionKeys()
    versions: dict[tuple[object, ...], int] = {}
    relations: list[Relation] = []
    group_of_unique = np.zeros(len(unique), dtype=np.int64)
    truncate_groups: dict[int, list[tuple[int, int, int]]] = {}
    for ordinal, seq, relation, index in events:
        group = versions.setdefault(version_keys.key(relation), len(versions))
        if group == len(relations):
            relations.append(relation)
        if index < 0:
            group_of_unique[-1 - index] = group
        else:
            truncate_groups.setdefault(group, []).append((ordinal, seq, rows.truncates[index][3]))
    group_of_row = group_of_unique[inverse.reshape(-1)] if len(rows.msg) else rows.msg
    order = np.argsort(group_of_row, kind="stable")
    bounds = np.searchsorted(group_of_row[order], np.arange(len(relations) + 1))
    built: list[tuple[tuple[int, int], TableChanges]] = []
    for group, relation in enumerate(relations):
        selected = order[bounds[group] : bounds[group + 1]]
        raw, first = _relation_rows(batch, relation, rows, selected, truncate_groups.get(group, []), per_txn)
        relation = as_text(table_relation(relation), text_columns)
        built.append((first, TableChanges(relation, build_batches(relation, raw, max_rows))))
    built.sort(key=lambda item: item[0])
    return [table for _, table in built]


def _relation_rows(
    batch: MessageBuffer,
    relation: Relation,
    rows: CommittedRows,
    selected: Int64Array,
    truncates: list[tuple[int, int, int]],
    per_txn: TransactionColumns,
) -> tuple[RawColumns, tuple[int, int]]:
    msg = rows.msg[selected]
    txn = rows.txn[selected]
    seq = rows.seq[selected]
    parsed = parse_rows(batch, msg, rows.prefix[selected], rows.gen[selected], len(relation.columns))
    for kind, start in zip(parsed.old.kind, parsed.old.start, strict=True):
        unchanged = np.flatnonzero(kind == TupleKind.UNCHANGED_TOAST.value)
        if len(unchanged):
            batch.fail_at(int(start[unchanged[0]]) - 5, UNCHANGED_OLD)  # at the kind byte
    op_code = _OP_CODE[batch.types[msg]]
    flags = np.full(len(msg), -1, dtype=np.int64)
    new_rows, old_rows = parsed.new_rows, parsed.old_rows
    if truncates:
        t_txn, t_seq, t_opt = (np.array(v, dtype=np.int64) for v in zip(*truncates, strict=True))
        txn = np.concatenate([txn, t_txn])
        seq = np.concatenate([seq, t_seq])
        op_code = np.concatenate([op_code, np.full(len(t_txn), 3, dtype=np.int64)])
        flags = np.concatenate([flags, t_opt])
        order = np.lexsort((seq, txn))
        txn, seq, op_code, flags = txn[order], seq[order], op_code[order], flags[order]
        moved = np.empty(len(order), dtype=np.int64)
        moved[order] = np.arange(len(order), dtype=np.int64)
        new_rows, old_rows = moved[new_rows], moved[old_rows]
    names = pa.array([c.name for c in relation.columns], pa.string())
    unchanged = unchanged_lists(parsed.new, new_rows, len(seq), names)
    new = parsed.new.dense(new_rows, len(seq))
    old = parsed.old.dense(old_rows, len(seq))
    raw = RawColumns(
        op=_OPS.take(pa.array(op_code)),
        commit_lsn=per_txn.commit_lsn[txn],
        end_lsn=per_txn.end_lsn[txn],
        seq=seq,
        xid=per_txn.xid[txn],
        commit_time=per_txn.commit_time[txn],
        unchanged=unchanged,
        new=new.arrays(batch),
        new_rows=new_rows,
        old=old.arrays(batch),
        old_rows=old_rows,
        truncate_flags=pa.array(flags, pa.int8(), mask=flags < 0),
    )
    first = (int(txn[0]), int(seq[0])) if len(txn) else (0, 0)
    return raw, first
