"""Which pipelines the Airflow view shows, and what the Airflow metadata adds to their reports.

Pipelines are configured in the Airflow Variable ``postgres_cdc_report_pipelines``, a JSON list::

    [{"postgres_conn_id": "shop_db", "slot_name": "shop_cdc", "lake_conn_id": "shop_lake",
      "publications": ["shop_pub"], "timeout": 10}]

``postgres_conn_id`` (a ``postgres`` connection), ``slot_name`` and ``lake_conn_id`` are the
pipeline's own, as its DAGs name them. ``publications`` (optional; one name or a list) let the
view measure the age of the oldest pending change by peeking the slot; ``timeout`` (seconds,
default 10) bounds each read of the source and the lake. A Variable, not a plugin setting, so
operators change it without restarting the API server; it holds connection ids only, never a
secret.

The metadata read: the pipeline's cut Asset events (one per ack that moved the slot, ``extra``
with ``end_lsn``, ``acked_at``, ``latency_seconds``, ``lag_bytes``): the ack time and end-to-end
latency of each batch and the slot's lag after each ack, i.e. the lag over time.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_provider_postgres_cdc.errors import LakeConfigError
from airflow_provider_postgres_cdc.formats.assets import CutRef

if TYPE_CHECKING:
    from airflow_provider_postgres_cdc.engine.report import AckPoint

VARIABLE = "postgres_cdc_report_pipelines"
EXAMPLE = '[{"postgres_conn_id": "...", "slot_name": "...", "lake_conn_id": "..."}]'
MAX_EVENTS = 500  # the newest acks shown per pipeline
REQUIRED = ("postgres_conn_id", "slot_name", "lake_conn_id")


@dataclass(frozen=True, slots=True)
class PipelineSpec:
    """One configured pipeline: the source connection and slot, and the lake connection."""

    postgres_conn_id: str
    slot_name: str
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
        raise LakeConfigError(f"Variable {VARIABLE} must be a JSON list of pipelines, like {EXAMPLE}")
    specs = []
    for item in data:
        if not isinstance(item, dict) or not all(isinstance(item.get(key), str) for key in REQUIRED):
            raise LakeConfigError(
                f"each pipeline of Variable {VARIABLE} needs string postgres_conn_id, slot_name and "
                f"lake_conn_id (optional: publications, timeout), like {EXAMPLE}; got {item!r}"
            )
        publications = item.get("publications") or ()
        specs.append(
            PipelineSpec(
                item["postgres_conn_id"],
                item["slot_name"],
                item["lake_conn_id"],
                (publications,) if isinstance(publications, str) else tuple(str(p) for p in publications),
                float(item.get("timeout") or 10.0),
            )
        )
    return specs


def configured_pipelines() -> list[PipelineSpec]:
    """The pipelines of the Variable (none when it is not set)."""
    from airflow.models import Variable

    return parse_pipelines(Variable.get(VARIABLE, default_var=None))


def ack_points(catalog: str, slot_name: str) -> list[AckPoint]:
    """The pipeline's acks from its cut Asset's events, oldest first (empty before any)."""
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    from airflow_provider_postgres_cdc.engine.report import AckPoint

    uri = CutRef(catalog, slot_name).uri
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
