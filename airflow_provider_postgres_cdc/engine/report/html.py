"""One self-contained HTML page of pipeline reports: tables rendered here, charts drawn by uPlot.

The page fetches nothing at view time: the uPlot script and stylesheet (vendored in ``static/``
with their MIT license) and each report's data are inlined, so the file opens offline, from a
mail attachment or behind the Airflow API server alike. Everything taken from a report is
escaped; JSON inside ``<script>`` has ``<`` escaped so no value can close the element.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from html import escape
from importlib import resources
from typing import Any

from airflow_provider_postgres_cdc.engine.health import format_size
from airflow_provider_postgres_cdc.engine.report.model import PipelineReport

__all__ = ["render_html"]

UNKNOWN = "unknown"

_STYLE = """
body{font-family:system-ui,sans-serif;margin:1.2rem;color:#1c2733;background:#fff}
h1{font-size:1.4rem;margin:0 0 .2rem}h2{font-size:1.2rem;margin:1.6rem 0 .4rem;border-bottom:1px solid #ccd}
h3{font-size:1rem;margin:1rem 0 .3rem}.muted{color:#667}
.cards{display:flex;flex-wrap:wrap;gap:.6rem}
.card{border:1px solid #ccd;border-radius:6px;padding:.4rem .7rem;min-width:9rem}
.card b{display:block;font-size:1.15rem}.card span{font-size:.8rem;color:#556}
.problem{background:#fde8e8;border:1px solid #e0a0a0;border-radius:6px;padding:.4rem .7rem;margin:.3rem 0}
.note{background:#eef3fb;border:1px solid #b9c9e6;
border-radius:6px;padding:.4rem .7rem;margin:.3rem 0;font-size:.9rem}
.risk-ok{color:#17663a}.risk-at_risk,.risk-lost{color:#a01818}
.charts{display:flex;flex-wrap:wrap;gap:1rem}.chart{border:1px solid #dde;border-radius:6px;padding:.3rem}
.chart .empty{width:440px;height:120px;display:flex;align-items:center;justify-content:center;color:#667}
table{border-collapse:collapse;font-size:.85rem;margin:.3rem 0}
th,td{border:1px solid #ccd;padding:.2rem .5rem;text-align:left}
th{background:#f1f3f7}td.num{text-align:right;font-variant-numeric:tabular-nums}
"""

_SCRIPT = """
(function(){
  const fmt = (v, unit) => (Math.round(v * 100) / 100) + (unit || "");
  for (const el of document.querySelectorAll("script.pgl-chart")) {
    const spec = JSON.parse(el.textContent);
    const holder = document.getElementById(spec.target);
    if (!spec.x.length || spec.y.every(v => v == null)) continue;
    const time = spec.time;
    const opts = {
      title: spec.title, width: 440, height: 220,
      // one point (a single measurement, a single batch): a window around it, not uPlot's years
      scales: {x: {time: time, range: (u, min, max) =>
        spec.x.length === 1 ? [spec.x[0] - (time ? 600 : 1), spec.x[0] + (time ? 60 : 1)] : [min, max]}},
      series: [
        {label: time ? "time" : "batch",
         value: (u, v) => v == null ? "--" : time ? new Date(v * 1000).toISOString() : v},
        {label: spec.label, stroke: "#2f6db3", fill: "rgba(47,109,179,0.12)", width: 2,
         points: {show: true, size: 6}, spanGaps: false,
         value: (u, v) => v == null ? "--" : fmt(v, spec.unit)}
      ],
      axes: [time ? {} : {values: (u, vals) => vals.map(v => Number.isInteger(v) ? v : "")}, {size: 70}]
    };
    holder.textContent = "";
    new uPlot(opts, [spec.x, spec.y], holder);
  }
})();
"""


def _asset(name: str) -> str:
    return resources.files("airflow_provider_postgres_cdc.engine.report").joinpath("static", name).read_text()


def _text(value: Any) -> str:
    if value is None:
        return UNKNOWN
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S UTC")
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else f"{value:.2f}"
    return str(value)


def _cell(value: Any, numeric: bool = False) -> str:
    return f"<td{' class=num' if numeric else ''}>{escape(_text(value))}</td>"


def _table(headers: Sequence[str], rows: Sequence[Sequence[tuple[Any, bool]]], css_id: str) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(_cell(v, n) for v, n in row) + "</tr>" for row in rows)
    return f'<table id="{css_id}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _card(label: str, value: str, css_id: str, css: str = "") -> str:
    return (
        f'<div class="card" id="{css_id}"><span>{escape(label)}</span>'
        f'<b class="{css}">{escape(value)}</b></div>'
    )


def _chart(key: str, title: str, label: str, unit: str, xs: list[float], ys: list[float | None],
           time: bool = False) -> str:  # fmt: skip
    """A chart holder, its data as JSON, and a text line that says the same numbers (and stays)."""
    spec = {"target": key, "title": title, "label": label, "unit": unit, "x": xs, "y": ys, "time": time}
    data = json.dumps(spec).replace("<", "\\u003c")
    known = [y for y in ys if y is not None]
    empty = f"{title}: {UNKNOWN}" if not known else ""
    summary = ", ".join(_text(y) for y in ys) if known else UNKNOWN
    return (
        f'<div class="chart"><div id="{key}"><div class="empty">{escape(empty or title)}</div></div>'
        f'<div class="muted" data-series="{escape(key)}">{escape(label)}: {escape(summary)}</div>'
        f'<script type="application/json" class="pgl-chart">{data}</script></div>'
    )


def _pipeline(index: int, report: PipelineReport) -> str:
    key = f"p{index}"
    parts = [f'<section class="pipeline" data-slot="{escape(report.slot)}">']
    parts.append(f"<h2>Slot {escape(report.slot)} &rarr; lake catalog {escape(report.catalog)}</h2>")
    parts += [f'<div class="problem">{escape(problem)}</div>' for problem in report.problems]
    parts += [f'<div class="note">{escape(note)}</div>' for note in report.notes]
    source = report.source
    cards = []
    if source is not None:
        age = UNKNOWN if source.lag_age_seconds is None else f"{source.lag_age_seconds:.0f} s"
        safe = "unlimited" if source.safe_wal_size is None else format_size(source.safe_wal_size)
        cards += [
            _card("lag (bytes)", f"{source.lag_bytes if source.lag_bytes is not None else UNKNOWN}",
                  f"{key}-lag-bytes"),
            _card("lag", format_size(source.lag_bytes), f"{key}-lag"),
            _card("age of oldest pending change", age, f"{key}-lag-age"),
            _card("WAL status", _text(source.wal_status), f"{key}-wal-status", f"risk-{source.wal_risk}"),
            _card("WAL left before safe_wal_size runs out", safe, f"{key}-safe-wal"),
            _card("confirmed flush LSN", _text(source.confirmed_flush_lsn), f"{key}-confirmed"),
            _card("server WAL LSN", source.current_wal_lsn, f"{key}-current"),
        ]  # fmt: skip
    cut = report.cut
    cards.append(_card("latest consistent cut", UNKNOWN if cut is None else cut.lsn, f"{key}-cut"))
    cards.append(_card("batches in the lake", str(len(report.batches)), f"{key}-batch-count"))
    parts.append(f'<div class="cards">{"".join(cards)}</div>')
    if source is not None:
        age_note = f"; lag age: {source.age_note}" if source.age_note else ""
        parts.append(f'<p class="muted">{escape(source.wal_message + age_note)}</p>')
    if cut is not None:
        parts.append(f'<p class="muted">cut tag {escape(cut.tag)} on {cut.tables} tables</p>')
    batches = report.batches
    numbers = [float(i + 1) for i in range(len(batches))]
    lag_x = [t.timestamp() for t, _ in report.lag_history]
    parts.append('<h3>Over time</h3><div class="charts">')
    parts.append(_chart(f"{key}-chart-lag", "Slot lag", "lag bytes", " B", lag_x,
                        [float(b) for _, b in report.lag_history], time=True))  # fmt: skip
    parts.append(_chart(f"{key}-chart-changes", "Changes per batch", "changes", "", numbers,
                        [None if b.changes is None else float(b.changes) for b in batches]))  # fmt: skip
    parts.append(_chart(f"{key}-chart-apply", "Apply duration per batch", "apply seconds", " s", numbers,
                        [b.apply_seconds for b in batches]))  # fmt: skip
    parts.append(_chart(f"{key}-chart-latency", "End-to-end latency per batch", "latency seconds", " s",
                        numbers, [b.latency_seconds for b in batches]))  # fmt: skip
    parts.append("</div><h3>Batches</h3>")
    parts.append(_table(
        ("#", "batch", "kind", "start LSN", "end LSN", "tables", "changes", "apply s", "newest commit",
         "committed", "acked", "latency s"),
        [[(i + 1, True), (b.batch_id, False), (b.kind, False), (b.start_lsn, False), (b.end_lsn, False),
          (b.tables, True), (b.changes, True), (b.apply_seconds, True), (b.newest_commit_time, False),
          (b.committed_at, False), (b.acked_at, False), (b.latency_seconds, True)]
         for i, b in enumerate(batches)],
        f"{key}-batches",
    ))  # fmt: skip
    parts.append("<h3>Lake tables</h3>")
    parts.append(_table(
        ("table", "applied-end LSN", "base LSN", "last batch", "kind", "rows", "committed", "note"),
        [[(f"{t.name} (lake: {t.lake_name})" if t.lake_name else t.name, False), (t.applied_end_lsn, False),
          (t.base_lsn, False), (t.last_batch, False), (t.last_kind, False), (t.rows, True),
          (t.committed_at, False), (t.note or "", False)]
         for t in report.tables],
        f"{key}-tables",
    ))  # fmt: skip
    parts.append("</section>")
    return "\n".join(parts)


def render_html(reports: Sequence[PipelineReport], title: str = "Postgres CDC pipelines",
                messages: Sequence[str] = ()) -> str:  # fmt: skip
    """The page for ``reports`` (one section each), with ``messages`` shown above them."""
    generated = max((r.generated_at for r in reports), default=None)
    body = [f"<h1>{escape(title)}</h1>"]
    body.append(f'<p class="muted">generated {escape(_text(generated))}; read-only</p>')
    body += [f'<div class="problem">{escape(message)}</div>' for message in messages]
    body += [_pipeline(i, report) for i, report in enumerate(reports)]
    return (
        "<!DOCTYPE html><html lang=en><head><meta charset=utf-8>"
        f"<title>{escape(title)}</title>"
        f"<style>{_asset('uPlot.min.css')}{_STYLE}</style>"
        f"</head><body>{''.join(body)}"
        f"<script>{_asset('uPlot.iife.min.js')}</script><script>{_SCRIPT}</script>"
        "</body></html>"
    )
