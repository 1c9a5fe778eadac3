"""The per-table mode options (``deletes``, ``history``): each reads every way it is given, refuses
its keyed mode for a table whose changes carry no key, and names the re-snapshot that switches a
table's mode, since a batch cannot."""

from __future__ import annotations

import json

import pytest

from airflow_provider_postgres_cdc.errors import DeletesOptionError, HistoryOptionError
from airflow_provider_postgres_cdc.formats.deletes import DELETES
from airflow_provider_postgres_cdc.formats.history import HISTORY
from airflow_provider_postgres_cdc.formats.lsn import Lsn
from airflow_provider_postgres_cdc.formats.manifest import ColumnManifest, Manifest, TableManifest
from airflow_provider_postgres_cdc.formats.table_modes import TableMode, option_text

OPTIONS = pytest.mark.parametrize(
    ("option", "error"),
    [(DELETES, DeletesOptionError), (HISTORY, HistoryOptionError)],
    ids=["deletes", "history"],
)


@OPTIONS
def test_the_option_reads_every_way_it_is_given(option: TableMode[str], error: type[Exception]) -> None:
    plain, keyed = option.modes
    for given, parsed in [
        (None, None), ("", None), ({}, None), ("{}", None), (keyed, keyed), (f" {plain} ", plain),
        (json.dumps(keyed), keyed), ({"public.orders": keyed}, {"public.orders": keyed}),
        (json.dumps({"public.orders": keyed}), {"public.orders": keyed}),
        (repr({"public.orders": plain}), {"public.orders": plain}),  # a plain {{ params.x }}
    ]:  # fmt: skip
        assert option.parse(given) == parsed  # type: ignore[arg-type]
        assert option.parse(option_text(option.parse(given))) == parsed  # type: ignore[arg-type]
    assert option.mode_for({"public.orders": keyed}, "public.items") is None
    assert option.recorded({option.property: keyed}) == keyed and option.recorded({}) == plain


@OPTIONS
def test_a_bad_option_says_what_to_write(option: TableMode[str], error: type[Exception]) -> None:
    plain, keyed = option.modes
    shape = f'{option.name} is "{plain}" or "{keyed}" for every table, or {{"schema.table": "{keyed}", ...}}'
    for given, message in [
        (keyed.upper(), shape),
        ("[1]", shape),
        ({"orders": keyed}, "'orders' is not a schema.table name"),
        ({"public.orders": "archive"}, f"must be '{plain}' or '{keyed}', not 'archive'"),
    ]:
        with pytest.raises(error) as refused:
            option.parse(given)  # type: ignore[arg-type]
        assert message in str(refused.value)


def _manifest(replica_identity: str, keys: tuple[str, ...]) -> Manifest:
    table = TableManifest(
        schema="public", table="orders", key_columns=keys, replica_identity=replica_identity, rows=1,
        files=(), columns=(ColumnManifest("id", "int8", 20, -1, "int64", key=bool(keys)),),
    )  # fmt: skip
    return Manifest("batch", "slot", "db", "batch-1", Lsn(1), Lsn(2), (table,))


@OPTIONS
@pytest.mark.parametrize(("identity", "keys"), [("f", ("id",)), ("n", ()), ("d", ())])
def test_the_keyed_mode_needs_a_key_the_stream_carries(
    option: TableMode[str], error: type[Exception], identity: str, keys: tuple[str, ...]
) -> None:
    with pytest.raises(
        error, match=f"{option.name}='{option.keyed}' for public.orders: its changes carry no key"
    ):
        option.check_manifest(_manifest(identity, keys), option.keyed)
    option.check_manifest(_manifest(identity, keys), {"public.items": option.keyed})  # another table
    option.check_manifest(_manifest("d", ("id",)), option.keyed)


@OPTIONS
def test_a_switch_in_a_batch_names_the_backfill_and_its_conf(
    option: TableMode[str], error: type[Exception]
) -> None:
    plain, keyed = option.modes
    message = str(option.changed_error("public.orders", plain, keyed))
    assert f"holds rows applied with {option.name}='{plain}'" in message
    assert "postgres_cdc_backfill_tables" in message
    conf = message.split("--conf '", 1)[1].split("'", 1)[0]
    assert json.loads(conf) == {"tables": ["public.orders"], option.name: {"public.orders": keyed}}
