"""What a drain stages of a change table under ``column_transforms``: hashed values, old tuples and
unchanged-TOAST lists included, and nothing of a dropped column."""

from __future__ import annotations

import hashlib
import hmac
from datetime import UTC, datetime

import pyarrow as pa
import pytest

from airflow_provider_postgres_cdc.engine.column_hashing import ColumnTransformer
from airflow_provider_postgres_cdc.errors import ColumnTransformsError
from airflow_provider_postgres_cdc.pgoutput.arrow import TableChanges, as_text, change_schema
from airflow_provider_postgres_cdc.pgoutput.messages import Column, Relation

KEY = b"unit-test-key-0123456789"
RELATION = Relation(
    None,
    1,
    "public",
    "t",
    "f",
    (Column(1, "id", 23, -1), Column(0, "email", 25, -1), Column(0, "ssn", 25, -1)),
)
AT = datetime(2026, 1, 1, tzinfo=UTC)


def _h(text: str) -> str:
    return hmac.new(KEY, text.encode(), hashlib.sha256).hexdigest()


def _change(
    op: str, seq: int, unchanged: list[str], old: dict[str, object] | None = None, **new: object
) -> dict:
    meta = {"_pgl_op": op, "_pgl_commit_lsn": 10, "_pgl_end_lsn": 20, "_pgl_seq": seq, "_pgl_xid": 5}
    return {**new, **meta, "_pgl_commit_time": AT, "_pgl_unchanged": unchanged, "_pgl_old": old}


def _batch() -> pa.RecordBatch:
    rows = [
        _change("I", 0, [], id=1, email="a@x.org", ssn="111"),
        _change("U", 1, ["email", "ssn"], id=1),
        _change("U", 2, ["ssn"], id=1, email="b@x.org"),
        _change("D", 3, [], old={"id": 1, "email": "b@x.org", "ssn": "111"}),
    ]
    return pa.Table.from_pylist(rows, schema=change_schema(RELATION)).to_batches()[0]


@pytest.mark.parametrize("offset", [0, 1])
def test_hashed_values_old_tuples_and_unchanged_lists_lose_every_clear_value(offset: int) -> None:
    transformer = ColumnTransformer({"public.t": {"email": "hash", "ssn": "drop"}}, KEY)
    batch = _batch().slice(offset)  # a slice: offsets into the list and struct children
    out = transformer.changes(TableChanges(RELATION, [batch]))
    assert [c.name for c in out.relation.columns] == ["id", "email"]
    staged = pa.Table.from_batches(out.batches)
    assert "ssn" not in staged.column_names
    expected_email = [_h("a@x.org"), None, _h("b@x.org"), None][offset:]
    assert staged.column("email").to_pylist() == expected_email
    assert staged.column("_pgl_unchanged").to_pylist() == [[], ["email"], [], []][offset:]
    old = staged.column("_pgl_old").to_pylist()
    assert old == [None, None, None, {"id": 1, "email": _h("b@x.org")}][offset:]
    assert "111" not in str(staged.to_pylist()) and "@x.org" not in str(staged.to_pylist())


def test_a_table_without_transforms_passes_untouched_and_a_dropped_key_is_refused() -> None:
    batch = _batch()
    assert ColumnTransformer({"public.other": {"c": "drop"}}).changes(
        TableChanges(RELATION, [batch])
    ).batches == [batch]
    with pytest.raises(ColumnTransformsError, match=r"drops 'id', part of the table's replica identity"):
        ColumnTransformer({"public.t": {"id": "drop"}}).changes(TableChanges(RELATION, [batch]))


def test_the_decoder_types_hashed_columns_as_their_text() -> None:
    dated = Relation(None, 2, "public", "d", "d", (Column(1, "id", 23, -1), Column(0, "born", 1082, -1)))
    retyped = as_text(dated, ColumnTransformer({"public.d": {"born": "hash"}}, KEY).text_columns())
    assert [(c.name, c.type_oid, c.is_key) for c in retyped.columns] == [
        ("id", 23, True),
        ("born", 25, False),
    ]
    assert as_text(dated, {}) is dated


@pytest.mark.parametrize(
    "key", [b"sixteen-byte-key", b"k" * 64, b"a key longer than the block of sha-256 " * 3]
)
def test_hashes_are_hmac_sha256_for_any_key_length_text_bytes_nulls_and_slices(key: bytes) -> None:
    transformer = ColumnTransformer({"public.t": {"e": "hash"}}, key)

    def reference(value: bytes) -> str:
        return hmac.new(key, value, hashlib.sha256).hexdigest()

    texts = pa.array(["a", None, "a", "", "é", "b"]).slice(1)
    assert transformer.hash_values(texts).to_pylist() == [
        None if v is None else reference(v.encode()) for v in texts.to_pylist()
    ]
    assert transformer.hash_values(pa.array([b"\xff\x00"], pa.binary())).to_pylist() == [
        reference(b"\xff\x00")
    ]
    assert transformer.hash_values(pa.nulls(2, pa.string())).to_pylist() == [None, None]
