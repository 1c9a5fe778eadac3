"""The Asset event payloads (engine/lake_events.py): their pure parts, without a lake."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from airflow_provider_postgres_cdc.engine.lake_catalog import Cut
from airflow_provider_postgres_cdc.engine.lake_events import (
    TableWrite,
    cut_event_extra,
    cut_from_event,
    latency_seconds,
    table_event_extra,
)
from airflow_provider_postgres_cdc.formats.lake import LakeConfig
from airflow_provider_postgres_cdc.formats.layout import change_batch_id
from airflow_provider_postgres_cdc.formats.lsn import Lsn
from airflow_provider_postgres_cdc.formats.manifest import Manifest, ManifestStats

START, END = Lsn.parse("0/16B3748"), Lsn.parse("0/16B9000")
MANIFEST = Manifest(
    kind="batch",
    slot="shop_cdc",
    database="shop",
    batch_id=change_batch_id(START),
    start_lsn=START,
    end_lsn=END,
    tables=(),
    stats=ManifestStats(
        changes=7, transactions=2, seconds=0.5, newest_commit_time="2026-11-27T06:00:00+00:00"
    ),
)


def test_latency_is_from_the_newest_commit_to_the_ack() -> None:
    acked = datetime(2026, 11, 27, 6, 0, 42, tzinfo=UTC)
    assert latency_seconds("2026-11-27T06:00:00.500000+00:00", acked) == 41.5
    assert latency_seconds(None, acked) is None
    assert latency_seconds("2026-11-27T06:01:00+00:00", acked) == 0.0  # clocks apart: never negative


def test_a_cut_event_round_trips_to_the_cut_it_names() -> None:
    lake = LakeConfig()
    hostile = lake.identifier("my.schema", "or.ders %")  # the namespace's dot is encoded, the table's is not
    cut = Cut(END, "pgl_00000000016B9000", {hostile: 11, ("public", "items"): 12})
    extra = cut_event_extra(
        MANIFEST, cut, lake.catalog, acked_at=datetime(2026, 11, 27, 6, 1, tzinfo=UTC), lag_bytes=512
    )
    assert json.loads(json.dumps(extra)) == extra  # an event's extra must be plain JSON
    assert (extra["lsn"], extra["end_lsn"], extra["start_lsn"]) == ("0/16B9000", "0/16B9000", "0/16B3748")
    assert extra["latency_seconds"] == 60.0 and extra["changes"] == 7 and extra["lag_bytes"] == 512
    assert cut_from_event(extra) == cut


@pytest.mark.parametrize("extra", [{}, {"tables": {"a.b": 1}}, {"tables": [], "lsn": "0/1", "tag": "t"}])
def test_not_a_cut_event_says_so(extra: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="not a postgres-cdc cut event"):
        cut_from_event(extra)


def test_a_table_event_names_its_commit() -> None:
    write = TableWrite("public", "orders", "public", "lake.public.orders", 99, None, 3, 2, 1, 0.25)
    extra = table_event_extra(MANIFEST, write)
    assert json.loads(json.dumps(extra)) == extra
    assert extra["snapshot_id"] == 99 and extra["tag"] is None and extra["table"] == "public.orders"
    assert (extra["rows_inserted"], extra["rows_updated"], extra["rows_deleted"]) == (3, 2, 1)
