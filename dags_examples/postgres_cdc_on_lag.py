"""Event-driven micro-batch CDC: a run starts when the slot has enough lag, not on a clock.

The DAG is scheduled on an Asset whose ``AssetWatcher`` runs ``PostgresCdcSlotLagEventTrigger``
in the triggerer: it checks the slot every ``poke_interval`` seconds and fires when the lag is at
least ``min_lag_bytes`` OR the oldest pending change is at least ``min_lag_age`` seconds old (the
same thresholds, with the same meaning, as ``PostgresCdcSlotLagSensor``'s). Each event
queues one run of the same drain -> apply -> ack group as ``postgres_cdc_microbatch`` (without
its lag sensor: the watcher has decided already).

An Asset and its watcher are fixed when the DAG is parsed, so the slot and the thresholds cannot
be DAG params: they are read from these environment variables of the DAG processor (and of the
workers, which parse the DAG too), with these defaults:

========================================  =============================  ====================================
variable                                  default                        meaning
========================================  =============================  ====================================
``POSTGRES_CDC_ON_LAG_SLOT_NAME``         ``postgres_cdc_slot``          the slot watched and drained
``POSTGRES_CDC_ON_LAG_PUBLICATIONS``      ``postgres_cdc_pub``           the publication it is drained with
``POSTGRES_CDC_ON_LAG_POSTGRES_CONN_ID``  ``postgres_default``           its database's postgres connection
``POSTGRES_CDC_ON_LAG_MIN_LAG_BYTES``     ``64MB``                       run once this much WAL is pending
``POSTGRES_CDC_ON_LAG_MIN_LAG_AGE``       ``900``                        ...or a change this old (seconds)
``POSTGRES_CDC_ON_LAG_POKE_INTERVAL``     ``60``                         seconds between the watcher's checks
``POSTGRES_CDC_ON_LAG_STAGING``           ``s3://postgres-cdc/staging``  the batches' staging root: set yours
``POSTGRES_CDC_ON_LAG_STAGING_CONN_ID``   (none)                         aws connection of an s3:// staging
``POSTGRES_CDC_ON_LAG_LAKE_CONN_ID``      ``postgres_cdc_lake_default``  lake connection
``POSTGRES_CDC_ON_LAG_SPARK_CONN_ID``     ``spark_default``              Spark connection
========================================  =============================  ====================================

The lake tables' options (``partition_by``, ``deletes``, ``history``, ``column_transforms``) are DAG params
too, empty here: set their defaults in this file to the values the other DAGs of the pipeline
run with (a batch staged or applied under other options than its tables' is refused).

Set ``POSTGRES_CDC_ON_LAG_MIN_LAG_AGE`` to an empty string to fire on bytes only (or
``..._MIN_LAG_BYTES`` to fire on age only). The last three only set the defaults of the DAG's
params, which a manual run may override; a manual run must not name another slot.

What bounds the run rate: one check per ``poke_interval``; at most one event per acknowledged
slot position (while a run is queued or running, or after it failed, the slot has not moved and
the watcher stays quiet); ``max_active_runs=1``, so events that arrive during a run wait as
one queued run. A failed run is not retried by the watcher: its retries, or clearing it, are.

Run the initial snapshot DAG (``postgres_cdc_initial_snapshot``) once first: it creates the slot.
Until then the watcher fails with the missing slot's message, in the triggerer's log.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.sdk import DAG, Asset, AssetWatcher, Param

from airflow_provider_postgres_cdc.dag_factories import TABLE_OPTIONS, table_params
from airflow_provider_postgres_cdc.task_groups import cdc_microbatch_task_group, pipeline_params
from airflow_provider_postgres_cdc.triggers.slot_lag_event import PostgresCdcSlotLagEventTrigger


def _setting(name: str, default: str) -> str | None:
    """``POSTGRES_CDC_ON_LAG_<name>``, or ``default`` when unset; an empty value means "none"."""
    value = os.environ.get(f"POSTGRES_CDC_ON_LAG_{name}", default).strip()
    return value or None


SLOT_NAME = _setting("SLOT_NAME", "postgres_cdc_slot") or "postgres_cdc_slot"
PUBLICATIONS = _setting("PUBLICATIONS", "postgres_cdc_pub") or "postgres_cdc_pub"
POSTGRES_CONN_ID = _setting("POSTGRES_CONN_ID", "postgres_default") or "postgres_default"

slot_lag = Asset(
    name=f"postgres_cdc_slot_lag_{SLOT_NAME}",
    watchers=[
        AssetWatcher(
            name=f"postgres_cdc_slot_lag_{SLOT_NAME}",
            trigger=PostgresCdcSlotLagEventTrigger(
                slot_name=SLOT_NAME,
                postgres_conn_id=POSTGRES_CONN_ID,
                publications=[PUBLICATIONS],
                min_lag_bytes=_setting("MIN_LAG_BYTES", "64MB"),
                min_lag_age=_setting("MIN_LAG_AGE", "900"),
                stale_after=86400.0,
                poke_interval=float(_setting("POKE_INTERVAL", "60") or 60),
            ),
        )
    ],
)

with DAG(
    dag_id="postgres_cdc_on_lag",
    schedule=[slot_lag],
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 2, "retry_delay": timedelta(minutes=1)},
    params=pipeline_params(
        postgres_conn_id=Param(POSTGRES_CONN_ID, type="string"),
        publications=Param(PUBLICATIONS, type="string"),
        slot_name=Param(SLOT_NAME, type="string"),
        staging=Param(_setting("STAGING", "s3://postgres-cdc/staging"), type="string"),
        staging_conn_id=Param(_setting("STAGING_CONN_ID", "") or "", type="string"),
        lake_conn_id=Param(_setting("LAKE_CONN_ID", "postgres_cdc_lake_default"), type="string"),
        spark_conn_id=Param(_setting("SPARK_CONN_ID", "spark_default"), type="string"),
        max_messages=Param(1_000_000, type="integer", minimum=1),
        # The lake tables' options (docs/LAKE.md): give them the CDC and snapshot DAGs' values.
        **table_params(partition_by={}, deletes={}, column_transforms={}, history={}),
    ),
    tags=["postgres-cdc", "cdc"],
    doc_md=__doc__,
) as dag:
    cdc_microbatch_task_group(
        slot_name="{{ params.slot_name }}",
        publications="{{ params.publications }}",
        staging="{{ params.staging }}",
        staging_conn_id="{{ params.staging_conn_id }}",
        lake_conn_id="{{ params.lake_conn_id }}",
        postgres_conn_id="{{ params.postgres_conn_id }}",
        spark_conn_id="{{ params.spark_conn_id }}",
        max_messages="{{ params.max_messages }}",
        **TABLE_OPTIONS,
    )
