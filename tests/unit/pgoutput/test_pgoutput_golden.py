"""Golden tests: messages captured from a real PostgreSQL 15 server (tests/data/pgoutput/capture.py).

Each test pins what the server sent for a known workload, field by field, so a decoder that reads
a field with the wrong width or confuses unchanged TOAST with NULL fails here: the per-message
decoder's messages, and the change tables of the drain's columnar decoder (compared with the
test oracle's where both apply).
"""

from __future__ import annotations

import datetime as dt
import decimal
from typing import Any

import pyarrow as pa
import pytest

from airflow_provider_postgres_cdc.errors import UnsupportedBinaryTypeError
from airflow_provider_postgres_cdc.formats.lsn import Lsn
from airflow_provider_postgres_cdc.formats.pgtypes import pg_timestamp
from airflow_provider_postgres_cdc.pgoutput.arrow import DecodedBatch
from airflow_provider_postgres_cdc.pgoutput.columnar import BatchDecoder
from airflow_provider_postgres_cdc.pgoutput.decoder import PgOutputDecoder
from airflow_provider_postgres_cdc.pgoutput.messages import (
    Begin,
    BeginPrepare,
    Commit,
    CommitPrepared,
    Delete,
    Insert,
    LogicalMessage,
    Message,
    Origin,
    Prepare,
    Relation,
    RollbackPrepared,
    StreamAbort,
    StreamCommit,
    StreamPrepare,
    StreamStart,
    StreamStop,
    Truncate,
    Type,
    Update,
)
from tests.oracle.assembly import committed_transactions
from tests.oracle.tables import assert_same_tables, transactions_to_tables


def decode_all(capture: Any) -> list[Message]:
    decoder = PgOutputDecoder(capture.protocol_version)
    return [decoder.decode(m, lsn) for m, lsn in zip(capture.messages, capture.lsns, strict=True)]


def decoded(capture: Any) -> DecodedBatch:
    """What the drain's decoder makes of a whole capture."""
    return BatchDecoder(capture.protocol_version).decode(capture.messages, capture.lsns)


def rows_of(batch: DecodedBatch, table: str) -> list[dict[str, Any]]:
    return [row for t in batch.tables if t.table_name == table for row in t.to_table().to_pylist()]


def of_type(messages: list[Message], kind: type) -> list:  # type: ignore[type-arg]
    return [m for m in messages if isinstance(m, kind)]


def test_proto1_begin_commit_fields_match_the_sql_interface(captures: dict[str, Any]) -> None:
    capture = captures["proto1"]
    messages = decode_all(capture)
    begins = of_type(messages, Begin)
    commits = of_type(messages, Commit)
    assert len(begins) == len(commits) == 18
    for begin, commit in zip(begins, commits, strict=True):
        assert begin.final_lsn == commit.commit_lsn
        assert begin.commit_time == commit.commit_time
        assert commit.end_lsn > commit.commit_lsn
        # Timestamps are microseconds since 2000-01-01: the capture was made after 2024.
        assert pg_timestamp(commit.commit_time).year >= 2024
    # The xid column of pg_logical_slot_peek_binary_changes equals Begin's Int32 xid.
    for message, xid in zip(messages, capture.xids, strict=True):
        if isinstance(message, Begin):
            assert message.xid == xid


def test_proto1_relation_type_and_tuples(captures: dict[str, Any]) -> None:
    messages = decode_all(captures["proto1"])
    mood = of_type(messages, Type)[0]
    assert (mood.namespace, mood.name, mood.xid) == ("public", "mood", None)
    t = next(r for r in of_type(messages, Relation) if r.name == "t")
    assert [c.name for c in t.columns][:5] == ["id", "name", "ts", "amount", "doc"]
    assert t.key_columns == ("id",)
    assert t.replica_identity == "d"
    assert t.columns[3].typmod == ((12 << 16) | 2) + 4
    assert next(c for c in t.columns if c.name == "m").type_oid == mood.type_oid
    first = of_type(messages, Insert)[0]
    assert first.new.values[:8] == (
        b"1", b"a", b"2024-01-02 03:04:05.123456+00", b"1.50",
        b'{"k": null}', b"\\x00ff", b"t", b'{"a,b",NULL}',
    )  # fmt: skip
    assert first.new.kinds == b"t" * 13
    second = of_type(messages, Insert)[1]
    assert second.new.text(4) == "null"  # JSON null is a value
    assert second.new.kinds[1:2] == b"n"  # SQL NULL


def test_proto1_unchanged_toast_is_not_null(captures: dict[str, Any]) -> None:
    messages = decode_all(captures["proto1"])
    update = of_type(messages, Update)[0]
    big = 10
    assert update.old is None
    assert update.new.kinds[big : big + 1] == b"u"
    assert update.new.is_unchanged(big)
    assert update.new.values[big] is None
    assert not update.new.is_unchanged(1)


def test_proto1_old_key_and_full_old_row(captures: dict[str, Any]) -> None:
    messages = decode_all(captures["proto1"])
    key_update = of_type(messages, Update)[1]
    assert key_update.old_kind == "K"
    assert key_update.old is not None
    assert key_update.old.values[0] == b"2"
    assert set(key_update.old.kinds[1:]) == {ord("n")}
    assert key_update.new.values[0] == b"10"
    key_delete, full_delete = of_type(messages, Delete)
    assert (key_delete.old_kind, key_delete.old.values[0]) == ("K", b"10")
    assert (full_delete.old_kind, full_delete.old.values) == ("O", (b"2", None))
    full_update = of_type(messages, Update)[2]
    assert full_update.old_kind == "O"
    assert full_update.old is not None
    assert full_update.old.values == (b"1", b"one")
    assert full_update.new.values == (b"1", b"uno")


def test_proto1_truncate_messages_and_origin(captures: dict[str, Any]) -> None:
    messages = decode_all(captures["proto1"])
    cascade, plain = of_type(messages, Truncate)
    assert cascade.options == 3  # CASCADE | RESTART IDENTITY
    assert len(cascade.relation_ids) == 2
    assert plain.options == 0
    transactional, plain_message, in_txn = of_type(messages, LogicalMessage)
    assert (transactional.transactional, transactional.prefix, transactional.content) == (
        True, "txn-prefix", b"transactional content"
    )  # fmt: skip
    assert (plain_message.transactional, plain_message.prefix, plain_message.content) == (
        False,
        "plain-prefix",
        b"\x00\xff",
    )
    assert in_txn.prefix == "in-txn"
    origin = of_type(messages, Origin)[0]
    assert (origin.name, origin.commit_lsn) == ("upstream", Lsn.parse("0/ABCDEF"))


def test_proto1_relation_follows_alter_table(captures: dict[str, Any]) -> None:
    tables = decoded(captures["proto1"]).tables
    shapes = [[c.name for c in table.relation.columns] for table in tables if table.table_name == "t"]
    assert len(shapes) == 3
    assert "extra" not in shapes[0]
    assert shapes[1][-1] == "extra" and "flag" in shapes[1]
    assert "flag" not in shapes[2] and shapes[2][-1] == "extra"
    after_add = tables[[t.table_name for t in tables].index("t", 2)].to_table().to_pylist()[0]
    assert (after_add["id"], after_add["name"], after_add["extra"]) == (3, "after add", 42)


def test_proto1_committed_changes_exclude_aborted_work(captures: dict[str, Any]) -> None:
    batch = decoded(captures["proto1"])
    ids = [row["a"] for row in rows_of(batch, "full_t") if row["_pgl_op"] == "I"]
    assert 3 in ids and 5 in ids
    assert 4 not in ids  # rolled back to a savepoint
    assert 6 not in ids  # rolled back transaction
    assert batch.transactions.column("origin").to_pylist()[-1] == "upstream"
    assert batch.transactions.column("origin_lsn").to_pylist()[-1] == Lsn.parse("0/ABCDEF")


def test_proto1_typed_arrow_rows(captures: dict[str, Any]) -> None:
    tables = decoded(captures["proto1"]).tables
    rows = tables[0].to_table().to_pylist()
    first = rows[0]
    assert first["ts"] == dt.datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=dt.UTC)
    assert first["amount"] == decimal.Decimal("1.50")
    assert first["raw"] == b"\x00\xff"
    assert first["tags"] == ["a,b", None]
    assert first["d"] == dt.date(2024, 2, 29)
    assert rows[1]["doc"] == "null" and rows[1]["tags"] == [] and rows[1]["name"] is None
    toast_update = rows[2]
    assert toast_update["_pgl_op"] == "U"
    assert toast_update["_pgl_unchanged"] == ["big"]
    assert toast_update["big"] is None
    assert rows[3]["_pgl_old"]["id"] == 2 and rows[3]["id"] == 10
    assert rows[4]["_pgl_op"] == "D" and rows[4]["id"] is None and rows[4]["_pgl_old"]["id"] == 10
    truncates = [r for t in tables for r in t.to_table().to_pylist() if r["_pgl_op"] == "T"]
    assert sorted(r["_pgl_truncate_flags"] for r in truncates) == [0, 3, 3]


def test_stream_xid_fields_present_exactly_inside_streamed_chunks(captures: dict[str, Any]) -> None:
    capture = captures["stream"]
    decoder = PgOutputDecoder(2)
    inside = False
    for data in capture.messages:
        message = decoder.decode(data)
        if isinstance(message, StreamStart):
            inside = True
        elif isinstance(message, StreamStop):
            inside = False
        elif isinstance(message, Insert | Update | Delete | Relation):
            assert (message.xid is not None) == inside


def test_stream_messages_and_assembly(captures: dict[str, Any]) -> None:
    capture = captures["stream"]
    messages = decode_all(capture)
    starts = of_type(messages, StreamStart)
    assert starts[0].first_segment and not any(s.first_segment for s in starts[1:] if s.xid == starts[0].xid)
    sub_abort, whole_abort = of_type(messages, StreamAbort)
    assert sub_abort.xid == starts[0].xid and sub_abort.subxid != sub_abort.xid
    assert whole_abort.xid == whole_abort.subxid
    assert sub_abort.abort_lsn is None
    (stream_commit,) = of_type(messages, StreamCommit)
    assert stream_commit.xid == starts[0].xid
    batch = decoded(capture)
    assert batch.transactions.column("streamed").to_pylist() == [True, False]
    assert batch.open_xids == []
    big = batch.transactions.slice(0, 1).to_pylist()[0]
    assert (big["xid"], big["commit_lsn"], big["end_lsn"]) == (
        stream_commit.xid, stream_commit.commit_lsn, stream_commit.end_lsn
    )  # fmt: skip
    rows = [row for row in rows_of(batch, "bulk") if row["_pgl_xid"] == big["xid"]]
    ops = [row["_pgl_op"] for row in rows]
    assert ops.count("I") == 1200 and ops.count("U") == 10 and ops.count("D") == 1 == big["changes"] - 1210
    payloads = {row["payload"] for row in rows if row["_pgl_op"] == "I"}
    assert payloads == {"p" * 100}  # the aborted subtransaction's 'q' rows are gone


def test_two_phase_messages_and_assembly(captures: dict[str, Any]) -> None:
    capture = captures["two_phase"]
    messages = decode_all(capture)
    assert [m.gid for m in of_type(messages, BeginPrepare)] == ["gid-commit", "gid-rollback"]
    assert [m.gid for m in of_type(messages, Prepare)] == ["gid-commit", "gid-rollback"]
    assert [m.gid for m in of_type(messages, CommitPrepared)] == ["gid-commit", "gid-stream"]
    (rollback,) = of_type(messages, RollbackPrepared)
    assert rollback.gid == "gid-rollback" and rollback.rollback_end_lsn > rollback.prepare_end_lsn
    (stream_prepare,) = of_type(messages, StreamPrepare)
    assert stream_prepare.gid == "gid-stream"
    batch = decoded(capture)
    assert batch.transactions.column("gid").to_pylist() == ["gid-commit", "gid-stream"]
    assert batch.transactions.column("changes").to_pylist()[0] == 1
    assert [row["a"] for row in rows_of(batch, "full_t")] == [20]
    assert batch.transactions.column("changes").to_pylist()[1] == 1200
    assert batch.prepared_gids == []


def test_decoded_captures_equal_the_oracle(captures: dict[str, Any]) -> None:
    for name in ("proto1", "stream", "two_phase"):
        capture = captures[name]
        batch = decoded(capture)
        oracle = committed_transactions(capture.messages, capture.protocol_version, capture.lsns)
        assert_same_tables(batch.tables, transactions_to_tables(oracle))
        assert batch.transactions.column("xid").to_pylist() == [t.xid for t in oracle]
        assert batch.transactions.column("changes").to_pylist() == [len(t.changes) for t in oracle]


def test_binary_option_values(captures: dict[str, Any]) -> None:
    messages = decode_all(captures["binary"])
    first = of_type(messages, Insert)[0]
    assert first.new.kinds[:2] == b"bb"
    assert first.new.values[0] == b"\x00\x00\x00\x01"  # int4 1, network order
    assert first.new.values[1] == b"a"


def scalars_only(capture: Any, key: str) -> list[bytes]:
    """The messages of one capture list, without the changes of tables other than ``scalars``."""
    decoder = PgOutputDecoder(1)
    kept = []
    for raw in getattr(capture, key):
        message = decoder.decode(raw)
        if (
            isinstance(message, Insert | Update | Delete)
            and decoder.relations[message.relation_id].name != "scalars"
        ):
            continue
        kept.append(raw)
    return kept


def test_binary_values_type_like_their_text_form(captures: dict[str, Any]) -> None:
    """The same changes sent in binary and in text format give the same typed tables."""
    capture = captures["binary"]
    binary, text = scalars_only(capture, "messages"), scalars_only(capture, "text_messages")
    inserts = [c for txn in committed_transactions(binary, 1) for c in txn.changes if c.op == "I"]
    assert inserts and all(set(c.new.kinds) <= {ord("b"), ord("n")} for c in inserts if c.new)
    for route in (
        lambda ms: BatchDecoder(1).decode(ms).tables,
        lambda ms: transactions_to_tables(committed_transactions(ms, 1)),
    ):
        from_binary = [t.to_table() for t in route(binary) if t.table_name == "scalars"]
        from_text = [t.to_table() for t in route(text) if t.table_name == "scalars"]
        assert len(from_binary) == len(from_text) == 1
        assert from_binary[0].num_rows == 5
        assert without_nan(from_binary[0]) == without_nan(from_text[0])


def without_nan(table: Any) -> list[str]:
    """Rows as their repr: NaN (here in f8, also inside ``_pgl_old``) equals itself there."""
    return [repr(row) for row in table.to_pylist()]


def test_binary_format_of_unsupported_types_is_refused(captures: dict[str, Any]) -> None:
    with pytest.raises(UnsupportedBinaryTypeError, match="_text"):
        BatchDecoder(1).decode(captures["binary"].messages)


def test_change_tables_have_exactly_the_staged_format_columns(captures: dict[str, Any]) -> None:
    """docs/FORMATS.md "Change Parquet files": published columns, then these, in this order."""
    expected = [
        ("_pgl_op", pa.string()),
        ("_pgl_commit_lsn", pa.int64()),
        ("_pgl_end_lsn", pa.int64()),
        ("_pgl_seq", pa.int64()),
        ("_pgl_xid", pa.int64()),
        ("_pgl_commit_time", pa.timestamp("us", tz="UTC")),
        ("_pgl_unchanged", pa.list_(pa.string())),
    ]
    for table in BatchDecoder(1).decode(captures["proto1"].messages).tables:
        schema = table.to_table().schema
        published = [c.name for c in table.relation.columns]
        assert schema.names == [*published, *(n for n, _ in expected), "_pgl_old", "_pgl_truncate_flags"]
        assert [(n, schema.field(n).type) for n, _ in expected] == expected
        assert schema.field("_pgl_old").type == pa.struct([schema.field(n) for n in published])
        assert schema.field("_pgl_truncate_flags").type == pa.int8()
