"""The procedures of a Postgres CDC pipeline as ready-made DAGs: call one factory per DAG in a DAG file.

::

    from airflow_provider_postgres_cdc.dag_factories import cdc_microbatch_dag, initial_snapshot_dag

    pipeline = {"slot_name": "shop_cdc", "publications": "shop", "staging": "s3://lake/staging",
                "postgres_conn_id": "shop_db", "lake_conn_id": "shop_lake"}
    initial = initial_snapshot_dag(**pipeline)
    cdc = cdc_microbatch_dag(**pipeline, pool="shop_lake")

Each factory returns an Airflow ``DAG`` whose tasks read the shared params of
:func:`~airflow_provider_postgres_cdc.task_groups.pipeline_params`: the keyword arguments
(``slot_name``, ``publications``, ``staging``, ``staging_conn_id`` (the ``aws`` connection of an
``s3://`` staging store), ``postgres_conn_id``, ``lake_conn_id``, ``spark_conn_id``) set their
defaults and a run's ``--conf`` may override each, so one conf drives every DAG of a pipeline.
``staging`` has no default: a scheduled DAG needs it here, a triggered one takes it from here or
from each run's conf. The other keyword arguments are fixed when the DAG is parsed: ``pool`` (one
Airflow pool shared by every task writing the lake: apply, load, maintenance), ``spark_conf``, and
any further keyword, passed to ``DAG`` as is (``tags``, ``default_args``, ``start_date``...).
``partition_by`` (``{"public.orders": ["days(placed_at)"]}``: the Iceberg partition spec of lake
tables), ``deletes`` (``"soft"``, or ``{"public.orders": "soft"}``: deleted rows kept, marked),
``history`` (``"scd2"``, or ``{"public.orders": "scd2"}``: every version of rows kept) and
``column_transforms`` (``{"public.customers": {"email": "hash"}}``: columns hashed or dropped
before staging, under the key in connection ``hash_key_conn_id``) are the defaults of params of
every DAG that writes lake tables (docs/LAKE.md); give the DAGs of one pipeline the same. Give the
DAGs of a second pipeline their own ``dag_id`` s.

Every DAG runs with ``max_active_runs=1``: a slot has one consumer at a time.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import DAG, Param

from airflow_provider_postgres_cdc.engine.choices import CopyEngine, SlotMode, Transport
from airflow_provider_postgres_cdc.errors import BACKFILL_DAG, INITIAL_SNAPSHOT_DAG, RECOVERY_DAG
from airflow_provider_postgres_cdc.formats.column_transforms import parse_column_transforms
from airflow_provider_postgres_cdc.formats.deletes import parse_deletes
from airflow_provider_postgres_cdc.formats.history import HISTORY
from airflow_provider_postgres_cdc.formats.partitioning import parse_partition_by
from airflow_provider_postgres_cdc.hooks.hash_key import PostgresCdcHashKeyHook
from airflow_provider_postgres_cdc.hooks.lake import PostgresCdcLakeHook
from airflow_provider_postgres_cdc.hooks.postgres import PostgresCdcHook
from airflow_provider_postgres_cdc.operators.arguments import check_positive
from airflow_provider_postgres_cdc.task_groups import (
    DEFAULT_PUBLICATIONS,
    DEFAULT_SLOT_NAME,
    DEFAULT_SPARK_CONN_ID,
    cdc_microbatch_task_group,
    from_params,
    pipeline_params,
    pool_argument,
    snapshot_task_group,
)

MICROBATCH_DAG = "postgres_cdc_microbatch"
_CATCH_UP = "how long runs may chain on a backlog, in seconds"
_DELETES = '"soft" keeps deleted rows in lake tables, marked; "hard" or {"public.orders": "soft"}'
_HISTORY = '"scd2" keeps every version of rows in <table>__pgl_history; "none" or {"public.orders": "scd2"}'
_TRANSFORMS = 'columns hashed or dropped before staging: {"public.customers": {"email": "hash"}}'
_PARTITION_BY = 'Iceberg partition specs of lake tables: {"public.orders": ["days(placed_at)"]}'
LAKE_MAINTENANCE_DAG = "postgres_cdc_lake_maintenance"
_START = datetime(2026, 1, 1)
_TAGS = ["postgres-cdc"]


def initial_snapshot_dag(
    *,
    dag_id: str = INITIAL_SNAPSHOT_DAG,
    slot_name: str = DEFAULT_SLOT_NAME,
    publications: str = DEFAULT_PUBLICATIONS,
    staging: str | None = None,
    postgres_conn_id: str = PostgresCdcHook.default_conn_name,
    lake_conn_id: str = PostgresCdcLakeHook.default_conn_name,
    spark_conn_id: str = DEFAULT_SPARK_CONN_ID,
    staging_conn_id: str | None = None,
    copy_engine: CopyEngine = "local",
    pool: str | None = None,
    spark_conf: Mapping[str, Any] | None = None,
    partition_by: Mapping[str, Sequence[str]] | None = None,
    deletes: Mapping[str, str] | str | None = None,
    history: Mapping[str, str] | str | None = None,
    column_transforms: Mapping[str, Mapping[str, str]] | None = None,
    hash_key_conn_id: str = PostgresCdcHashKeyHook.default_conn_name,
    **dag_kwargs: Any,
) -> DAG:
    """Initial load: create the slot with an exported snapshot, copy the published tables, load them.

    Run once per pipeline (the CDC DAG continues exactly where it ends). The ``tables`` param
    (``schema.table`` names) limits the copy; empty: every published table. A re-run converges
    wherever the last run died, with no manual step: while the slot has not moved past the snapshot
    it exported, that staged snapshot goes to the load again (tables already loaded are skipped);
    a slot left by a copy that died is dropped and the snapshot taken again; once the CDC has moved
    on, the run is skipped. Reloading tables of a running pipeline is the backfill DAG; a lost slot
    is the recovery DAG.
    """
    return _snapshot_dag(
        initial_snapshot_dag,
        dag_id,
        "create",
        locals(),
        {"tables": Param([], type="array", description="schema.table names; empty: every published table")},
        tables="{{ params.tables }}",
    )


def backfill_tables_dag(
    *,
    dag_id: str = BACKFILL_DAG,
    slot_name: str = DEFAULT_SLOT_NAME,
    publications: str = DEFAULT_PUBLICATIONS,
    staging: str | None = None,
    postgres_conn_id: str = PostgresCdcHook.default_conn_name,
    lake_conn_id: str = PostgresCdcLakeHook.default_conn_name,
    spark_conn_id: str = DEFAULT_SPARK_CONN_ID,
    staging_conn_id: str | None = None,
    copy_engine: CopyEngine = "local",
    pool: str | None = None,
    spark_conf: Mapping[str, Any] | None = None,
    partition_by: Mapping[str, Sequence[str]] | None = None,
    deletes: Mapping[str, str] | str | None = None,
    history: Mapping[str, str] | str | None = None,
    column_transforms: Mapping[str, Mapping[str, str]] | None = None,
    hash_key_conn_id: str = PostgresCdcHashKeyHook.default_conn_name,
    **dag_kwargs: Any,
) -> DAG:
    """Re-snapshot tables of a running pipeline, optionally adding them to its publication first.

    The CDC DAG keeps running: the snapshot comes from a temporary slot, the pipeline's slot is
    untouched, and the apply job makes each reloaded table skip the changes its snapshot holds
    (docs/FORMATS.md). Use it to repair or reload tables, to pick up a changed row filter or
    column list, or to add a table to the pipeline.

    The ``tables`` param names tables to reload; every ``add_tables`` entry (``"schema.table"``
    or an object with ``table`` and optional ``columns`` and ``row_filter``) is first put in the
    first of the ``publications`` with exactly that column list and filter, then reloaded too.
    Both empty: every published table is reloaded. Re-running a run is safe: the publication
    change is idempotent, and a snapshot is never loaded over a newer one.
    """
    add = 'tables to add to the publication first: "schema.table" or {"table", "columns", "row_filter"}'
    return _snapshot_dag(
        backfill_tables_dag,
        dag_id,
        "temporary",
        locals(),
        {
            "tables": Param([], type="array", description="schema.table names to reload"),
            "add_tables": Param([], type="array", description=add),
        },
        group_id="postgres_cdc_resnapshot",
        tables="{{ params.tables + params.add_tables }}",
        publish="{{ params.add_tables }}",
    )


def recover_slot_dag(
    *,
    dag_id: str = RECOVERY_DAG,
    slot_name: str = DEFAULT_SLOT_NAME,
    publications: str = DEFAULT_PUBLICATIONS,
    staging: str | None = None,
    postgres_conn_id: str = PostgresCdcHook.default_conn_name,
    lake_conn_id: str = PostgresCdcLakeHook.default_conn_name,
    spark_conn_id: str = DEFAULT_SPARK_CONN_ID,
    staging_conn_id: str | None = None,
    copy_engine: CopyEngine = "local",
    pool: str | None = None,
    spark_conf: Mapping[str, Any] | None = None,
    partition_by: Mapping[str, Sequence[str]] | None = None,
    deletes: Mapping[str, str] | str | None = None,
    history: Mapping[str, str] | str | None = None,
    column_transforms: Mapping[str, Mapping[str, str]] | None = None,
    hash_key_conn_id: str = PostgresCdcHashKeyHook.default_conn_name,
    **dag_kwargs: Any,
) -> DAG:
    """Recover a pipeline whose slot is lost (``wal_status = lost``) or was dropped.

    The lag sensor and the drain fail on such a slot and point here. The DAG recreates the slot
    with an exported snapshot and reloads every published table at its new consistent point, so
    the lake equals the source again and the CDC DAG continues from the new slot without manual
    steps. A healthy slot is refused (reload tables of a running pipeline with the backfill DAG).
    Pause the CDC DAG while this runs: its runs fail on the lost slot anyway. A re-run converges
    as the initial snapshot's does: a finished recovery's snapshot is handed to the load again
    only while the new slot has not moved past it (a table already loaded is skipped), and a new
    slot left by a copy that died is dropped and recreated.
    """
    return _snapshot_dag(recover_slot_dag, dag_id, "recover", locals(), {})


def cdc_microbatch_dag(
    *,
    dag_id: str = MICROBATCH_DAG,
    schedule: timedelta | str | None = timedelta(minutes=15),
    slot_name: str = DEFAULT_SLOT_NAME,
    publications: str = DEFAULT_PUBLICATIONS,
    staging: str | None = None,
    postgres_conn_id: str = PostgresCdcHook.default_conn_name,
    lake_conn_id: str = PostgresCdcLakeHook.default_conn_name,
    spark_conn_id: str = DEFAULT_SPARK_CONN_ID,
    staging_conn_id: str | None = None,
    transport: Transport = "peek",
    max_messages: int = 1_000_000,
    min_lag_bytes: int = 0,
    catch_up_seconds: int | None = 3600,
    pool: str | None = None,
    spark_conf: Mapping[str, Any] | None = None,
    partition_by: Mapping[str, Sequence[str]] | None = None,
    deletes: Mapping[str, str] | str | None = None,
    history: Mapping[str, str] | str | None = None,
    column_transforms: Mapping[str, Mapping[str, str]] | None = None,
    hash_key_conn_id: str = PostgresCdcHashKeyHook.default_conn_name,
    **dag_kwargs: Any,
) -> DAG:
    """Scheduled micro-batch CDC: wait for lag, drain a slot, apply the batch with Spark, advance the slot.

    Run the initial snapshot DAG once first: it creates the slot and loads the tables at the
    slot's consistent point. Each run starts where the previous run's ack left the slot; a run
    that failed after its drain is simply run again. The ``max_messages`` param bounds a batch,
    and ``min_lag_bytes`` is the lag the run's sensor waits for (0: any change).

    A backlog does not wait for the schedule: a run whose batch was full (the slot holds more)
    starts the next run as soon as its ack has moved the slot, with the same conf, until a batch
    takes all there is, the lag is under ``min_lag_bytes``, or the chain has run for the
    ``catch_up_seconds`` param (``catch_up_seconds=None`` leaves catch-up out). Each batch is
    acknowledged before the next is drained.
    """
    if catch_up_seconds is not None:
        check_positive("catch_up_seconds", catch_up_seconds)
    catch_up = (
        {}
        if catch_up_seconds is None
        else {"catch_up_seconds": Param(catch_up_seconds, type="integer", minimum=1, description=_CATCH_UP)}
    )
    dag = _dag(
        cdc_microbatch_dag,
        dag_id,
        schedule,
        locals(),
        {
            "max_messages": Param(max_messages, type="integer", minimum=1),
            "min_lag_bytes": Param(min_lag_bytes, type="integer", minimum=0),
            **catch_up,
            **table_params(partition_by, deletes, column_transforms, history),
        },
        {"default_args": {"retries": 2, "retry_delay": timedelta(minutes=1)}, "tags": [*_TAGS, "cdc"]},
    )
    with dag:
        cdc_microbatch_task_group(
            **from_params(),
            transport=transport,
            max_messages="{{ params.max_messages }}",
            lag_sensor={"min_lag_bytes": "{{ params.min_lag_bytes }}", "poke_interval": 10, "timeout": 3600},
            catch_up_seconds=None if catch_up_seconds is None else "{{ params.catch_up_seconds }}",
            spark_conf=spark_conf,
            pool=pool,
            hash_key_conn_id=hash_key_conn_id,
            **TABLE_OPTIONS,
        )
    return dag


def lake_maintenance_dag(
    *,
    dag_id: str = LAKE_MAINTENANCE_DAG,
    schedule: timedelta | str | None = timedelta(days=1),
    slot_name: str = DEFAULT_SLOT_NAME,
    staging: str | None = None,
    postgres_conn_id: str = PostgresCdcHook.default_conn_name,
    lake_conn_id: str = PostgresCdcLakeHook.default_conn_name,
    spark_conn_id: str = DEFAULT_SPARK_CONN_ID,
    staging_conn_id: str | None = None,
    keep_cuts: int = 48,
    older_than_hours: float = 24,
    staging_retention_hours: float = 72,
    pool: str | None = None,
    spark_conf: Mapping[str, Any] | None = None,
    **dag_kwargs: Any,
) -> DAG:
    """Daily upkeep of one pipeline: staging retention, then Iceberg maintenance of its lake tables.

    The only DAG that deletes data. ``staging_retention`` deletes staged batches the slot is
    acknowledged past and older than the ``staging_retention_hours`` param (and superseded
    snapshots); it never touches a batch the slot has not passed, nor a directory a drain may
    still be writing. ``lake_maintenance`` compacts the slot's tables and changelogs, keeps the
    newest ``keep_cuts`` consistent cuts (``pgl_<LSN>`` tags), expires snapshots and deletes
    orphan files older than ``older_than_hours``: keep that above the longest apply or load (a
    running job's files are not committed yet and would look orphaned). The tables' pipeline
    state is always kept. Give it the ``pool`` of the pipeline's apply and load tasks so a
    compaction and an apply do not race for the same commit.
    """
    from airflow_provider_postgres_cdc.operators.maintenance import (
        PostgresCdcLakeMaintenanceOperator,
        PostgresCdcStagingRetentionOperator,
    )

    hours = "snapshot and orphan file age; above the longest apply"
    dag = _dag(
        lake_maintenance_dag,
        dag_id,
        schedule,
        locals(),
        {
            "keep_cuts": Param(
                keep_cuts, type="integer", minimum=1, description="newest consistent cuts kept"
            ),
            "older_than_hours": Param(older_than_hours, type="number", minimum=1, description=hours),
            "staging_retention_hours": Param(
                staging_retention_hours, type="number", minimum=0, description="age of staged batches kept"
            ),
        },
        {
            "default_args": {"retries": 1, "retry_delay": timedelta(minutes=10)},
            "tags": [*_TAGS, "maintenance", "iceberg"],
        },
    )
    shared = from_params()
    with dag:
        retention = PostgresCdcStagingRetentionOperator(
            task_id="staging_retention",
            slot_name=shared["slot_name"],
            staging=shared["staging"],
            retention_hours="{{ params.staging_retention_hours }}",
            postgres_conn_id=shared["postgres_conn_id"],
            staging_conn_id=shared["staging_conn_id"],
        )
        maintenance = PostgresCdcLakeMaintenanceOperator(
            task_id="lake_maintenance",
            slot_name=shared["slot_name"],
            lake_conn_id=shared["lake_conn_id"],
            keep_cuts="{{ params.keep_cuts }}",
            older_than_hours="{{ params.older_than_hours }}",
            spark_conn_id=shared["spark_conn_id"],
            conf=dict(spark_conf or {}),
            **pool_argument(pool),
        )
        retention >> maintenance
    return dag


def _snapshot_dag(
    factory: Callable[..., DAG],
    dag_id: str,
    slot_mode: SlotMode,
    arguments: Mapping[str, Any],
    params: dict[str, Param],
    **group: Any,
) -> DAG:
    """A triggered snapshot DAG (initial, backfill, recovery): the snapshot task group in ``slot_mode``."""
    purpose = {"create": [], "temporary": ["backfill"], "recover": ["recovery"]}[slot_mode]
    dag = _dag(
        factory,
        dag_id,
        None,
        arguments,
        {
            **params,
            **table_params(
                arguments["partition_by"],
                arguments["deletes"],
                arguments["column_transforms"],
                arguments["history"],
            ),
        },
        {"render_template_as_native_obj": True, "tags": [*_TAGS, "cdc", "snapshot", *purpose]},
    )
    with dag:
        snapshot_task_group(
            slot_mode=slot_mode,
            **from_params(),
            copy_engine=arguments["copy_engine"],
            spark_conf=arguments["spark_conf"],
            pool=arguments["pool"],
            hash_key_conn_id=arguments["hash_key_conn_id"],
            **TABLE_OPTIONS,
            **group,
        )
    return dag


# The task groups' per-table options, from the params of the DAGs that write lake tables.
TABLE_OPTIONS: dict[str, Any] = {
    "partition_by": "{{ params.partition_by | tojson }}",
    "deletes": "{{ params.deletes | tojson }}",
    "history": "{{ params.history | tojson }}",
    "column_transforms": "{{ params.column_transforms | tojson }}",
}


def table_params(
    partition_by: Mapping[str, Sequence[str]] | None,
    deletes: Mapping[str, str] | str | None,
    column_transforms: Mapping[str, Mapping[str, str]] | None = None,
    history: Mapping[str, str] | str | None = None,
) -> dict[str, Param]:
    """The ``partition_by``, ``deletes``, ``column_transforms`` and ``history`` params of the DAGs
    that write lake tables, checked when the DAG is parsed."""
    parse_partition_by(dict(partition_by or {}))
    parse_deletes(deletes)
    HISTORY.parse(history)
    transforms = {table: dict(columns) for table, columns in (column_transforms or {}).items()}
    parse_column_transforms(transforms)
    return {
        "partition_by": Param(dict(partition_by or {}), type="object", description=_PARTITION_BY),
        "deletes": Param(deletes or {}, type=["object", "string"], description=_DELETES),
        "column_transforms": Param(transforms, type="object", description=_TRANSFORMS),
        "history": Param(history or {}, type=["object", "string"], description=_HISTORY),
    }


def _dag(
    factory: Callable[..., DAG],
    dag_id: str,
    schedule: Any,
    arguments: Mapping[str, Any],
    params: dict[str, Param],
    settings: dict[str, Any],
) -> DAG:
    """The DAG a factory describes: shared params from its arguments, then ``settings``, then the caller's
    ``dag_kwargs`` (which win); its documentation is the factory's docstring."""
    if schedule is not None and not arguments["staging"]:
        raise ValueError(
            f"{factory.__name__}(staging=...) is required for a scheduled DAG: its runs have no conf to "
            "name the staging root (a path or s3://, gs://, hdfs:// URI that every worker reaches)"
        )
    # An argument left None takes the param's own default (none for staging: each run names it).
    shared = {name: arguments[name] for name in from_params() if arguments.get(name) is not None}
    kwargs: dict[str, Any] = {
        "start_date": _START,
        "catchup": False,
        "max_active_runs": 1,
        "doc_md": inspect.getdoc(factory),
        **settings,
        **arguments["dag_kwargs"],
    }
    return DAG(dag_id=dag_id, schedule=schedule, params=pipeline_params(**shared, **params), **kwargs)
