"""The report's pure parts: ack events read, batches joined to acks, the page escaped and offline,
the view's pipeline setting parsed, and a hung call cut off (no server needed)."""

from __future__ import annotations

import re
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest

from airflow_provider_postgres_cdc.engine.report import (
    AckPoint,
    BatchRow,
    LakeTableRow,
    PipelineReport,
    render_html,
)
from airflow_provider_postgres_cdc.engine.report.collect import _with_acks, _within, live_rows

NOW = datetime(2026, 11, 27, 6, 0, tzinfo=UTC)


def _batch(end: str, newest: datetime | None = None) -> BatchRow:
    return BatchRow("b", "batch", "0/10", end, 2, NOW, 5, 1.5, newest)


def test_ack_event_extra_of_the_contract_and_of_older_events() -> None:
    extra = {"end_lsn": "0/2A0", "acked_at": "2026-11-27T06:00:05+00:00", "latency_seconds": 7.5,
             "lag_bytes": 4096, "batch_id": "b9"}  # fmt: skip
    point = AckPoint.from_event(extra, NOW)
    assert point == AckPoint("0/2A0", NOW + timedelta(seconds=5), 7.5, 4096, "b9")
    older = AckPoint.from_event({"lsn": "0/10", "acked_at": "not a time"}, NOW)
    assert older == AckPoint("0/10", NOW)  # the event's own time; unknown latency and lag
    assert AckPoint.from_event({"slot": "s"}, NOW) is None


def test_batches_join_acks_by_end_lsn_and_latency_falls_back_to_commit_times() -> None:
    newest = NOW - timedelta(seconds=40)
    given, computed, unacked = _with_acks(
        [_batch("0/20"), _batch("0/30", newest), _batch("0/40", newest)],
        [AckPoint("0/20", NOW, latency_seconds=3.0), AckPoint("0/00000030", NOW)],
    )
    assert (given.latency_seconds, computed.latency_seconds, computed.acked_at) == (3.0, 40.0, NOW)
    assert (unacked.acked_at, unacked.latency_seconds) == (None, None)


def test_page_escapes_report_text_and_fetches_nothing() -> None:
    hostile = "</script><img src=x onerror=alert(1)>"
    report = PipelineReport(
        slot="s",
        catalog="lake",
        generated_at=NOW,
        source=None,
        batches=(_batch("0/20"),),
        tables=(LakeTableRow(hostile, None, None, None, None, None, None, note="no commits yet"),),
        problems=(hostile,),
    )
    page = render_html([report], messages=[hostile])
    assert hostile not in page and "&lt;/script&gt;&lt;img" in page
    assert re.search(r"<\w+[^>]*\s(src|href)=", page) is None and "@import" not in page
    assert page.count("unknown") >= 3  # source lag, WAL status, cut, latency: said, not blank


def test_a_hung_call_is_cut_off_and_errors_pass_through() -> None:
    release = threading.Event()
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        _within(0.3, release.wait)
    assert time.monotonic() - started < 2
    release.set()
    assert _within(5, lambda: 42) == 42
    with pytest.raises(ZeroDivisionError):
        _within(5, lambda: 1 // 0)


def test_row_count_nets_out_position_deletes_and_admits_equality_deletes() -> None:
    # a merge-on-read table as the apply job leaves it (numbers from a demo run's public.orders)
    assert (
        live_rows({"total-records": "588", "total-position-deletes": "218", "total-equality-deletes": "0"})
        == 370
    )
    assert live_rows({"total-records": "5"}) == 5
    assert live_rows({"total-records": "9", "total-equality-deletes": "2"}) is None
    assert live_rows({}) is None
