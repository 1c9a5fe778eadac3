"""The decoder's output: typed Arrow tables in the staged change format (docs/FORMATS.md).

:class:`~.columnar.BatchDecoder` fills a :class:`RawColumns` per relation version with the rows'
untyped values and metadata, and :func:`build_batches` types them and lays them out. Each output
table holds the changes of one *relation version*: when ALTER TABLE changes a relation
mid-batch, the table appears once per shape, each with its own schema, in order.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_postgres_cdc.errors import PgOutputDecodeError
from airflow_provider_postgres_cdc.formats.lsn import Lsn
from airflow_provider_postgres_cdc.formats.manifest import sibling_name
from airflow_provider_postgres_cdc.formats.pgtypes import PG_EPOCH_US, TEXT_OID
from airflow_provider_postgres_cdc.pgoutput.messages import Column, LogicalMessage, Relation
from airflow_provider_postgres_cdc.values import overflow
from airflow_provider_postgres_cdc.values.arrow_types import arrow_type

DEFAULT_MAX_ROWS = 65_536
"""Rows per record batch: bounds the memory a consumer needs per batch it writes."""

METADATA_FIELDS: tuple[pa.Field, ...] = (
    pa.field("_pgl_op", pa.string(), nullable=False),
    pa.field("_pgl_commit_lsn", pa.int64(), nullable=False),
    pa.field("_pgl_end_lsn", pa.int64(), nullable=False),
    pa.field("_pgl_seq", pa.int64(), nullable=False),
    pa.field("_pgl_xid", pa.int64(), nullable=False),
    pa.field("_pgl_commit_time", pa.timestamp("us", tz="UTC"), nullable=False),
    pa.field("_pgl_unchanged", pa.list_(pa.string()), nullable=False),
)

MIXED_FORMATS = "a column mixes text and binary-format values"
UNCHANGED_OLD = "unchanged TOAST in an old tuple: the old value is unknown and cannot be staged"

Int64Array = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(slots=True)
class TableChanges:
    """The changes of one table under one relation version, as record batches of one schema."""

    relation: Relation
    batches: list[pa.RecordBatch]

    @property
    def schema_name(self) -> str:
        return self.relation.namespace

    @property
    def table_name(self) -> str:
        return self.relation.name

    @property
    def num_rows(self) -> int:
        return sum(b.num_rows for b in self.batches)

    def to_table(self) -> pa.Table:
        schema = self.batches[0].schema if self.batches else change_schema(self.relation)
        return pa.Table.from_batches(self.batches, schema=schema)


TRANSACTION_SCHEMA = pa.schema(
    [
        pa.field("xid", pa.int64(), nullable=False),
        pa.field("commit_lsn", pa.int64(), nullable=False),
        pa.field("end_lsn", pa.int64(), nullable=False),
        pa.field("commit_time", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("changes", pa.int64(), nullable=False),
        pa.field("streamed", pa.bool_(), nullable=False),
        pa.field("gid", pa.string()),
        pa.field("origin", pa.string()),
        pa.field("origin_lsn", pa.int64()),
    ]
)
"""One row per committed transaction, in commit order (a table: a batch may hold millions)."""


@dataclass(slots=True)
class DecodedBatch:
    """Everything committed in a run of messages, ready to stage.

    ``transactions`` has one row per committed transaction (:data:`TRANSACTION_SCHEMA`).
    ``end_lsn`` is the end LSN of the last committed transaction (where the slot may advance to
    once the batch is applied), ``None`` when nothing committed. ``messages`` holds the logical
    decoding messages: non-transactional ones, and transactional ones of committed transactions.
    ``open_xids`` are streamed transactions still undecided at the end of the messages,
    ``prepared_gids`` prepared ones: neither is in the tables, and the slot must not advance
    past their start.
    """

    tables: list[TableChanges] = field(default_factory=list)
    transactions: pa.Table = field(default_factory=TRANSACTION_SCHEMA.empty_table)
    messages: list[LogicalMessage] = field(default_factory=list)
    open_xids: list[int] = field(default_factory=list)
    prepared_gids: list[str] = field(default_factory=list)

    @property
    def end_lsn(self) -> Lsn | None:
        if not len(self.transactions):
            return None
        return Lsn(self.transactions.column("end_lsn")[-1].as_py() & Lsn.MAX)

    @property
    def changes(self) -> int:
        total = pc.sum(self.transactions.column("changes")).as_py()
        return int(total or 0)


_INT64_MAX = (1 << 63) - 1


def check_stageable(commit_lsn: Int64Array, end_lsn: Int64Array, commit_time: Int64Array) -> None:
    """Refuse transaction ends the staged int64 columns cannot hold (LSNs from 2**63 on, times
    past year 294,000): they only come from corrupt input, and must not wrap silently.

    ``commit_lsn`` and ``end_lsn`` are the unsigned LSNs reinterpreted as int64 (so too large
    ones are negative).
    """
    if len(commit_lsn) and (
        commit_lsn.min() < 0 or end_lsn.min() < 0 or commit_time.max() > _INT64_MAX - PG_EPOCH_US
    ):
        raise PgOutputDecodeError(
            "commit LSN, end LSN or commit time out of the range the staged int64 columns hold",
            message_type="C",
            offset=0,
        )


def table_relation(relation: Relation) -> Relation:
    """The relation version a table is labelled with: without the streamed-transaction xid."""
    return relation if relation.xid is None else dataclasses.replace(relation, xid=None)


def as_text(relation: Relation, text_columns: Mapping[str, frozenset[str]]) -> Relation:
    """The relation with the columns ``text_columns`` names for it (by ``schema.table``) typed as
    ``text``: their staged values are then exactly the text the stream carries, the PostgreSQL
    output function's, for a step that needs that text (hashing it the same way as a snapshot's)."""
    names = text_columns.get(f"{relation.namespace}.{relation.name}")
    if not names:
        return relation
    columns = tuple(Column(c.flags, c.name, TEXT_OID, -1) if c.name in names else c for c in relation.columns)
    return dataclasses.replace(relation, columns=columns)


def shape_key(relation: Relation) -> tuple[object, ...]:
    """Identity of a relation version (the Relation message minus the streamed xid)."""
    return (
        relation.relation_id,
        relation.namespace,
        relation.name,
        relation.replica_identity,
        relation.columns,
    )


class VersionKeys:
    """Group keys of relation versions, asked for in commit order: a table's shape and its run.

    The run counts how often the table's shape changed before, so a shape that comes back (ADD,
    DROP, then ADD again of the last column) is a version of its own: merged with the first, a
    batch's version chain would lose the steps between them (and a re-added column's missing value).
    """

    def __init__(self) -> None:
        self._last: dict[int, tuple[tuple[object, ...], int]] = {}

    def key(self, relation: Relation) -> tuple[object, ...]:
        shape, seen = shape_key(relation), self._last.get(relation.relation_id)
        run = 0 if seen is None else seen[1] + (seen[0] != shape)
        self._last[relation.relation_id] = (shape, run)
        return (shape, run)


def column_fields(relation: Relation) -> list[pa.Field]:
    """The published columns as Arrow fields, with the PostgreSQL type kept in field metadata."""
    return [
        pa.field(
            column.name,
            arrow_type(column.type_oid, column.typmod),
            metadata={
                b"pg_type_oid": str(column.type_oid).encode(),
                b"pg_typmod": str(column.typmod).encode(),
                b"pg_key": b"true" if column.is_key else b"false",
            },
        )
        for column in relation.columns
    ]


def change_schema(relation: Relation, siblings: Sequence[pa.Field] = ()) -> pa.Schema:
    """Schema of a change table: published columns, the overflow siblings the rows need (in
    ``_pgl_old`` too), then the ``_pgl_*`` metadata columns."""
    columns = [*column_fields(relation), *siblings]
    fields = [
        *columns,
        *METADATA_FIELDS,
        pa.field("_pgl_old", pa.struct(columns)),
        pa.field("_pgl_truncate_flags", pa.int8()),
    ]
    metadata = {
        b"pg_schema": relation.namespace.encode(),
        b"pg_table": relation.name.encode(),
        b"pg_relation_id": str(relation.relation_id).encode(),
        b"pg_replica_identity": relation.replica_identity.encode(),
    }
    return pa.schema(fields, metadata=metadata)


@dataclass(slots=True)
class RawColumns:
    """The raw (untyped) content of one relation version's rows, as :func:`build_batches` takes it."""

    op: pa.Array
    commit_lsn: Int64Array
    end_lsn: Int64Array
    seq: Int64Array
    xid: Int64Array
    commit_time: Int64Array
    unchanged: pa.Array
    truncate_flags: pa.Array
    # Text of the rows that carry a new (old) tuple, in row order, or of all rows (nulls for the
    # others) when the arrays are as long as the table; *_rows are the rows carrying the tuple.
    new: list[pa.Array]
    new_rows: Int64Array
    old: list[pa.Array]
    old_rows: Int64Array


def build_batches(relation: Relation, raw: RawColumns, max_rows: int) -> list[pa.RecordBatch]:
    """Type the raw text columns and lay them out as FORMATS.md's change table.

    Values a column's type cannot hold go to its overflow sibling (:mod:`..overflow`), which
    these batches carry only when some value overflows or the column is unchanged TOAST here.
    """
    columns = relation.columns
    names = [c.name for c in columns]
    overflow.check_names(f"{relation.namespace}.{relation.name}", names)
    count = len(raw.seq)
    # Typing only the rows that carry a tuple, then spreading them out, saves casting nulls.
    spread_new = _spreader(raw.new_rows, raw.new, count)
    new = [_typed(raw.new[i], c, spread_new, count) for i, c in enumerate(columns)]
    toasted = set(pc.unique(pc.list_flatten(raw.unchanged)).to_pylist()) if count else set()
    needed = [
        c.name for c in columns if c.name in toasted and overflow.may_need_sibling(c.type_oid, c.typmod)
    ]
    old: list[tuple[pa.Array, pa.Array | None]] = []
    if len(raw.old_rows):
        spread_old = _spreader(raw.old_rows, raw.old, count)
        old = [_typed(raw.old[i], c, spread_old, count) for i, c in enumerate(columns)]
        needed += [c.name for c, (_, text) in zip(columns, old, strict=True) if text is not None]
    texts = [t for _, t in new]
    fields, new_siblings = overflow.add_siblings(names, [v for v, _ in new], texts, needed)
    schema = change_schema(relation, fields)
    with_sibling = [n for n in names if sibling_name(n) in {f.name for f in fields}]
    old_struct_type = schema.field("_pgl_old").type
    if old:
        old_fields = [v for v, _ in old]
        old_fields += [
            text if text is not None else pa.nulls(count, pa.string())
            for name, (_, text) in zip(names, old, strict=True)
            if name in with_sibling
        ]
        has_old = np.zeros(count, dtype=np.bool_)
        has_old[raw.old_rows] = True
        old_array = pa.StructArray.from_arrays(
            old_fields, fields=list(old_struct_type), mask=pa.array(~has_old)
        )
    else:
        old_array = pa.nulls(count, old_struct_type)
    unchanged = overflow.with_sibling_unchanged(raw.unchanged, with_sibling)
    arrays = [
        *[v for v, _ in new],
        *new_siblings,
        raw.op,
        pa.array(raw.commit_lsn, pa.int64()),
        pa.array(raw.end_lsn, pa.int64()),
        pa.array(raw.seq, pa.int64()),
        pa.array(raw.xid, pa.int64()),
        pa.array(raw.commit_time + PG_EPOCH_US, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
        unchanged,
        old_array,
        raw.truncate_flags,
    ]
    batches: list[pa.RecordBatch] = pa.Table.from_arrays(arrays, schema=schema).to_batches(
        max_chunksize=max_rows
    )
    return batches


def _typed(
    values: pa.Array, column: Column, spreader: pa.Array | None, count: int
) -> tuple[pa.Array, pa.Array | None]:
    """Text values (string arrays) or binary-format ones (binary arrays) to the column's type,
    spread over the table's rows, with the overflow text (None when every value fits)."""
    typed, text = overflow.typed_with_text(values, column.type_oid, column.typmod)
    return _spread(typed, spreader, count), None if text is None else _spread(text, spreader, count)


def _spreader(rows: Int64Array, arrays: list[pa.Array], count: int) -> pa.Array | None:
    """Take-indices placing the values of ``rows`` at their positions, nulls elsewhere."""
    if len(rows) == count or not arrays or len(arrays[0]) == count:
        return None
    index = np.zeros(count, dtype=np.int64)
    index[rows] = np.arange(len(rows), dtype=np.int64)
    missing = np.ones(count, dtype=np.bool_)
    missing[rows] = False
    return pa.array(index, pa.int64(), mask=missing)


def _spread(values: pa.Array, spreader: pa.Array | None, count: int) -> pa.Array:
    if spreader is None:
        return values
    if values.null_count == len(values):
        return pa.nulls(count, values.type)
    return values.take(spreader)
