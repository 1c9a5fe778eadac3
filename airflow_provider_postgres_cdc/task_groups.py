"""``cdc_microbatch_task_group``: the micro-batch pipeline of one slot as one call in a DAG.

    [wait_for_lag] -> drain -> apply -> ack -> [catch_up]

* ``wait_for_lag`` (optional) is a :class:`PostgresCdcSlotLagSensor`, which also fails loudly when
  the slot's WAL is at risk or lost;
* ``drain`` stages one bounded batch and never moves the slot;
* ``apply`` submits the Spark apply job for that batch (idempotent, skipped when the batch is empty);
* ``ack`` advances the slot only once every lake table of the batch has committed it;
* ``catch_up`` (optional) starts the next run of the DAG at once while the slot holds more than
  a batch (:class:`PostgresCdcCatchUpOperator`), so a backlog does not wait for the schedule.

``snapshot_task_group`` copies tables at one consistent point and loads them, for an initial
snapshot (``slot_mode="create"``), a reload of tables of a running pipeline from a temporary slot
(``"temporary"``: backfills, added tables) or the recovery of a lost slot (``"recover"``):

    [publish] -> snapshot -> load

A lake table has two writers then: the CDC ``apply`` and the re-snapshot ``load``. Both commit
through Iceberg's optimistic concurrency, and the loser of a race redoes the table from the
winner's commit (docs/LAKE.md), so neither can undo the other. To keep them from even computing
at once, give both groups the same one-slot Airflow ``pool`` (``airflow pools set postgres_cdc_lake
1 "..."``); a pool that does not exist keeps its tasks from ever being scheduled, so create it
first.

Run the DAG with ``max_active_runs=1``: a slot has one consumer at a time (a second drain on an
active slot is refused), and each run must start where the previous ack left the slot. A run
that failed after its drain is simply run again (or the next run does it): the slot has not
moved, so the drain finds its own staged batch, the apply skips the tables that already hold the batch,
and the ack completes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from airflow.sdk import Param, TaskGroup

from airflow_provider_postgres_cdc.engine.choices import CopyEngine, SlotMode, Transport
from airflow_provider_postgres_cdc.hooks.lake import PostgresCdcLakeHook
from airflow_provider_postgres_cdc.hooks.postgres import PostgresCdcHook
from airflow_provider_postgres_cdc.operators.ack import PostgresCdcAckOperator
from airflow_provider_postgres_cdc.operators.drain import PostgresCdcDrainOperator
from airflow_provider_postgres_cdc.operators.publication import PostgresCdcPublishTablesOperator
from airflow_provider_postgres_cdc.operators.snapshot import PostgresCdcSnapshotOperator
from airflow_provider_postgres_cdc.spark import TABLE_PARALLELISM

# Names a pipeline gets when its DAGs are not told others.
DEFAULT_SLOT_NAME = "postgres_cdc_slot"
DEFAULT_PUBLICATIONS = "postgres_cdc_pub"
DEFAULT_SPARK_CONN_ID = "spark_default"

# The params every pipeline DAG shares: name -> (default, description). Staging has no default: it
# is where every worker meets (a path one machine sees is no default for a cluster).
_SHARED: dict[str, tuple[str | None, str]] = {
    "postgres_conn_id": (PostgresCdcHook.default_conn_name, "Airflow connection of the source database"),
    "publications": (DEFAULT_PUBLICATIONS, "publication the slot is read with"),
    "slot_name": (DEFAULT_SLOT_NAME, "the pipeline's logical replication slot"),
    "staging": (None, "staging root every worker reaches: a path or a file://, s3://, gs://, hdfs:// URI"),
    "staging_conn_id": ("", "aws connection of an s3:// staging store; empty: the workers' own credentials"),
    "lake_conn_id": (PostgresCdcLakeHook.default_conn_name, "the lake's postgres_cdc_lake connection"),
    "spark_conn_id": (DEFAULT_SPARK_CONN_ID, "Spark connection of the apply and load jobs"),
}


def pipeline_params(**params: str | Param | None) -> dict[str, Param]:
    """The DAG params every Postgres CDC pipeline DAG takes, so one ``--conf`` drives them all.

    A shared param (``slot_name``, ``publications``, ``staging``, ``staging_conn_id``,
    ``postgres_conn_id``, ``lake_conn_id``, ``spark_conn_id``) takes its default from a plain value
    (``staging="s3://bucket/staging"``) or is replaced by a :class:`Param`; other keywords are the
    DAG's own Params. ``staging`` has no default unless given, so a run must name it (Airflow
    refuses a run without it, and a scheduled DAG without one).
    """
    shared = {name: _param(params.pop(name, default), about) for name, (default, about) in _SHARED.items()}
    for name, value in params.items():
        if not isinstance(value, Param):
            raise TypeError(f"pipeline_params: {name!r} is not a shared param, so pass it as a Param")
    return {**shared, **params}  # type: ignore[dict-item]


def from_params() -> dict[str, Any]:
    """The task group arguments that read the shared params (``{"staging": "{{ params.staging }}", ...}``)."""
    return {name: f"{{{{ params.{name} }}}}" for name in _SHARED}


def _param(value: str | Param | None, description: str) -> Param:
    if isinstance(value, Param):
        return value
    if value is None:
        return Param(type="string", description=f"{description} (required)")
    return Param(value, type="string", description=description)


def cdc_microbatch_task_group(
    *,
    slot_name: str,
    publications: str | Sequence[str],
    staging: str,
    lake_conn_id: str = PostgresCdcLakeHook.default_conn_name,
    group_id: str = "postgres_cdc",
    postgres_conn_id: str = PostgresCdcHook.default_conn_name,
    spark_conn_id: str = DEFAULT_SPARK_CONN_ID,
    transport: Transport = "peek",
    max_messages: int | str | None = 1_000_000,
    lag_sensor: Mapping[str, Any] | None = None,
    spark_conf: Mapping[str, Any] | None = None,
    spark_env_vars: Mapping[str, Any] | None = None,
    spark_binary: str | None = None,
    connect_python: str | None = None,
    pool: str | None = None,
    staging_conn_id: str | None = None,
    table_parallelism: int | str = TABLE_PARALLELISM,
    catch_up_seconds: int | str | None = None,
    partition_by: Mapping[str, Sequence[str]] | str | None = None,
    deletes: Mapping[str, str] | str | None = None,
    history: Mapping[str, str] | str | None = None,
    column_transforms: Mapping[str, Mapping[str, str]] | str | None = None,
    hash_key_conn_id: str | None = None,
) -> TaskGroup:
    """Build the group inside the current DAG context; every string argument may be a template.

    :param lag_sensor: keyword arguments of :class:`PostgresCdcSlotLagSensor` (for example
        ``{"min_lag_bytes": 16 << 20, "mode": "reschedule"}``); ``None`` leaves the sensor out.
        Its ``min_lag_bytes`` is also the lag under which catch-up stops.
    :param connect_python: with a ``spark_connect`` Spark connection, the Spark Connect client's
        Python of the apply, and of the check the drain runs of the server first (docs/LAKE.md,
        "Spark Connect"); default ``POSTGRES_CDC_CONNECT_PYTHON``, else the worker's Python.
    :param pool: Airflow pool of the ``apply`` task; share it with the lake's re-snapshot loads.
    :param staging_conn_id: the ``aws`` connection of an ``s3://`` staging store (endpoint and keys),
        for the drain, the apply's manifest read and the ack; ``None``: pyarrow's environment chain.
    :param table_parallelism: tables the apply job applies at once (a positive number).
    :param partition_by: lake tables' Iceberg partition specs by source table, as
        :class:`PostgresCdcSparkApplyOperator` takes them (``{"public.orders": ["days(placed_at)"]}``).
    :param deletes: ``"soft"``, ``"hard"`` or ``{"public.orders": "soft"}``: whether lake tables keep
        deleted rows, marked, as :class:`PostgresCdcSparkApplyOperator` takes it.
    :param history: ``"scd2"``, ``"none"`` or ``{"public.orders": "scd2"}``: whether lake tables keep
        every version of their rows in a history table, as :class:`PostgresCdcSparkApplyOperator`
        takes it.
    :param column_transforms: ``{"public.customers": {"email": "hash", "ssn": "drop"}}``: columns the
        drain hashes or drops before staging, as :class:`PostgresCdcDrainOperator` takes them.
    :param hash_key_conn_id: the connection whose password is the hash key (default
        ``postgres_cdc_hash_key``).
    :param catch_up_seconds: how long a chain of runs started by ``catch_up`` may go on (a
        positive number of seconds); ``None`` leaves the task out. The DAG's runs must carry
        their settings in params (as the factories' DAGs do): the next run gets this run's conf.
    """
    from airflow_provider_postgres_cdc.operators.spark_apply import PostgresCdcSparkApplyOperator

    with TaskGroup(group_id=group_id) as group:
        drain = PostgresCdcDrainOperator(
            task_id="drain",
            slot_name=slot_name,
            publications=publications,
            staging=staging,
            postgres_conn_id=postgres_conn_id,
            transport=transport,
            max_messages=max_messages,  # type: ignore[arg-type]
            staging_conn_id=staging_conn_id,
            lake_conn_id=lake_conn_id,
            column_transforms=column_transforms,
            hash_key_conn_id=hash_key_conn_id,
            # A spark_connect server is checked before anything is drained (docs/LAKE.md, "Spark Connect").
            spark_conn_id=spark_conn_id,
            connect_python=connect_python,
        )
        manifest = f"{{{{ ti.xcom_pull(task_ids='{drain.task_id}')['manifest'] }}}}"
        apply = PostgresCdcSparkApplyOperator(
            task_id="apply",
            manifest=manifest,
            lake_conn_id=lake_conn_id,
            spark_conn_id=spark_conn_id,
            conf=dict(spark_conf or {}),
            env_vars=dict(spark_env_vars or {}),
            spark_binary=spark_binary,
            connect_python=connect_python,
            staging_conn_id=staging_conn_id,
            table_parallelism=table_parallelism,
            partition_by=partition_by,
            deletes=deletes,
            history=history,
            **pool_argument(pool),
        )
        ack = PostgresCdcAckOperator(
            task_id="ack",
            slot_name=slot_name,
            manifest=manifest,
            lake_conn_id=lake_conn_id,
            postgres_conn_id=postgres_conn_id,
            staging_conn_id=staging_conn_id,
        )
        drain >> apply >> ack
        if catch_up_seconds is not None:
            from airflow_provider_postgres_cdc.operators.catch_up import PostgresCdcCatchUpOperator

            ack >> PostgresCdcCatchUpOperator(
                task_id="catch_up",
                drain_task_id=drain.task_id,
                ack_task_id=ack.task_id,
                catch_up_seconds=catch_up_seconds,
                min_lag_bytes=(lag_sensor or {}).get("min_lag_bytes", 0),
            )
        if lag_sensor is not None:
            from airflow_provider_postgres_cdc.sensors.slot_lag import PostgresCdcSlotLagSensor

            wait = PostgresCdcSlotLagSensor(
                task_id="wait_for_lag", slot_name=slot_name, postgres_conn_id=postgres_conn_id, **lag_sensor
            )
            wait >> drain
    return group


def snapshot_task_group(
    *,
    slot_mode: SlotMode,
    slot_name: str,
    publications: str | Sequence[str],
    staging: str,
    lake_conn_id: str = PostgresCdcLakeHook.default_conn_name,
    tables: str | Sequence[str] = (),
    publish: str | Sequence[str | Mapping[str, Any]] | None = None,
    group_id: str = "postgres_cdc_snapshot",
    postgres_conn_id: str = PostgresCdcHook.default_conn_name,
    spark_conn_id: str = DEFAULT_SPARK_CONN_ID,
    spark_conf: Mapping[str, Any] | None = None,
    spark_env_vars: Mapping[str, Any] | None = None,
    spark_binary: str | None = None,
    connect_python: str | None = None,
    pool: str | None = None,
    staging_conn_id: str | None = None,
    copy_engine: CopyEngine = "local",
    table_parallelism: int | str = TABLE_PARALLELISM,
    partition_by: Mapping[str, Sequence[str]] | str | None = None,
    deletes: Mapping[str, str] | str | None = None,
    history: Mapping[str, str] | str | None = None,
    column_transforms: Mapping[str, Mapping[str, str]] | str | None = None,
    hash_key_conn_id: str | None = None,
) -> TaskGroup:
    """Snapshot tables and load them; ``slot_mode`` as :class:`PostgresCdcSnapshotOperator` takes it.

    With ``"temporary"`` the pipeline's slot is untouched: each loaded table's base LSN becomes the
    new consistent point, later batches skip its changes below it, and batches the CDC applied
    past it meanwhile are replayed from the changelog.

    :param tables: ``schema.table`` names to re-snapshot (a template rendering to a list, with
        the DAG's ``render_template_as_native_obj=True``); empty: every published table.
        Entries may also be ``publish`` objects (their ``table`` is used).
    :param publish: tables to add to the first of ``publications`` first (``"schema.table"`` or
        ``{"table", "columns", "row_filter"}``); ``None`` leaves the task out. Include them in
        ``tables`` too, or leave ``tables`` empty.
    :param connect_python: with a ``spark_connect`` Spark connection, the Spark Connect client's
        Python of the load, as the CDC group takes it.
    :param pool: Airflow pool of the ``load`` task; share it with the pipeline's CDC apply.
    :param staging_conn_id: the ``aws`` connection of an ``s3://`` staging store.
    :param copy_engine: ``"local"`` (in the worker) or ``"spark"`` (:class:`PostgresCdcSnapshotOperator`).
    :param table_parallelism: tables the load job loads at once (a positive number).
    :param partition_by: lake tables' Iceberg partition specs, as the CDC group takes them; give
        both groups the same, or a load creates a table with another spec than the CDC's.
    :param deletes: the delete mode of lake tables, as the CDC group takes it; a load may switch a
        table's mode, a batch may not.
    :param history: the history mode of lake tables, as the CDC group takes it; a load may switch
        it on (the history then starts at the load) or off, a batch may not.
    :param column_transforms: columns hashed or dropped before staging, and ``hash_key_conn_id`` the
        connection of their key, as the CDC group takes them; give both groups the same (a batch
        staged under others than its table's rows is refused; a load may change them).
    """
    from airflow_provider_postgres_cdc.operators.spark_apply import PostgresCdcSparkApplyOperator

    with TaskGroup(group_id=group_id) as group:
        snapshot = PostgresCdcSnapshotOperator(
            task_id="snapshot",
            slot_name=slot_name,
            publications=publications,
            staging=staging,
            tables=tables,  # type: ignore[arg-type]
            slot_mode=slot_mode,
            copy_engine=copy_engine,
            postgres_conn_id=postgres_conn_id,
            staging_conn_id=staging_conn_id,
            lake_conn_id=lake_conn_id,
            column_transforms=column_transforms,
            hash_key_conn_id=hash_key_conn_id,
            # The Spark copy engine submits to the pipeline's Spark, as the load does.
            spark_conn_id=spark_conn_id,
            spark_binary=spark_binary,
            spark_conf=dict(spark_conf or {}),
        )
        load = PostgresCdcSparkApplyOperator(
            task_id="load",
            manifest=f"{{{{ ti.xcom_pull(task_ids='{snapshot.task_id}')['manifest'] }}}}",
            lake_conn_id=lake_conn_id,
            spark_conn_id=spark_conn_id,
            conf=dict(spark_conf or {}),
            env_vars=dict(spark_env_vars or {}),
            spark_binary=spark_binary,
            connect_python=connect_python,
            staging_conn_id=staging_conn_id,
            table_parallelism=table_parallelism,
            partition_by=partition_by,
            deletes=deletes,
            history=history,
            **pool_argument(pool),
        )
        snapshot >> load
        if publish is not None:
            add = PostgresCdcPublishTablesOperator(
                task_id="publish",
                publications=publications,
                tables=publish,  # type: ignore[arg-type]
                postgres_conn_id=postgres_conn_id,
            )
            add >> snapshot
    return group


def pool_argument(pool: str | None) -> dict[str, Any]:
    """``pool=`` only when one is named, so Airflow's default pool applies otherwise."""
    return {"pool": pool} if pool else {}
