"""The manifest JSON round-trips, follows docs/FORMATS.md, and refuses what it cannot read."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_postgres_cdc.errors import ManifestFormatError
from airflow_provider_postgres_cdc.formats.layout import (
    change_batch_id,
    parse_table_dir_name,
    snapshot_batch_id,
    table_dir_name,
)
from airflow_provider_postgres_cdc.formats.lsn import Lsn
from airflow_provider_postgres_cdc.formats.manifest import (
    ColumnManifest,
    Manifest,
    ManifestStats,
    TableManifest,
)


def _table(**overrides: object) -> TableManifest:
    fields: dict[str, object] = {
        "schema": "public",
        "table": "orders",
        "columns": (
            ColumnManifest("id", "int4", 23, -1, "int32", key=True),
            ColumnManifest("amount", "numeric", 1700, 655366, "decimal128(10, 2)"),
        ),
        "key_columns": ("id",),
        "replica_identity": "d",
        "rows": 123,
        "files": ("public.orders/part-00000-0000.parquet",),
        "row_filter": "(amount > 10)",
        "column_list": ("id", "amount"),
        "warnings": (),
    }
    fields.update(overrides)
    return TableManifest(**fields)  # type: ignore[arg-type]


def test_snapshot_manifest_has_the_documented_shape_and_round_trips() -> None:
    manifest = Manifest(
        kind="snapshot",
        slot="s1",
        database="shop",
        batch_id=snapshot_batch_id(Lsn.parse("0/1000A28")),
        start_lsn=Lsn.parse("0/1000A28"),
        end_lsn=Lsn.parse("0/1000A28"),
        snapshot_name="00000003-00000002-1",
        tables=(_table(),),
        created_at="2026-11-21T06:00:00.000000Z",
    )
    data = json.loads(manifest.to_json())
    assert data["format_version"] == 1
    assert data["batch_id"] == "snapshot-0000000001000A28"
    assert data["start_lsn"] == data["end_lsn"] == "0/1000A28"
    assert data["tables"][0]["path"] == "public.orders"
    assert data["tables"][0]["columns"][0] == {
        "name": "id", "pg_type": "int4", "type_oid": 23, "typmod": -1, "arrow_type": "int32", "key": True,
    }  # fmt: skip
    assert set(data["stats"]) == {"changes", "transactions", "bytes", "seconds", "newest_commit_time", "full"}
    assert Manifest.from_json(manifest.to_json()) == manifest
    resnapshot = dataclasses.replace(manifest, snapshot_slot="s1_rs_4242")
    assert json.loads(resnapshot.to_json())["snapshot_slot"] == "s1_rs_4242"
    assert Manifest.from_json(resnapshot.to_json()) == resnapshot
    # When the source was as the snapshot holds it: its slot's creation, else the manifest's writing.
    assert manifest.consistent_time == manifest.created_at and "snapshot_taken_at" not in data
    taken = dataclasses.replace(manifest, snapshot_taken_at="2026-11-21T05:59:58.123456Z")
    assert json.loads(taken.to_json())["snapshot_taken_at"] == taken.consistent_time
    assert Manifest.from_json(taken.to_json()) == taken


def test_batch_manifest_round_trips_without_snapshot_name() -> None:
    start, end = Lsn.parse("1/0"), Lsn.parse("1/A28")
    manifest = Manifest(
        kind="batch",
        slot="s1",
        database="shop",
        batch_id=change_batch_id(start),
        start_lsn=start,
        end_lsn=end,
        tables=(_table(row_filter=None, column_list=None, warnings=("no key",)),),
        stats=ManifestStats(changes=10, transactions=2, bytes=4096, seconds=0.5),
    )
    assert manifest.batch_id == "batch-0000000100000000"  # FORMATS.md: named by the start LSN only
    assert "snapshot_name" not in json.loads(manifest.to_json())
    again = Manifest.from_json(manifest.to_json())
    assert again == manifest and again.stats.changes == 10
    assert again.table("public", "orders").warnings == ("no key",)
    with pytest.raises(KeyError):
        again.table("public", "missing")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"format_version": 2}, "format_version"),
        ({"kind": "delta"}, "kind"),
        ({"start_lsn": "nonsense"}, "not an LSN"),
        ({"slot": None}, "slot"),
    ],
)
def test_unreadable_manifests_are_refused(change: dict[str, object], message: str) -> None:
    manifest = Manifest("snapshot", "s", "d", "snapshot-0", Lsn(0), Lsn(0), (_table(),), snapshot_name="x")
    data = manifest.to_dict()
    for key, value in change.items():
        if value is None:
            del data[key]
        else:
            data[key] = value
    with pytest.raises(ManifestFormatError, match=message):
        Manifest.from_json(json.dumps(data))


def test_not_json_is_a_format_error() -> None:
    with pytest.raises(ManifestFormatError):
        Manifest.from_json("{")
    with pytest.raises(ManifestFormatError):
        Manifest.from_json("[]")


def test_table_dir_names_encode_dots_slashes_and_percent() -> None:
    assert table_dir_name("public", "orders") == "public.orders"
    assert table_dir_name("s", "a.b") == "s.a%2Eb"
    assert table_dir_name("a/b%", "c") == "a%2Fb%25.c"


@given(st.text(min_size=1), st.text(min_size=1))
def test_table_dir_names_are_reversible(schema: str, table: str) -> None:
    name = table_dir_name(schema, table)
    assert name.count(".") == 1 and "/" not in name
    assert parse_table_dir_name(name) == (schema, table)
