"""The ``column_transforms`` option: its shapes, the recorded text, and the checks against the source."""

from __future__ import annotations

import json

import pytest

from airflow_provider_postgres_cdc.errors import ColumnTransformsError
from airflow_provider_postgres_cdc.formats.column_transforms import (
    TRANSFORMS_PROPERTY,
    check_copy_engine,
    check_keys,
    check_published,
    check_recorded,
    hashed_columns,
    hashes_anything,
    key_id,
    parse_column_transforms,
    recorded_text,
)

OPTION = {"public.customers": {"email": "hash", "ssn": "drop"}}


@pytest.mark.parametrize("given", [OPTION, json.dumps(OPTION), repr(OPTION)])
def test_a_mapping_its_json_and_its_python_text_read_alike(given: object) -> None:
    assert parse_column_transforms(given) == OPTION  # type: ignore[arg-type]


@pytest.mark.parametrize("empty", [None, "", "  ", {}, "{}"])
def test_nothing_given_transforms_nothing(empty: object) -> None:
    assert parse_column_transforms(empty) == {}  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ({"customers": {"email": "hash"}}, r"'customers' is not a schema\.table name"),
        ({"public.customers": {"email": "mask"}}, r"\['email'\] must be 'hash' or 'drop', not 'mask'"),
        ({"public.customers": {}}, r"must map column names to 'hash' or 'drop'"),
        ({"public.customers": ["email"]}, r"must map column names to 'hash' or 'drop'"),
        ({"public.customers": {"": "hash"}}, r"'' is not a column name"),
        ("hash", r'is \{"schema\.table": \{"column": "hash" or "drop"'),
        (["public.customers"], r'is \{"schema\.table": \{"column": "hash" or "drop"'),
    ],
)
def test_a_malformed_option_says_what_it_should_be(option: object, message: str) -> None:
    with pytest.raises(ColumnTransformsError, match=message):
        parse_column_transforms(option)  # type: ignore[arg-type]


def test_the_recorded_text_is_canonical_and_names_the_key_only_when_hashing() -> None:
    a = recorded_text({"ssn": "drop", "email": "hash"}, "k1")
    assert a == recorded_text({"email": "hash", "ssn": "drop"}, "k1")
    assert json.loads(a) == {"columns": {"email": "hash", "ssn": "drop"}, "key_id": "k1"}
    assert json.loads(recorded_text({"ssn": "drop"}, "k1"))["key_id"] is None  # no key in play
    assert recorded_text({}, "k1") == recorded_text(None, None) == ""
    assert hashes_anything(OPTION) and not hashes_anything({"public.t": {"c": "drop"}})
    assert hashed_columns(a) == {"email"} and hashed_columns("") == frozenset()


def test_only_the_local_copy_engine_hashes() -> None:
    check_copy_engine(OPTION, "local")
    check_copy_engine({"public.customers": {"ssn": "drop"}}, "spark")  # the plan never selects it
    with pytest.raises(ColumnTransformsError, match="Run the snapshot with copy_engine='local'"):
        check_copy_engine(OPTION, "spark")


def test_the_key_identifier_tells_keys_apart_and_does_not_contain_the_key() -> None:
    key = b"a secret key of some length"
    assert key_id(key) == key_id(key) != key_id(b"another secret key")
    assert len(key_id(key)) == 16 and key.hex()[:16] != key_id(key)


def test_a_table_or_column_not_published_is_refused_and_several_publications_count_together() -> None:
    published = [("public.customers", ["id", "email"]), ("public.customers", ["ssn"])]
    check_published(OPTION, published)
    with pytest.raises(ColumnTransformsError, match=r"names 'ssn', which the publication does not publish"):
        check_published(OPTION, published[:1])
    with pytest.raises(ColumnTransformsError, match=r"names public\.customers, which the publication"):
        check_published(OPTION, [("public.orders", ["id"])])


def test_dropping_a_key_column_is_refused_and_hashing_one_is_not() -> None:
    check_keys("public.t", {"id": "hash", "note": "drop"}, ["id"])
    with pytest.raises(ColumnTransformsError, match=r"drops 'id', part of the table's replica identity"):
        check_keys("public.t", {"id": "drop"}, ["id", "other"])


def test_a_batch_staged_under_other_transforms_than_its_table_is_refused_naming_the_backfill() -> None:
    text = recorded_text({"email": "hash", "ssn": "drop"}, "k1")
    lake = {TRANSFORMS_PROPERTY: text}
    check_recorded("public.c", lake, text, ["id", "email"])
    check_recorded("public.c", {}, "", ["id", "email"])  # a table loaded without any
    # The source dropped email (and the option with it): the batch does not name it, nothing differs.
    check_recorded("public.c", lake, recorded_text({"ssn": "drop"}, "k2"), ["id"])
    check_recorded("public.c", lake, "", ["id"])  # nor does a batch naming neither transformed column
    refused = [
        ({}, text, ["id", "email"]),  # clear rows, hashed batch
        (lake, "", ["id", "email"]),  # hashed rows, clear batch
        (lake, recorded_text({"email": "hash"}, "k1"), ["id", "email", "ssn"]),  # ssn no longer dropped
        (lake, recorded_text({"email": "hash", "ssn": "drop"}, "k2"), ["id", "email"]),  # another key
    ]
    backfill = r"Re-snapshot the table under the new option with the postgres_cdc_backfill_tables DAG"
    for properties, staged, columns in refused:
        with pytest.raises(ColumnTransformsError, match=backfill):
            check_recorded("public.c", properties, staged, columns)
