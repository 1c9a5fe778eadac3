"""The merge algebra of the apply job: staged changes of one table to their net effect per key.

Pure functions over DataFrames, no I/O and no Iceberg (as pyiceberg's ``upsert_util`` keeps its
merge): the Iceberg commit that consumes the result lives in ``iceberg.py``. Input is the staged
change format (docs/FORMATS.md): table columns, then ``_pgl_*`` metadata, applied in
(``_pgl_commit_lsn``, ``_pgl_seq``) order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as sf
from pyspark.sql.types import StructField

from airflow_provider_postgres_cdc.spark.runtime import is_connect

# Staged metadata columns (FORMATS.md); table columns never start with the reserved ``_pgl_``.
OP = "_pgl_op"
COMMIT_LSN = "_pgl_commit_lsn"
COMMIT_TIME = "_pgl_commit_time"
BATCH_ID = "_pgl_batch_id"  # the changelog's: the batch that logged the change
SEQ = "_pgl_seq"
OLD = "_pgl_old"
UNCHANGED = "_pgl_unchanged"
# Working columns of this module.
SUB = "_pgl_x_sub"  # a key change's delete (0) sorts before its upsert (1)
EVENT_KIND = "_pgl_x_kind"
ROW_KEY = "_pgl_x_key"  # the row's key after the event
LOOKUP_KEY = "_pgl_x_lookup"  # where the row's earlier values live (the old key of a key change)
EVENT_ID = "_pgl_x_id"
PREDECESSOR = "_pgl_x_pred"
IS_PROBE = "_pgl_x_probe"
PROBE_KEY = "_pgl_x_probe_key"
ORDER = "_pgl_x_order"
VALUE, STILL_UNCHANGED, POINTER, TARGET_KEY = "_pgl_x_v", "_pgl_x_u", "_pgl_x_ptr", "_pgl_x_tkey"
UNFILLED = "_pgl_x_unfilled"  # unchanged columns whose value neither the batch nor the target holds
UPSERT, DELETE = "U", "D"


@dataclass(frozen=True)
class NetEffect:
    """What a table's batch leaves behind: one row per touched key, and whether it starts empty.

    ``rows`` has the table columns plus ``EVENT_KIND`` (``U``: the row now holds these values;
    ``D``: no row under this key), ``ROW_KEY``, and the event's ``COMMIT_LSN`` and ``COMMIT_TIME``;
    ``truncated`` means a TRUNCATE came before those events, so every other row of the table is
    gone too. ``unfilled`` holds the upserts
    (``ROW_KEY``, ``UNFILLED``) that keep an unchanged TOAST column no earlier change and no target
    row can supply: an UPDATE a row filter turned into an INSERT sends untouched out-of-line values
    as unchanged, and the row was never in the lake. Applying them would store NULL there.
    """

    rows: DataFrame
    truncated: bool
    unfilled: DataFrame | None = None


def table_columns(df: DataFrame) -> list[StructField]:
    """``df``'s table columns (nullable, as the lake holds them): all but the reserved ``_pgl_*``."""
    return [StructField(f.name, f.dataType, True) for f in df.schema.fields if not f.name.startswith("_pgl_")]


def column(name: str) -> Column:
    """A column by its exact name: dots, spaces and backticks in PostgreSQL names are not syntax."""
    return sf.col("`" + name.replace("`", "``") + "`")


CHECKPOINT_DIR_CONF = "spark.postgres_cdc.checkpointDir"
"""Spark property: a directory for reliable checkpoints (``run_job`` gives it to ``setCheckpointDir``)."""


def materialize(frame: DataFrame) -> DataFrame:
    """Compute ``frame`` once and cut its plan there (it is read more than once, or its plan grows).

    With a checkpoint directory (``spark.postgres_cdc.checkpointDir``, on storage every executor
    reaches) the rows are written there: a lost executor later costs a re-read, and Spark reruns
    the lost tasks within the job. Without one, a local checkpoint keeps them in the executors'
    block managers: faster, but an executor lost afterwards fails the job ("Checkpoint block ... not
    found"), and the apply converges only when re-run (docs/LAKE.md, "On a cluster").
    """
    spark = frame.sparkSession
    if not is_connect(spark) and spark.sparkContext.getCheckpointDir():
        return frame.checkpoint(eager=True)
    return frame.localCheckpoint()


def key_struct(keys: Sequence[str], source: str | None = None) -> Column:
    """The key as a struct column, from the row (``source=None``) or from struct column ``source``."""
    if source is None:
        return sf.struct(*[column(k).alias(k) for k in keys])
    return sf.struct(*[sf.col(source).getField(k).alias(k) for k in keys])


def order_after(commit: int, seq: int) -> Column:
    """Changes applied after the change at (``commit``, ``seq``)."""
    return (sf.col(COMMIT_LSN) > commit) | ((sf.col(COMMIT_LSN) == commit) & (sf.col(SEQ) > seq))


def _last_truncate() -> Column:
    """(commit LSN, seq, commit time in µs) of the last TRUNCATE, as an aggregate (null without one)."""
    moment = sf.unix_micros(sf.col(COMMIT_TIME))
    return sf.max(sf.when(sf.col(OP) == "T", sf.struct(sf.col(COMMIT_LSN), sf.col(SEQ), moment)))


def _position(value: Any) -> tuple[int, int] | None:
    return None if value is None else (int(value[0]), int(value[1]))


@dataclass(frozen=True)
class BatchFacts:
    """What the apply needs to know about a table's changes before it plans their merge.

    One aggregate (:func:`batch_facts`) answers all of it, so a table costs one Spark job here
    however many of these questions its plan asks. ``unchanged`` may name a column whose only
    unchanged values come before the last TRUNCATE (looking it up then finds nothing to fill).
    ``key_range`` is the lowest and highest first-key value of every key the changes touch (new
    keys of inserts and updates, old keys of deletes and key changes), None when one is null.
    ``truncate_micros`` is the last TRUNCATE's commit time, in microseconds since the epoch.
    """

    counts: dict[str, int]
    truncate: tuple[int, int] | None
    unchanged: frozenset[str]
    key_range: tuple[Any, Any] | None
    truncate_micros: int | None = None

    @property
    def changes(self) -> int:
        return sum(self.counts.values())

    @property
    def truncate_mark(self) -> tuple[int, int] | None:
        """(commit LSN, commit time in µs) of the last TRUNCATE: where a soft-deletes table marks it."""
        if self.truncate is None or self.truncate_micros is None:
            return None
        return self.truncate[0], self.truncate_micros


OPS = ("I", "U", "D", "T")


def batch_facts(changes: DataFrame, first_key: str | None = None) -> BatchFacts:
    """The :class:`BatchFacts` of ``changes``, in one Spark job; no key range without ``first_key``."""
    op = sf.col(OP)
    aggregates = [sf.count(sf.when(op == code, 1)).alias(code) for code in OPS]
    aggregates += [
        _last_truncate().alias("truncate"),
        sf.array_distinct(
            sf.flatten(sf.collect_set(sf.when(sf.size(UNCHANGED) > 0, sf.col(UNCHANGED))))
        ).alias("unchanged"),
    ]
    if first_key is not None:
        writes_new = op.isin("I", "U")  # the row's key after the change
        names_old = (op == "D") | ((op == "U") & sf.col(OLD).isNotNull())  # the key it had before
        new_key = sf.when(writes_new, column(first_key))
        old_key = sf.when(names_old, sf.col(OLD).getField(first_key))
        touched = sf.count(sf.when(writes_new, 1)) + sf.count(sf.when(names_old, 1))
        aggregates += [
            sf.least(sf.min(new_key), sf.min(old_key)).alias("low"),
            sf.greatest(sf.max(new_key), sf.max(old_key)).alias("high"),
            (touched - sf.count(new_key) - sf.count(old_key)).alias("null_keys"),
        ]
    row = changes.agg(*aggregates).first()
    assert row is not None  # a global aggregate has one row
    key_range = None
    if first_key is not None and row["null_keys"] == 0 and row["low"] is not None:
        key_range = (row["low"], row["high"])
    return BatchFacts(
        counts={code: int(row[code]) for code in OPS if row[code]},
        truncate=_position(row["truncate"]),
        unchanged=frozenset(row["unchanged"] or ()),
        key_range=key_range,
        truncate_micros=None if row["truncate"] is None else int(row["truncate"][2]),
    )


def _event_id() -> Column:
    return sf.struct(sf.col(COMMIT_LSN), sf.col(SEQ), sf.col(SUB))


def build_events(changes: DataFrame, columns: Sequence[StructField], keys: Sequence[str]) -> DataFrame:
    """Row events in apply order: an upsert per I/U, a delete per D and per U that changed the key.

    A key change's delete sorts before its upsert (``SUB`` 0 before 1), so an update that keeps
    its key still ends as an upsert. ``OP`` stays the change's (a key change's delete has ``U``).
    """
    names = [c.name for c in columns]
    new_key, old_key = key_struct(keys), key_struct(keys, OLD)
    has_old = sf.col(OLD).isNotNull()
    nulls = [sf.lit(None).cast(c.dataType).alias(c.name) for c in columns]
    meta = [sf.col(COMMIT_LSN), sf.col(COMMIT_TIME), sf.col(SEQ), sf.col(OP), sf.col(UNCHANGED)]
    upserts = changes.where(sf.col(OP).isin("I", "U")).select(
        *meta,
        sf.lit(1).alias(SUB),
        sf.lit(UPSERT).alias(EVENT_KIND),
        new_key.alias(ROW_KEY),
        sf.when(has_old, old_key).otherwise(new_key).alias(LOOKUP_KEY),
        *[column(n) for n in names],
    )
    deleted = (sf.col(OP) == "D") | ((sf.col(OP) == "U") & has_old & ~old_key.eqNullSafe(new_key))
    deletes = changes.where(deleted).select(
        *meta,
        sf.lit(0).alias(SUB),
        sf.lit(DELETE).alias(EVENT_KIND),
        old_key.alias(ROW_KEY),
        old_key.alias(LOOKUP_KEY),
        *nulls,
    )
    return upserts.unionByName(deletes)


def _predecessors(events: DataFrame) -> DataFrame:
    """For each upsert with unchanged columns: the id of the latest earlier event on its lookup key.

    Probes are unioned with the events and a running ``last`` over each key's events finds the
    latest one before the probe's change, in one pass however long the chains are.
    """
    needs = events.where((sf.col(EVENT_KIND) == UPSERT) & (sf.size(UNCHANGED) > 0))
    probes = needs.select(
        sf.col(LOOKUP_KEY).alias(PROBE_KEY),
        sf.struct(sf.col(COMMIT_LSN), sf.col(SEQ), sf.lit(-1).alias(SUB)).alias(ORDER),
        sf.lit(True).alias(IS_PROBE),
        _event_id().alias(EVENT_ID),
    )
    states = events.select(
        sf.col(ROW_KEY).alias(PROBE_KEY), _event_id().alias(ORDER), sf.lit(False).alias(IS_PROBE),
        _event_id().alias(EVENT_ID),
    )  # fmt: skip
    window = (
        Window.partitionBy(PROBE_KEY).orderBy(ORDER).rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    last_state = sf.last(sf.when(~sf.col(IS_PROBE), sf.col(EVENT_ID)), ignorenulls=True)
    return (
        probes.unionByName(states)
        .withColumn(PREDECESSOR, last_state.over(window))
        .where(sf.col(IS_PROBE))
        .select(EVENT_ID, PREDECESSOR)
    )


def fill_unchanged(
    events: DataFrame, target: DataFrame, keys: Sequence[str], filled: Sequence[str]
) -> DataFrame:
    """Replace unchanged-TOAST nulls by the value the row had just before the change.

    That value is the predecessor event's (itself possibly unchanged: pointer jumping follows such
    chains in log2(length) rounds, each round checkpointed to keep plans small), or, when no earlier
    event touched the row in this batch, the target table's current row under the lookup key.
    """
    preds = _predecessors(events)
    base = events.withColumn(EVENT_ID, _event_id()).join(preds, EVENT_ID, "left")
    base = base.withColumn(UNFILLED, sf.array().cast("array<string>"))
    target_keyed = target.select(key_struct(keys).alias(TARGET_KEY), *[column(n) for n in filled])
    columns = (VALUE, STILL_UNCHANGED, POINTER, TARGET_KEY)
    for name in filled:
        unchanged = sf.array_contains(UNCHANGED, name) & (sf.col(EVENT_KIND) == UPSERT)
        cells = materialize(
            base.select(
                EVENT_ID,
                column(name).alias(VALUE),
                unchanged.alias(STILL_UNCHANGED),
                sf.when(unchanged, sf.col(PREDECESSOR)).alias(POINTER),
                sf.when(unchanged, sf.col(LOOKUP_KEY)).alias(TARGET_KEY),
            )
        )
        for _ in range(64):  # each round doubles the chain length resolved: 2**64 is never reached
            if not cells.where(sf.col(STILL_UNCHANGED) & sf.col(POINTER).isNotNull()).limit(1).count():
                break
            prev = cells.select(*[sf.col(c).alias(f"p{c}") for c in (EVENT_ID, *columns)])
            jump = sf.col(STILL_UNCHANGED) & sf.col(POINTER).isNotNull()
            cells = materialize(
                cells.join(prev, sf.col(POINTER) == sf.col(f"p{EVENT_ID}"), "left").select(
                    EVENT_ID, *[sf.when(jump, sf.col(f"p{c}")).otherwise(sf.col(c)).alias(c) for c in columns]
                )
            )
        else:
            raise RuntimeError(f"unchanged TOAST column {name!r}: its predecessor chain does not end")
        from_target = target_keyed.select(
            TARGET_KEY, column(name).alias("_t"), sf.lit(True).alias("_found")
        ).dropDuplicates([TARGET_KEY])
        resolved = cells.join(from_target, TARGET_KEY, "left").select(
            EVENT_ID,
            sf.when(sf.col(STILL_UNCHANGED), sf.col("_t")).otherwise(sf.col(VALUE)).alias(name),
            (sf.col(STILL_UNCHANGED) & sf.col("_found").isNull()).alias("_lost"),
        )
        base = base.drop(name).join(resolved, EVENT_ID, "left")
        lost = sf.coalesce(sf.col("_lost"), sf.lit(False))
        base = base.withColumn(
            UNFILLED, sf.when(lost, sf.array_append(UNFILLED, sf.lit(name))).otherwise(sf.col(UNFILLED))
        ).drop("_lost")
    return base.drop(EVENT_ID, PREDECESSOR)


def final_rows(events: DataFrame) -> DataFrame:
    """The last event per key: what the batch leaves there (an upsert's row, or a delete)."""
    window = Window.partitionBy(ROW_KEY).orderBy(
        sf.col(COMMIT_LSN).desc(), sf.col(SEQ).desc(), sf.col(SUB).desc()
    )
    return events.withColumn("_rn", sf.row_number().over(window)).where(sf.col("_rn") == 1).drop("_rn")


def net_effect(
    changes: DataFrame,
    columns: Sequence[StructField],
    keys: Sequence[str],
    target: DataFrame,
    facts: BatchFacts,
) -> NetEffect:
    """Reduce ordered changes to one event per key; ``target`` supplies unchanged TOAST values.

    Changes before the batch's last TRUNCATE are dropped (it removed their rows), and unchanged
    values are then looked up in an empty target: nothing from before the TRUNCATE survives.
    ``facts`` are ``changes``' (:func:`batch_facts`).
    """
    truncate = facts.truncate
    live = changes if truncate is None else changes.where(order_after(*truncate))
    events = build_events(live, columns, keys)
    filled = sorted(facts.unchanged & {c.name for c in columns})
    kept = (EVENT_KIND, ROW_KEY, COMMIT_LSN, COMMIT_TIME)
    if not filled:
        rows = final_rows(events).select(*kept, *[column(c.name) for c in columns])
        return NetEffect(rows, truncate is not None)
    lookup = target.limit(0) if truncate is not None else target
    final = materialize(final_rows(fill_unchanged(events, lookup, keys, filled)))
    rows = final.select(*kept, *[column(c.name) for c in columns])
    unfilled = final.where((sf.col(EVENT_KIND) == UPSERT) & (sf.size(UNFILLED) > 0)).select(ROW_KEY, UNFILLED)
    return NetEffect(rows, truncate is not None, unfilled)
