"""Hand-built messages: protocol 4 fields PostgreSQL 15 cannot send, bad input, and random
workloads on which the drain's columnar decoder must equal the test oracle.

The builders below write each message byte by byte from the message-format page.
"""

from __future__ import annotations

import functools
import json
import struct
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_postgres_cdc.errors import PgOutputDecodeError, PostgresCdcError
from airflow_provider_postgres_cdc.formats.lsn import Lsn
from airflow_provider_postgres_cdc.pgoutput.columnar import BatchDecoder
from airflow_provider_postgres_cdc.pgoutput.decoder import PgOutputDecoder
from airflow_provider_postgres_cdc.pgoutput.messages import StreamAbort
from tests.oracle.assembly import committed_transactions
from tests.oracle.tables import assert_same_tables, reference_tables

Value = bytes | None | str  # bytes: text value, None: NULL, "u": unchanged TOAST, "b:<hex>": binary


def _s(text: str) -> bytes:
    return text.encode() + b"\0"


def _xid(xid: int | None) -> bytes:
    return b"" if xid is None else struct.pack("!I", xid)


def begin(final_lsn: int, commit_time: int, xid: int) -> bytes:
    return b"B" + struct.pack("!QqI", final_lsn, commit_time, xid)


def commit(commit_lsn: int, end_lsn: int, commit_time: int) -> bytes:
    return b"C" + struct.pack("!BQQq", 0, commit_lsn, end_lsn, commit_time)


def relation(
    relation_id: int,
    namespace: str,
    name: str,
    columns: Sequence[tuple[str, int, int, bool]],
    identity: str = "d",
    xid: int | None = None,
) -> bytes:
    body = _xid(xid) + struct.pack("!I", relation_id) + _s(namespace) + _s(name) + identity.encode()
    body += struct.pack("!h", len(columns))
    for column_name, type_oid, typmod, key in columns:
        body += bytes([1 if key else 0]) + _s(column_name) + struct.pack("!Ii", type_oid, typmod)
    return b"R" + body


def tuple_data(values: Sequence[Value]) -> bytes:
    out = struct.pack("!h", len(values))
    for value in values:
        if value is None:
            out += b"n"
        elif value == "u":
            out += b"u"
        elif isinstance(value, str):
            raw = bytes.fromhex(value.removeprefix("b:"))
            out += b"b" + struct.pack("!i", len(raw)) + raw
        else:
            out += b"t" + struct.pack("!i", len(value)) + value
    return out


def insert(relation_id: int, values: Sequence[Value], xid: int | None = None) -> bytes:
    return b"I" + _xid(xid) + struct.pack("!I", relation_id) + b"N" + tuple_data(values)


def update(
    relation_id: int,
    new: Sequence[Value],
    old: Sequence[Value] | None = None,
    old_kind: str = "K",
    xid: int | None = None,
) -> bytes:
    head = b"U" + _xid(xid) + struct.pack("!I", relation_id)
    if old is not None:
        head += old_kind.encode() + tuple_data(old)
    return head + b"N" + tuple_data(new)


def delete(relation_id: int, old: Sequence[Value], old_kind: str = "K", xid: int | None = None) -> bytes:
    return b"D" + _xid(xid) + struct.pack("!I", relation_id) + old_kind.encode() + tuple_data(old)


def truncate(relation_ids: Sequence[int], options: int, xid: int | None = None) -> bytes:
    return (
        b"T"
        + _xid(xid)
        + struct.pack("!IB", len(relation_ids), options)
        + b"".join(struct.pack("!I", r) for r in relation_ids)
    )


def stream_start(xid: int, first: bool) -> bytes:
    return b"S" + struct.pack("!IB", xid, 1 if first else 0)


def stream_stop() -> bytes:
    return b"E"


def stream_commit(xid: int, commit_lsn: int, end_lsn: int, commit_time: int) -> bytes:
    return b"c" + struct.pack("!IBQQq", xid, 0, commit_lsn, end_lsn, commit_time)


def stream_abort(xid: int, subxid: int, abort_lsn: int | None = None, abort_time: int | None = None) -> bytes:
    body = struct.pack("!II", xid, subxid)
    if abort_lsn is not None and abort_time is not None:
        body += struct.pack("!Qq", abort_lsn, abort_time)
    return b"A" + body


def logical_message(
    prefix: str, content: bytes, transactional: bool, lsn: int, xid: int | None = None
) -> bytes:
    return (
        b"M" + _xid(xid) + bytes([1 if transactional else 0]) + struct.pack("!Q", lsn) + _s(prefix)
        + struct.pack("!i", len(content)) + content
    )  # fmt: skip


# --- protocol 4 -------------------------------------------------------------------------------


def test_protocol4_stream_abort_carries_abort_lsn_and_time() -> None:
    decoder = PgOutputDecoder(4)
    assert decoder.decode(stream_abort(700, 701, 0x1_0000_0A28, 12_345)) == StreamAbort(
        700, 701, Lsn(0x1_0000_0A28), 12_345
    )
    # Protocol 4 without streaming = parallel sends the short form.
    assert decoder.decode(stream_abort(700, 700)) == StreamAbort(700, 700)


def test_abort_lsn_fields_are_trailing_bytes_before_protocol_4() -> None:
    with pytest.raises(PgOutputDecodeError) as info:
        PgOutputDecoder(3).decode(stream_abort(700, 701, 1, 2), lsn=Lsn(99))
    assert (info.value.message_type, info.value.offset, info.value.lsn) == ("A", 9, Lsn(99))


COLUMNS = [("id", 23, -1, True), ("name", 25, -1, False)]


def test_protocol4_streamed_subtransaction_abort_is_discarded() -> None:
    messages = [
        stream_start(700, True),
        relation(1, "public", "t", COLUMNS, xid=700),
        insert(1, [b"1", b"kept"], xid=700),
        insert(1, [b"2", b"aborted"], xid=701),
        stream_stop(),
        stream_abort(700, 701, 0x500, 77),
        stream_start(700, False),
        insert(1, [b"3", b"kept too"], xid=700),
        stream_stop(),
        stream_commit(700, 0x600, 0x630, 88),
    ]
    reference = reference_tables(messages, 4)
    assert [r["id"] for r in reference[0].to_table().to_pylist()] == [1, 3]
    assert_same_tables(BatchDecoder(4).decode(messages).tables, reference)


# --- bad input --------------------------------------------------------------------------------

ANNOUNCE = relation(1, "public", "t", COLUMNS)
GOOD_INSERT = insert(1, [b"1", b"x"])
BAD_INPUT = [
    pytest.param(begin(1, 2, 3)[:10], "B", 1, id="truncated-begin"),
    pytest.param(b"Z\x00\x00", "Z", 0, id="unknown-type"),
    pytest.param(
        GOOD_INSERT.replace(b"t\x00\x00\x00\x01x", b"x\x00\x00\x00\x01x"), "I", 14, id="unknown-kind"
    ),
    pytest.param(insert(2, [b"1", b"x"]), "I", 1, id="unknown-relation"),
    pytest.param(
        GOOD_INSERT.replace(b"\x00\x00\x00\x01x", b"\x00\x00\x03\xe8x"), "I", 19, id="length-past-end"
    ),
    pytest.param(GOOD_INSERT + b"\x00", "I", len(GOOD_INSERT), id="trailing-bytes"),
    pytest.param(insert(1, [b"1"]), "I", 6, id="column-count"),
    pytest.param(b"", "?", 0, id="empty"),
    # Only CASCADE (1) and RESTART IDENTITY (2) exist: 0x80 once decoded as a null flag (int8 overflow).
    pytest.param(b"T" + struct.pack("!IB", 1, 0x80) + struct.pack("!I", 1), "T", 5, id="truncate-options"),
]


@pytest.mark.parametrize(("data", "message_type", "offset"), BAD_INPUT)
def test_bad_input_raises_one_decode_error(data: bytes, message_type: str, offset: int) -> None:
    decoder = PgOutputDecoder(1)
    decoder.decode(ANNOUNCE)
    with pytest.raises(PgOutputDecodeError) as info:
        decoder.decode(data, lsn=Lsn(0x16B3748))
    assert (info.value.message_type, info.value.offset, info.value.lsn) == (
        message_type,
        offset,
        Lsn(0x16B3748),
    )
    assert "0/16B3748" in str(info.value)


@pytest.mark.parametrize(("data", "message_type", "offset"), BAD_INPUT)
def test_bad_input_raises_one_decode_error_in_the_columnar_route(
    data: bytes, message_type: str, offset: int
) -> None:
    messages = [begin(0x200, 1, 5), ANNOUNCE, GOOD_INSERT, data, commit(0x200, 0x230, 1)]
    with pytest.raises(PgOutputDecodeError) as info:
        BatchDecoder(1).decode(messages, [0x100, 0x100, 0x108, 0x110, 0x230])
    assert (info.value.message_type, info.value.offset, info.value.lsn) == (message_type, offset, Lsn(0x110))


def test_change_outside_a_transaction_is_rejected() -> None:
    with pytest.raises(PgOutputDecodeError):
        BatchDecoder(1).decode([ANNOUNCE, GOOD_INSERT])


MUTATIONS = st.one_of(
    st.tuples(st.just("truncate"), st.integers(0, 10_000), st.just(0)),
    st.tuples(st.just("set"), st.integers(0, 10_000), st.integers(0, 255)),
    st.tuples(st.just("insert"), st.integers(0, 10_000), st.integers(0, 255)),
)


def mutate(data: bytes, mutation: tuple[str, int, int]) -> bytes:
    kind, where, value = mutation
    where = where % (len(data) + 1)
    if kind == "truncate":
        return data[:where]
    if kind == "set" and where < len(data):
        return data[:where] + bytes([value]) + data[where + 1 :]
    return data[:where] + bytes([value]) + data[where:]


@functools.cache
def captured(name: str) -> tuple[int, list[bytes], list[int]]:
    """Protocol version, messages and LSNs of a capture (not a fixture: hypothesis prints those)."""
    raw = json.loads((Path(__file__).resolve().parents[2] / "data" / "pgoutput" / f"{name}.json").read_text())
    messages = [bytes.fromhex(m["data"]) for m in raw["messages"]]
    return int(raw["options"]["proto_version"]), messages, [int(Lsn.parse(m["lsn"])) for m in raw["messages"]]


@settings(max_examples=300, deadline=None)
@given(
    scenario=st.sampled_from(["proto1", "binary", "two_phase"]),
    index=st.integers(0, 10**6),
    mutation=MUTATIONS,
)
def test_fuzz_mutated_server_messages_never_crash_the_decoder(
    scenario: str, index: int, mutation: tuple[str, int, int]
) -> None:
    protocol, messages, lsns = captured(scenario)
    index %= len(messages)
    decoder = PgOutputDecoder(protocol)
    for data in messages[:index]:
        decoder.decode(data)
    try:
        decoder.decode(mutate(messages[index], mutation), Lsn(lsns[index]))
    except PgOutputDecodeError as exc:
        assert exc.lsn == Lsn(lsns[index])


@settings(max_examples=60, deadline=None)
@given(index=st.integers(0, 10**6), mutation=MUTATIONS)
def test_fuzz_columnar_route_agrees_with_reference_or_raises(
    index: int, mutation: tuple[str, int, int]
) -> None:
    """A mutated message either fails both routes with a package error, or both decode it equally:
    the columnar route never returns silently different values."""
    messages = list(captured("proto1")[1])
    index %= len(messages)
    messages[index] = mutate(messages[index], mutation)
    try:
        reference = reference_tables(messages, 1)
    except PostgresCdcError as exc:
        reference_error: Exception | None = exc
    else:
        reference_error = None
    try:
        columnar = BatchDecoder(1).decode(messages).tables
    except PostgresCdcError as exc:
        assert reference_error is not None, f"only the columnar route failed: {exc}"
        return
    assert reference_error is None, f"only the reference route failed: {reference_error}"
    assert_same_tables(columnar, reference)


# --- random workloads: columnar route == reference route --------------------------------------

TYPES = [("id", 23, -1, True), ("name", 25, -1, False), ("amount", 1700, ((12 << 16) | 2) + 4, False),
         ("ts", 1184, -1, False), ("doc", 3802, -1, False), ("flag", 16, -1, False)]  # fmt: skip

TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40).map(str.encode)
VALUES = [
    st.integers(-(2**31), 2**31 - 1).map(lambda v: str(v).encode()),
    TEXT,
    st.decimals(min_value=-(10**9), max_value=10**9, places=2, allow_nan=False).map(
        lambda d: f"{d:.2f}".encode()
    ),
    st.datetimes().map(lambda d: (d.isoformat(sep=" ") + "+00").encode()),
    st.sampled_from([b"null", b"{}", b'{"a": [1, null]}', b'"x"']),
    st.sampled_from([b"t", b"f"]),
]


def row(width: int, unchanged: bool) -> st.SearchStrategy[list[Value]]:
    def cell(i: int) -> st.SearchStrategy[Value]:
        options: list[st.SearchStrategy[Value]] = [VALUES[i], st.none()]
        if unchanged and i > 0:
            options.append(st.just("u"))
        return st.one_of(*options)

    return st.tuples(*(cell(i) for i in range(width))).map(list)


@st.composite
def workload(draw: st.DrawFn) -> tuple[list[bytes], int]:
    """Transactions over two tables, some streamed with subtransaction aborts, a mid-stream ALTER."""
    protocol = draw(st.sampled_from([1, 2, 4]))
    widths = {1: draw(st.integers(1, len(TYPES))), 2: draw(st.integers(1, len(TYPES)))}
    messages: list[bytes] = []
    cached: dict[int, int] = {}  # relation id -> width of the shape the receiver has cached
    lsn = 0x1000
    for number in range(draw(st.integers(1, 6))):
        xid = 500 + number * 10
        streamed = protocol >= 2 and draw(st.booleans())
        if draw(st.booleans()):
            rel = draw(st.sampled_from([1, 2]))
            widths[rel] = draw(st.integers(1, len(TYPES)))  # ALTER TABLE: a new shape from here on
        body: list[bytes] = []
        aborted: int | None = None
        for _ in range(draw(st.integers(0, 8))):
            rel = draw(st.sampled_from([1, 2]))
            width = widths[rel]
            sub = xid + draw(st.integers(0, 2)) if streamed else None
            if cached.get(rel) != width or streamed:
                identity = draw(st.sampled_from(["d", "f"]))
                body.append(
                    relation(rel, "public", f"t{rel}", TYPES[:width], identity, xid=xid if streamed else None)
                )
                cached[rel] = width
            op = draw(st.sampled_from(["I", "U", "UK", "UO", "D", "DO", "T"]))
            change_xid = sub if streamed else None
            if op == "I":
                body.append(insert(rel, draw(row(width, False)), xid=change_xid))
            elif op.startswith("U"):
                old = None if op == "U" else draw(row(width, False))
                body.append(update(rel, draw(row(width, True)), old, op[1:] or "K", xid=change_xid))
            elif op.startswith("D"):
                body.append(delete(rel, draw(row(width, False)), op[1:] or "K", xid=change_xid))
            else:
                body.append(truncate([rel], draw(st.integers(0, 3)), xid=change_xid))
            if streamed and sub != xid and draw(st.integers(0, 3)) == 0:
                aborted = sub
        commit_lsn, end_lsn, time = lsn + 0x80, lsn + 0xB0, 800_000_000_000_000 + number
        if streamed:
            cut = draw(st.integers(0, len(body)))
            messages += [stream_start(xid, True), *body[:cut], stream_stop()]
            if aborted is not None:
                messages.append(
                    stream_abort(xid, aborted, lsn + 0x40, time)
                    if protocol >= 4
                    else stream_abort(xid, aborted)
                )
            messages += [stream_start(xid, False), *body[cut:], stream_stop()]
            if draw(st.integers(0, 4)) == 0:
                messages.append(stream_abort(xid, xid))
            else:
                messages.append(stream_commit(xid, commit_lsn, end_lsn, time))
        else:
            messages += [begin(commit_lsn, time, xid), *body, commit(commit_lsn, end_lsn, time)]
        lsn += 0x100
    return messages, protocol


@settings(max_examples=60, deadline=None)
@given(workload())
def test_columnar_route_equals_reference_on_random_workloads(case: tuple[list[bytes], int]) -> None:
    messages, protocol = case
    batch = BatchDecoder(protocol, max_rows=7).decode(messages)
    reference = reference_tables(messages, protocol, max_rows=7)
    assert_same_tables(batch.tables, reference)
    assert all(b.num_rows <= 7 for t in batch.tables for b in t.batches)
    assert batch.changes == sum(t.num_rows for t in reference)


# --- transaction boundaries -------------------------------------------------------------------


def test_undecided_streamed_transactions_are_reported_not_staged() -> None:
    messages = [
        stream_start(700, True),
        relation(1, "public", "t", COLUMNS, xid=700),
        insert(1, [b"1", b"pending"], xid=700),
        stream_stop(),
        begin(0x300, 5, 701),
        relation(1, "public", "t", COLUMNS),
        insert(1, [b"2", b"done"]),
        logical_message("p", b"in txn", True, 0x2F0),
        commit(0x300, 0x330, 5),
        logical_message("q", b"outside", False, 0x340),
    ]
    batch = BatchDecoder(2).decode(messages)
    assert batch.open_xids == [700]
    assert [r["id"] for t in batch.tables for r in t.to_table().to_pylist()] == [2]
    assert batch.end_lsn == Lsn(0x330)
    assert [m.prefix for m in batch.messages] == ["p", "q"]
    assert batch.transactions.column("xid").to_pylist() == [701]


def test_commit_prepared_without_its_prepare_is_an_error() -> None:
    commit_prepared = b"K" + struct.pack("!BQQqI", 0, 0x500, 0x530, 9, 702) + b"gid-x\0"
    with pytest.raises(PgOutputDecodeError, match="gid-x"):
        committed_transactions([commit_prepared], 3, [0x530])
    with pytest.raises(PgOutputDecodeError, match="gid-x"):
        BatchDecoder(3).decode([commit_prepared])


def test_unchanged_toast_in_an_old_tuple_is_refused() -> None:
    messages = [
        begin(0x300, 5, 701),
        ANNOUNCE,
        update(1, [b"1", b"x"], [b"1", "u"], "O"),
        commit(0x300, 0x330, 5),
    ]
    with pytest.raises(PgOutputDecodeError) as info:
        BatchDecoder(1).decode(messages)
    assert (info.value.message_type, info.value.offset) == ("U", 14)
    with pytest.raises(PgOutputDecodeError):
        reference_tables(messages, 1)


@pytest.mark.parametrize(
    ("protocol", "data"),
    [
        (1, stream_start(1, True)),
        (1, stream_stop()),
        (2, b"K" + struct.pack("!BQQqI", 0, 1, 2, 3, 4) + b"g\0"),
    ],
)
def test_messages_of_a_later_protocol_version_are_rejected(protocol: int, data: bytes) -> None:
    with pytest.raises(PgOutputDecodeError, match="not part of protocol version"):
        PgOutputDecoder(protocol).decode(data)


def test_begin_inside_an_open_transaction_is_an_error() -> None:
    messages = [begin(0x300, 5, 701), ANNOUNCE, GOOD_INSERT, begin(0x400, 6, 702), commit(0x400, 0x430, 6)]
    with pytest.raises(PgOutputDecodeError, match="still open"):
        BatchDecoder(1).decode(messages)
    with pytest.raises(PgOutputDecodeError, match="still open"):
        reference_tables(messages, 1)


def test_a_trailing_transaction_without_commit_is_reported_open() -> None:
    batch = BatchDecoder(1).decode([begin(0x300, 5, 701), ANNOUNCE, GOOD_INSERT])
    assert batch.open_xids == [701] and batch.tables == [] and batch.end_lsn is None


def test_malformed_changes_of_an_aborted_stream_still_fail() -> None:
    broken = insert(1, [b"1"], xid=700)  # one column for a two-column relation
    messages = [
        stream_start(700, True),
        relation(1, "public", "t", COLUMNS, xid=700),
        broken,
        stream_stop(),
        stream_abort(700, 700),
    ]
    with pytest.raises(PgOutputDecodeError) as info:
        BatchDecoder(2).decode(messages)
    assert info.value.message_type == "I"


def test_name_that_is_not_utf8_names_the_fix() -> None:
    """Only a SQL_ASCII database can send such a name (names are converted otherwise)."""
    message = relation(1, "public", "x", [("id", 23, -1, True)]).replace(b"x\0", b"\xe9\0")
    with pytest.raises(PgOutputDecodeError, match=r"\\xe9.*rename it to valid UTF-8"):
        PgOutputDecoder(1).decode(message)


def test_sql_ascii_values_are_staged_by_the_raw_text_rule() -> None:
    """With ``raw_text`` an invalid value is escaped (U+10FE00 + byte); without, it is an error."""
    messages = [
        begin(0x100, 0, 7),
        relation(1, "public", "t", [("id", 23, -1, True), ("v", 25, -1, False)]),
        b"I" + struct.pack("!I", 1) + b"N" + tuple_data([b"1", b"caf\xe9"]),
        commit(0x100, 0x110, 0),
    ]
    batch = BatchDecoder(1, raw_text=True).decode(messages).tables[0].batches[0]
    assert batch.column("v").to_pylist() == ["caf\U0010fee9"]
    with pytest.raises(PgOutputDecodeError, match="not valid UTF-8"):
        BatchDecoder(1).decode(messages)
