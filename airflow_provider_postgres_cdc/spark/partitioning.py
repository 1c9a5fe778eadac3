"""Partitioned lake tables in the apply job: created with their spec, moved to a new one when asked.

The option and its rules are ``formats/partitioning.py``'s. A table is created partitioned with
one ``CREATE TABLE ... PARTITIONED BY ... AS SELECT`` (atomic, like an unpartitioned create); an
existing table whose recorded spec differs from the one asked for is moved to it in one Iceberg
transaction that also records it. Iceberg keeps each data file under the spec it was written
with, so nothing is rewritten: later commits use the new spec, and maintenance's compaction
rewrites older files into it.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from typing import Any

from airflow_provider_postgres_cdc.formats.partitioning import (
    PARTITION_PROPERTY,
    TEMPORAL,
    PartitionField,
    spec_text,
)

log = logging.getLogger("postgres_cdc.apply")


def partition_clause(fields: Sequence[PartitionField]) -> str:
    """The ``PARTITIONED BY (...)`` clause of a ``CREATE TABLE`` (Spark SQL's transforms)."""
    return f"PARTITIONED BY ({', '.join(field.spark_sql() for field in fields)})"


def current_fields(table: Any) -> list[tuple[str, PartitionField]]:
    """The table's partition spec as (Iceberg's field name, field); void fields left out."""
    schema = table.schema()
    fields = []
    for field in table.spec().fields():
        transform = str(field.transform().toString())
        column = str(schema.findColumnName(field.sourceId()))
        name, _, width = transform.partition("[")
        if name == "void":
            continue
        size = int(width.rstrip("]")) if width else None
        fields.append((str(field.name()), PartitionField(TEMPORAL.get(name, name), column, size)))
    return fields


def conform_spec(jvm: Any, table: Any, fields: Sequence[PartitionField]) -> bool:
    """Move an existing table to ``fields`` unless its recorded spec is that one; True when moved.

    The change is one transaction (spec and property): a run that dies before it leaves the old
    spec recorded, and the next run makes the change again.
    """
    wanted = spec_text(fields)
    if table.properties().get(PARTITION_PROPERTY) == wanted:
        return False
    transaction = table.newTransaction()
    update = transaction.updateSpec()
    current = current_fields(table)
    for name, field in current:
        if field not in fields:
            update = update.removeField(name)
    present = {field for _, field in current}
    for field in fields:
        if field not in present:
            update = update.addField(_term(jvm, field))
    update.commit()
    transaction.updateProperties().set(PARTITION_PROPERTY, wanted).commit()
    transaction.commitTransaction()
    log.info("%s: partition spec is now %s", table.name(), wanted)
    return True


def partition_sources(table: Any) -> set[str]:
    """The columns any partition spec of the table uses, current or older (Iceberg keeps them all)."""
    schema = table.schema()
    names = set()
    for spec in table.specs().values():
        for field in spec.fields():
            name = schema.findColumnName(field.sourceId())
            if name is not None:
                names.add(str(name))
    return names


def drop_columns(table: Any, columns: Sequence[str], suffix: str) -> None:
    """Drop ``columns`` in one transaction, with the partition fields on them (see
    :func:`drop_partition_fields`). A column a partition spec of the table ever used is renamed
    ``<name><suffix>`` instead: Iceberg keeps every spec, and its writes fail once the source
    column of one is gone."""
    used = partition_sources(table)
    transaction = table.newTransaction()
    drop_partition_fields(transaction, table, columns)
    update = transaction.updateSchema()
    for name in columns:
        update = update.renameColumn(name, name + suffix) if name in used else update.deleteColumn(name)
    update.commit()
    transaction.commitTransaction()


def drop_partition_fields(transaction: Any, table: Any, columns: Collection[str]) -> None:
    """In ``transaction``, remove the partition fields whose source is one of ``columns`` (which
    are about to be dropped) and the recorded spec, so that :func:`conform_spec` sets the spec the
    option names again once the columns are back."""
    doomed = [(name, field) for name, field in current_fields(table) if field.column in columns]
    if not doomed:
        return
    update = transaction.updateSpec()
    for name, _ in doomed:
        update = update.removeField(name)
    update.commit()
    transaction.updateProperties().remove(PARTITION_PROPERTY).commit()
    log.warning(
        "%s: partition fields %s dropped with their columns; a table partition_by names gets them back",
        table.name(), [str(field) for _, field in doomed],
    )  # fmt: skip


def _term(jvm: Any, field: PartitionField) -> Any:
    """Iceberg's ``Term`` for ``field`` (``org.apache.iceberg.expressions.Expressions``)."""
    expressions = jvm.org.apache.iceberg.expressions.Expressions
    if field.transform == "identity":
        return expressions.ref(field.column)
    if field.transform == "bucket":
        return expressions.bucket(field.column, field.width)
    if field.transform == "truncate":
        return expressions.truncate(field.column, field.width)
    return getattr(expressions, field.transform[:-1])(field.column)  # years -> year, ...
