"""The measurement's decoding of a peeked transaction's Begin message, without a server."""

from __future__ import annotations

import struct
from datetime import UTC, datetime

import pytest

from airflow_provider_postgres_cdc.engine.health.measure import begin_commit_time


def test_begin_message_commit_time() -> None:
    # A Begin captured from PostgreSQL 15: final LSN 0/150A6E0, xid 728, committed at
    # 2026-11-21 05:49:32.851695 UTC (848555372851695 microseconds after 2000-01-01).
    data = b"B" + struct.pack("!QqI", 0x150A6E0, 848_555_372_851_695, 728)
    assert begin_commit_time(data) == datetime(2026, 11, 21, 5, 49, 32, 851695, tzinfo=UTC)
    with pytest.raises(Exception, match="Begin"):
        begin_commit_time(b"C" + bytes(25))
