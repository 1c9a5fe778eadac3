"""Which pipelines the Airflow view shows, and what the Airflow metadata adds to their reports.

Pipelines are configured in the Airflow Variable ``postgres_cdc_report_pipelines``, a JSON list::

    [{"conn_id": "shop_db", "slot": "shop_cdc", "lake_conn_id": "shop_lake",
      "publications": ["shop_pub"], "timeout": 10}]

``publications`` (optional) let the view measure the age of the oldest pending change by
peeking the slot; ``timeout`` (seconds, default 10) bounds each read of the source and the lake.
A Variable, not a plugin setting, so operators change it without restarting the API server; it
holds connection ids only, never a secret.

The metadata read: the pipeline's cut Asset events (issue 22: one per ack that moved the slot,
``extra`` with ``end_lsn``, ``acked_at``, ``latency_seconds``, ``lag_bytes``): the ack time and
end-to-end latency of each batch and the slot's lag after each ack, i.e. the lag over time.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from airflow_provider_postgres_cdc.engine.report import AckPoint
from airflow_provider_postgres_cdc.errors import LakeConfigError
from airflow_provider_postgres_cdc.formats.assets import CutRef

VARIABLE = "postgres_cdc_report_pipelines"
MAX_EVENTS = 500  # the newest acks shown per pipeline


@dataclass(frozen=True, slots=True)
class PipelineSpec:
    """One configured pipeline: the source connection and slot, and the lake connection."""

    conn_id: str
    slot: str
    lake_conn_id: str
    publications: tuple[str, ...] = ()
    timeout: float = 10.0


def parse_pipelines(text: str | None) -> list[PipelineSpec]:
    """The Variable's pipelines; ``LakeConfigError`` saying what is wrong with it."""
    if not text:
        return []
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise LakeConfigError(f"Variable {VARIABLE} is not valid JSON: {exc}") from None
    if not isinstance(data, list):
        raise LakeConfigError(f"Variable {VARIABLE} must be a JSON list of pipelines")
    specs = []
    for item in data:
        if not isinstance(item, dict) or not all(isinstance(item.get(k), str) for k in
                                                 ("conn_id", "slot", "lake_conn_id")):  # fmt: skip
            raise LakeConfigError(
                f"each pipeline of Variable {VARIABLE} needs string conn_id, slot and lake_conn_id: {item!r}"
            )
        specs.append(
            PipelineSpec(
                item["conn_id"],
                item["slot"],
                item["lake_conn_id"],
                tuple(str(p) for p in item.get("publications") or ()),
                float(item.get("timeout") or 10.0),
            )
        )
    return specs


def configured_pipelines() -> list[PipelineSpec]:
    """The pipelines of the Variable (none when it is not set)."""
    from airflow.models import Variable

    return parse_pipelines(Variable.get(VARIABLE, default_var=None))


def ack_points(catalog: str, slot: str) -> list[AckPoint]:
    """The pipeline's acks from its cut Asset's events, oldest first (empty before any)."""
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    uri = CutRef(catalog, slot).uri
    with create_session() as session:
        rows: Sequence[Any] = session.execute(
            select(AssetEvent.extra, AssetEvent.timestamp)
            .join(AssetModel, AssetEvent.asset_id == AssetModel.id)
            .where(AssetModel.uri == uri)
            .order_by(AssetEvent.timestamp.desc())
            .limit(MAX_EVENTS)
        ).all()
    points = [AckPoint.from_event(extra or {}, timestamp) for extra, timestamp in rows]
    return sorted((p for p in points if p is not None), key=lambda p: p.acked_at)
