"""metrics.py: names, tags, and that no metrics backend failure can reach a task."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest
from airflow.sdk.observability import stats

from airflow_provider_postgres_cdc import metrics


class Recorder:
    """A metrics backend that records what it is sent (Airflow's StatsLogger protocol)."""

    def __init__(self, fail: bool = False) -> None:
        self.sent: list[tuple[str, str, Any, dict[str, Any]]] = []
        self.fail = fail

    def _record(self, kind: str, stat: str, value: Any, tags: dict[str, Any] | None = None, **_: Any) -> None:
        if self.fail:
            raise OSError("statsd host unreachable")
        self.sent.append((kind, stat, value, dict(tags or {})))

    def gauge(self, stat: str, value: Any, **kwargs: Any) -> None:
        self._record("gauge", stat, value, **kwargs)

    def timing(self, stat: str, value: Any, **kwargs: Any) -> None:
        self._record("timing", stat, value, **kwargs)


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> Iterator[Recorder]:
    recorder = Recorder(fail=getattr(request, "param", False))
    stats.initialize(factory=lambda: recorder, export_legacy_names=False)  # type: ignore[arg-type,return-value]
    try:
        yield recorder
    finally:
        stats.initialize(factory=None, export_legacy_names=True)  # type: ignore[arg-type]


def test_each_metric_goes_out_tagged_and_by_slot_name(backend: Recorder) -> None:
    metrics.slot_lag("shop_cdc", 4096, None)
    metrics.timing(metrics.APPLY_SECONDS, 1.5, slot="shop_cdc", table="my schema.Tä.ble")
    assert [(k, s) for k, s, _, _ in backend.sent] == [
        ("gauge", "postgres_cdc.slot.lag_bytes"),
        ("gauge", "postgres_cdc.slot.lag_bytes.shop_cdc"),
        ("timing", "postgres_cdc.apply.seconds"),
        ("timing", "postgres_cdc.apply.seconds.shop_cdc"),
    ]
    assert backend.sent[2][3] == {"slot": "shop_cdc", "table": "my schema.Tä.ble"}
    assert backend.sent[2][2].total_seconds() == 1.5


@pytest.mark.parametrize("backend", [True], indirect=True)
def test_a_failing_backend_fails_no_caller(backend: Recorder, caplog: pytest.LogCaptureFixture) -> None:
    metrics.gauge(metrics.BATCH_CHANGES, 10, slot="s")
    metrics.timing(metrics.DRAIN_SECONDS, 2.0, slot="s")
    assert "could not send metric postgres_cdc.batch.changes" in caplog.text


def test_an_unresolvable_statsd_host_falls_back_to_no_metrics() -> None:
    from statsd import StatsClient

    def unreachable() -> Any:
        return StatsClient(host="statsd.invalid", port=8125)

    with pytest.raises(socket.gaierror):
        unreachable()
    stats.initialize(factory=unreachable, export_legacy_names=False)
    try:
        metrics.slot_lag("s", 1, 2.0)  # Airflow logs the failure once and sends nothing
    finally:
        stats.initialize(factory=None, export_legacy_names=True)  # type: ignore[arg-type]
