"""A pipeline's report, Airflow-free: the slot's lag and WAL safety, the lake's batch history, its tables
and latest cut (:mod:`.collect`), as values (:mod:`.model`) and as one self-contained HTML page
(:mod:`.html`). The ``pgcdc report`` command and the Airflow UI plugin show the same report.
"""

from __future__ import annotations

from airflow_provider_postgres_cdc.engine.report.collect import collect_report, read_lake, read_slot
from airflow_provider_postgres_cdc.engine.report.html import render_html
from airflow_provider_postgres_cdc.engine.report.model import (
    AckPoint,
    BatchRow,
    CutRow,
    LakeTableRow,
    PipelineReport,
    SlotRow,
)

__all__ = [
    "AckPoint",
    "BatchRow",
    "CutRow",
    "LakeTableRow",
    "PipelineReport",
    "SlotRow",
    "collect_report",
    "read_lake",
    "read_slot",
    "render_html",
]
