"""Decoded table changes into a batch's Parquet part files, and the table manifests that list them.

A table whose shape changes mid-batch (a column added, dropped or retyped) gets a new writer, so
each part file holds one relation version; the manifest records every version with its files.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field

from airflow_provider_postgres_cdc.engine.staging import PartFileWriter, StagingLocation
from airflow_provider_postgres_cdc.errors import StagingNotWritableError
from airflow_provider_postgres_cdc.formats.layout import change_part_prefix, table_dir_name
from airflow_provider_postgres_cdc.formats.manifest import ColumnManifest, TableManifest
from airflow_provider_postgres_cdc.formats.pgtypes import pg_type_name
from airflow_provider_postgres_cdc.formats.schema_changes import RelationVersion, SourceColumn
from airflow_provider_postgres_cdc.pgoutput.arrow import TableChanges
from airflow_provider_postgres_cdc.pgoutput.messages import Relation
from airflow_provider_postgres_cdc.values import overflow


@dataclass(slots=True)
class _TableOutput:
    """The part files of one table across the relation versions seen in this batch."""

    schema: str
    table: str
    relation: Relation
    writers: list[PartFileWriter] = field(default_factory=list)
    shapes: list[Relation] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return sum(w.rows for w in self.writers)


class BatchStager:
    """Routes decoded table changes to bounded Parquet part files, one writer per relation version."""

    def __init__(self, location: StagingLocation, batch_dir: str) -> None:
        self.location = location
        self.batch_dir = batch_dir
        self.tables: dict[tuple[str, str], _TableOutput] = {}

    def add(self, changes: TableChanges) -> None:
        try:
            self._add(changes)
        except OSError as exc:
            raise self.write_error(exc) from exc

    def write_error(self, exc: OSError) -> StagingNotWritableError:
        """A failed write (disk full, read-only, permissions) as the error that says what to do."""
        return StagingNotWritableError(
            f"cannot write the batch to {self.location.uri_of(self.batch_dir)}: {exc}. Nothing of this "
            "batch is kept and the slot did not move: free space in (or fix) the staging location, then "
            "run the drain again."
        )

    def _add(self, changes: TableChanges) -> None:
        relation = changes.relation
        key = (relation.namespace, relation.name)
        out = self.tables.get(key)
        if out is None:
            out = self.tables[key] = _TableOutput(relation.namespace, relation.name, relation)
        if not out.shapes or not out.shapes[-1].same_shape(relation):
            # batch_dir is inside the staging root already (joining the root again would double a
            # relative object-store root: bucket/prefix/bucket/prefix/...).
            directory = posixpath.join(self.batch_dir, table_dir_name(*key))
            prefix = change_part_prefix(len(out.shapes))
            schema = changes.batches[0].schema if changes.batches else changes.to_table().schema
            out.writers.append(PartFileWriter(self.location, directory, schema, prefix=prefix))
            out.shapes.append(relation)
            out.relation = relation
        out.writers[-1].write_all(changes.batches)

    def close(self) -> list[TableManifest]:
        manifests = []
        for out in self.tables.values():
            for writer in out.writers:
                try:
                    writer.close()
                except OSError as exc:
                    raise self.write_error(exc) from exc
            manifests.append(_table_manifest(out, self.location, self.batch_dir))
        return manifests

    def abort(self) -> None:
        for out in self.tables.values():
            for writer in out.writers:
                writer.abort()


def _table_manifest(out: _TableOutput, location: StagingLocation, batch_dir: str) -> TableManifest:
    """Columns of the latest relation version first, then any dropped mid-batch (still in older files)."""
    columns: dict[str, ColumnManifest] = {}
    for relation, writer in zip(reversed(out.shapes), reversed(out.writers), strict=True):
        for column in relation.columns:
            if column.name not in columns:
                columns[column.name] = ColumnManifest(
                    name=column.name,
                    pg_type=pg_type_name(column.type_oid),
                    type_oid=column.type_oid,
                    typmod=column.typmod,
                    arrow_type=str(writer.schema.field(column.name).type),
                    key=column.is_key,
                )
    staged = [name for writer in out.writers for name in writer.fields]
    for sibling in overflow.sibling_manifests(list(columns), staged):
        columns.setdefault(sibling.name, sibling)
    prefix = batch_dir.rstrip("/") + "/"
    files = tuple(path[len(prefix) :] for writer in out.writers for path in writer.files)
    versions = tuple(
        RelationVersion(
            tuple(SourceColumn(c.name, c.type_oid, c.typmod) for c in relation.columns),
            tuple(path[len(prefix) :] for path in writer.files),
        )
        for relation, writer in zip(out.shapes, out.writers, strict=True)
    )
    identity = out.relation.replica_identity
    warnings: tuple[str, ...] = ()
    if identity == "n" or not out.relation.key_columns:
        warnings = (
            f"{out.schema}.{out.table} has no replica identity key: UPDATE and DELETE cannot be replicated. "
            "Add a primary key or set REPLICA IDENTITY.",
        )
    return TableManifest(
        schema=out.schema,
        table=out.table,
        columns=tuple(columns.values()),
        key_columns=out.relation.key_columns,
        replica_identity=identity if identity in ("d", "f", "i", "n") else "d",  # type: ignore[arg-type]
        rows=out.rows,
        files=files,
        warnings=warnings,
        versions=versions,
    )
