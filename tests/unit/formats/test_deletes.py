"""The ``deletes`` option: one mode for every table or a mapping naming tables, as given in Python,
as JSON or as a template renders it, and the errors of a bad one, a keyless table or a switch."""

from __future__ import annotations

import json

import pytest

from airflow_provider_postgres_cdc.errors import DeletesOptionError
from airflow_provider_postgres_cdc.formats.deletes import (
    DELETES_PROPERTY,
    changed_mode_error,
    check_manifest,
    mode_for,
    option_text,
    parse_deletes,
    recorded_mode,
)
from airflow_provider_postgres_cdc.formats.lsn import Lsn
from airflow_provider_postgres_cdc.formats.manifest import ColumnManifest, Manifest, TableManifest


@pytest.mark.parametrize(
    ("option", "parsed"),
    [
        (None, None),
        ("", None),
        ({}, None),
        ("{}", None),
        ("soft", "soft"),
        (" hard ", "hard"),
        ('"soft"', "soft"),  # {{ params.deletes | tojson }} of a text
        ({"public.orders": "soft"}, {"public.orders": "soft"}),
        ('{"public.orders": "soft"}', {"public.orders": "soft"}),
        ("{'public.orders': 'hard'}", {"public.orders": "hard"}),  # a plain {{ params.deletes }}
    ],
)
def test_the_option_reads_every_way_it_is_given(option: object, parsed: object) -> None:
    assert parse_deletes(option) == parsed  # type: ignore[arg-type]
    assert parse_deletes(option_text(parse_deletes(option))) == parsed  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("Soft", 'deletes is "soft" or "hard" for every table'),
        ("[1]", 'deletes is "soft" or "hard" for every table'),
        ({"orders": "soft"}, "'orders' is not a schema.table name"),
        ({"public.orders": "archive"}, "must be 'hard' or 'soft', not 'archive'"),
    ],
)
def test_a_bad_option_says_what_to_write(option: object, message: str) -> None:
    with pytest.raises(DeletesOptionError, match=message.replace("(", r"\(")):
        parse_deletes(option)  # type: ignore[arg-type]


def test_a_table_the_option_does_not_name_keeps_its_recorded_mode() -> None:
    option = parse_deletes({"public.orders": "soft"})
    assert mode_for(option, "public.orders") == "soft"
    assert mode_for(option, "public.items") is None
    assert mode_for("hard", "public.items") == "hard" and mode_for(None, "public.items") is None
    assert recorded_mode({DELETES_PROPERTY: "soft"}) == "soft" and recorded_mode({}) == "hard"


def _manifest(replica_identity: str, keys: tuple[str, ...]) -> Manifest:
    table = TableManifest(
        schema="public", table="orders", key_columns=keys, replica_identity=replica_identity, rows=1,
        files=(), columns=(ColumnManifest("id", "int8", 20, -1, "int64", key=bool(keys)),),
    )  # fmt: skip
    return Manifest("batch", "slot", "db", "batch-1", Lsn(1), Lsn(2), (table,))


@pytest.mark.parametrize(("identity", "keys"), [("f", ("id",)), ("n", ()), ("d", ())])
def test_soft_deletes_need_a_key_the_stream_carries(identity: str, keys: tuple[str, ...]) -> None:
    with pytest.raises(DeletesOptionError, match="its changes carry no key"):
        check_manifest(_manifest(identity, keys), "soft")
    check_manifest(_manifest(identity, keys), {"public.items": "soft"})  # another table
    check_manifest(_manifest("d", ("id",)), "soft")


def test_a_switch_in_a_batch_names_the_backfill_and_its_conf() -> None:
    message = str(changed_mode_error("public.orders", "hard", "soft"))
    assert "postgres_cdc_backfill_tables" in message
    conf = message.split("--conf '", 1)[1].split("'", 1)[0]
    assert json.loads(conf) == {"tables": ["public.orders"], "deletes": {"public.orders": "soft"}}
