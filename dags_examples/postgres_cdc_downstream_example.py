"""A downstream consumer: revenue per customer, computed at each consistent cut the CDC pipeline lands.

Scheduled on the pipeline's cut Asset (``postgres-cdc://<catalog>/<slot>``), which the CDC DAG's ack
updates once every table of a batch is in the lake. Each run reads the tables exactly at the
event's cut (every table at the same source LSN, by the Iceberg snapshot ids the event carries)
with pyiceberg, no Spark, so what it computes is what the source held at that LSN, however much
the source and the lake moved on meanwhile.

It reads the demo shop schema (``airflow_provider_postgres_cdc/demo/shop.py``): ``orders`` and their
``order_items``. An Asset is fixed when the DAG is parsed, so the pipeline comes from the
environment of the DAG processor and the workers (defaults in brackets):

* ``POSTGRES_CDC_DOWNSTREAM_CATALOG`` [``lake``]: the lake connection's catalog name;
* ``POSTGRES_CDC_DOWNSTREAM_SLOT`` [``postgres_cdc_slot``]: the pipeline's slot;
* ``POSTGRES_CDC_DOWNSTREAM_LAKE_CONN_ID`` [``postgres_cdc_lake_default``]: the lake connection.
"""

from __future__ import annotations

import os
from datetime import datetime
from typing import Any

from airflow.sdk import DAG, task

from airflow_provider_postgres_cdc.assets import cut_asset

CATALOG = os.environ.get("POSTGRES_CDC_DOWNSTREAM_CATALOG", "lake")
SLOT = os.environ.get("POSTGRES_CDC_DOWNSTREAM_SLOT", "postgres_cdc_slot")
LAKE_CONN_ID = os.environ.get("POSTGRES_CDC_DOWNSTREAM_LAKE_CONN_ID", "postgres_cdc_lake_default")
CUT = cut_asset(CATALOG, SLOT)

with DAG(
    dag_id="postgres_cdc_downstream_example",
    schedule=[CUT],
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    tags=["postgres-cdc", "downstream"],
    doc_md=__doc__,
) as dag:

    @task
    def revenue_per_customer(*, triggering_asset_events: Any = None) -> dict[str, Any]:
        """Order count, order totals and line revenue per customer, all at the newest triggering cut."""
        import pyarrow as pa
        import pyarrow.compute as pc

        from airflow_provider_postgres_cdc.engine.lake_catalog import read_table
        from airflow_provider_postgres_cdc.engine.lake_events import cut_from_event
        from airflow_provider_postgres_cdc.formats.lsn import Lsn
        from airflow_provider_postgres_cdc.hooks.lake import PostgresCdcLakeHook

        events = [event for batch in (triggering_asset_events or {}).values() for event in batch]
        if not events:
            raise ValueError(f"run without a cut event: trigger it through {CUT.uri}, not by hand")
        extra = max((event.extra for event in events), key=lambda e: Lsn.parse(str(e["lsn"])))
        cut = cut_from_event(extra)
        lake = PostgresCdcLakeHook(LAKE_CONN_ID).get_conn()
        orders = read_table(lake, "public", "orders", cut=cut, columns=["id", "customer_id", "total"])
        items = read_table(lake, "public", "order_items", cut=cut, columns=["order_id", "qty", "unit_price"])
        qty = pc.cast(items["qty"], pa.decimal128(10, 0))
        lines = pa.table({"order_id": items["order_id"], "amount": pc.multiply(qty, items["unit_price"])})
        lines = lines.join(orders.select(["id", "customer_id"]), keys="order_id", right_keys="id")
        per_order = orders.group_by("customer_id").aggregate([("id", "count"), ("total", "sum")])
        per_line = lines.group_by("customer_id").aggregate([("amount", "sum")])
        revenue = {row["customer_id"]: row["amount_sum"] for row in per_line.to_pylist()}
        customers = {
            str(row["customer_id"]): {
                "orders": row["id_count"],
                "total": str(row["total_sum"]),
                "line_revenue": str(revenue.get(row["customer_id"], 0)),
            }
            for row in per_order.to_pylist()
        }
        print(f"cut {cut.tag} at {cut.lsn}: {orders.num_rows} orders of {len(customers)} customers")
        return {
            "tag": cut.tag,
            "lsn": str(cut.lsn),
            "orders": orders.num_rows,
            "newest_order_id": pc.max(orders["id"]).as_py(),
            "customers": customers,
        }

    revenue_per_customer()
