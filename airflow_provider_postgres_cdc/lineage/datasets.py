"""OpenLineage datasets of a staged batch: the published PostgreSQL tables in, the Iceberg tables out.

Names follow the OpenLineage naming spec, so lineage from other producers joins ours:

* a source table is namespace ``postgres://{host}:{port}`` (the source connection's host and port,
  5432 when unset) and name ``{database}.{schema}.{table}``, names as PostgreSQL spells them (the
  postgres provider's SQL lineage names them so too);
* a lake table (and its changelog and history tables, ``<table>__pgl_changelog`` and
  ``<table>__pgl_history``) is named as OpenLineage's Spark integration names an Iceberg table a
  Spark job reads (:mod:`.naming`): by its location (``s3://<bucket>`` and the key, ``file`` and the
  path), read from its Iceberg metadata, with a ``symlinks`` facet holding the catalog's names for
  it; a table not created yet (the first load's START) is placed where Spark's integration places
  it, ``<warehouse>/<namespace>/<table>``;
* a pipeline's consistent cut (the ack's output) is ``postgres-cdc://<catalog>``, name ``<slot>``.

Staging is not a dataset. A staged batch is a transient directory per batch (deleted by the
retention task): as a dataset it would add one node per batch and table to the lineage graph,
and a stable stand-in name would name a path that never exists. The apply job's lineage therefore
runs from the source tables to the lake tables directly, with identity column lineage; the batch
itself, its LSN window and its cut tag, is the ``postgresCdcBatch`` run facet.

Everything OpenLineage is imported inside the functions: callers reach here only once
:func:`.tasks.openlineage_available` said yes.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from airflow_provider_postgres_cdc.formats import lake as lake_format
from airflow_provider_postgres_cdc.formats.assets import CutRef, openlineage_dataset
from airflow_provider_postgres_cdc.formats.column_transforms import hashed_columns
from airflow_provider_postgres_cdc.formats.lake import LakeConfig
from airflow_provider_postgres_cdc.formats.manifest import Manifest, TableManifest, is_sibling, sibling_name
from airflow_provider_postgres_cdc.lineage import naming
from airflow_provider_postgres_cdc.lineage.facets import BATCH_FACET, PUBLICATION_FACET, facet_types

log = logging.getLogger(__name__)

POSTGRES_DEFAULT_PORT = 5432
Fields = list[tuple[str, str]]
"""A table's columns as (name, type name)."""


def postgres_namespace(params: Mapping[str, Any]) -> str:
    """``postgres://{host}:{port}`` of the libpq parameters of a source connection."""
    host = params.get("host") or "localhost"
    return f"postgres://{host}:{params.get('port') or POSTGRES_DEFAULT_PORT}"


def postgres_name(database: str, schema: str, table: str) -> str:
    return f"{database}.{schema}.{table}"


def cut_dataset_name(catalog: str, slot: str) -> tuple[str, str]:
    return openlineage_dataset(CutRef(catalog, slot).uri)


def cut_tag(manifest: Manifest) -> str | None:
    """The cut tag the lake carries for this batch once every table holds it (apply_batch._tag_cut).

    None for an empty batch (nothing is applied, nothing tagged) and for a re-snapshot exported by
    a temporary slot (its point lies inside a batch of the pipeline's stream: no cut there).
    """
    if not manifest.tables:
        return None
    if manifest.kind == "snapshot" and manifest.snapshot_slot not in (None, manifest.slot):
        return None
    return lake_format.tag_name(manifest.end_lsn)


def batch_facets(manifest: Manifest) -> dict[str, Any]:
    """The run facets of a task working on ``manifest``: ``{"postgresCdcBatch": ...}``."""
    facet = facet_types().batch(
        slot=manifest.slot,
        kind=manifest.kind,
        batchId=manifest.batch_id,
        startLsn=str(manifest.start_lsn),
        endLsn=str(manifest.end_lsn),
        cutTag=cut_tag(manifest),
        snapshotName=manifest.snapshot_name,
        changes=manifest.stats.changes,
        transactions=manifest.stats.transactions,
        rows=manifest.total_rows,
    )
    return {BATCH_FACET: facet}


def schema_facet(fields: Fields) -> Any:
    from airflow.providers.common.compat.openlineage.facet import SchemaDatasetFacet, SchemaDatasetFacetFields

    return SchemaDatasetFacet(
        fields=[
            SchemaDatasetFacetFields(name=name, type=kind, ordinal_position=position)
            for position, (name, kind) in enumerate(fields, start=1)
        ]
    )


def source_fields(entry: TableManifest) -> Fields:
    """The published columns of a source table with their PostgreSQL type names."""
    return [(column.name, column.pg_type) for column in entry.columns]


def input_dataset(
    namespace: str, manifest: Manifest, entry: TableManifest, publications: Sequence[str]
) -> Any:
    """A published source table: schema, row filter and column list."""
    from airflow.providers.common.compat.openlineage.facet import InputDataset

    publication = facet_types().publication(
        rowFilter=entry.row_filter,
        columnList=None if entry.column_list is None else list(entry.column_list),
        publications=list(publications),
        replicaIdentity=entry.replica_identity,
        keyColumns=list(entry.key_columns),
    )
    return InputDataset(
        namespace=namespace,
        name=postgres_name(manifest.database, entry.schema, entry.table),
        facets={"schema": schema_facet(source_fields(entry)), PUBLICATION_FACET: publication},
    )


def column_lineage(
    fields: Fields,
    source_namespace: str,
    source_name: str,
    source_columns: Iterable[str],
    hashed: Collection[str] = (),
) -> Any:
    """Identity lineage: each output column from the same-named source column (an overflow
    sibling ``<c>__pgl_text``, the exact text of ``c``, from ``c`` too; a ``hashed`` column, a
    masking transformation of it); columns without a source column (the changelog's own, dropped
    ones) have none."""
    from airflow.providers.common.compat.openlineage.facet import (
        ColumnLineageDatasetFacet,
        Fields,
        InputField,
    )
    from openlineage.client.generated.column_lineage_dataset import Transformation

    published = set(source_columns)
    lineage = {}
    for name, _ in fields:
        source = name.removesuffix(sibling_name("")) if is_sibling(name) else name
        if source not in published:
            continue
        identity = source == name and source not in hashed
        if source in hashed:
            about = f"HMAC-SHA256 of the text of {source} (column_transforms)"
        else:
            about = "" if identity else f"exact text of {source} where its lake type cannot hold it"
        transformation = Transformation(
            type="DIRECT",
            subtype="IDENTITY" if identity else "TRANSFORMATION",
            description=about,
            masking=True if source in hashed else None,
        )
        lineage[name] = Fields(
            inputFields=[InputField(source_namespace, source_name, source, transformations=[transformation])],
            transformationType="IDENTITY" if identity else None,
            transformationDescription="identical" if identity else transformation.description,
        )
    return ColumnLineageDatasetFacet(fields=lineage)


@dataclass(frozen=True, slots=True)
class LakeTable:
    """What lineage reads of a lake table that exists: its Iceberg columns and its location."""

    fields: Fields
    location: str


def read_lake_tables(
    lake: LakeConfig, identifiers: Iterable[tuple[str, str]]
) -> dict[tuple[str, str], LakeTable]:
    """The lake tables among ``identifiers`` that exist, read with pyiceberg (columns as Iceberg types).

    Empty when the catalog cannot be read (lineage then falls back to the staged columns and the
    warehouse's default locations): lineage must never make a task wait on, or fail with, the catalog.
    """
    from airflow_provider_postgres_cdc.engine.lake_catalog import open_catalog

    try:
        catalog = open_catalog(lake)
    except Exception as exc:
        log.info(
            "OpenLineage: lake catalog %s not readable (%s); schemas from the manifest", lake.catalog, exc
        )
        return {}
    found: dict[tuple[str, str], LakeTable] = {}
    for ident in identifiers:
        try:
            table = catalog.load_table(ident)
        except Exception:  # not created yet (a first load's START), or gone
            continue
        found[ident] = lake_table(table)
    return found


def lake_table(table: Any) -> LakeTable:
    """A pyiceberg table's columns and location."""
    return LakeTable([(f.name, str(f.field_type)) for f in table.schema().fields], table.location())


def lake_dataset(
    kind: Any,
    lake: LakeConfig,
    ident: tuple[str, str],
    table: LakeTable | None,
    facets: Mapping[str, Any] | None = None,
    **extra: Any,
) -> Any | None:
    """A lake table as dataset class ``kind`` (``InputDataset``, ``OutputDataset``), named as
    :mod:`.naming` says, with its ``symlinks`` facet; None when it has no name (no location, no warehouse)."""
    from airflow.providers.common.compat.openlineage.facet import Identifier, SymlinksDatasetFacet

    name = naming.lake_dataset_name(lake, *ident, table.location if table is not None else None)
    if name is None:
        log.info("OpenLineage: %s.%s has no location yet and the catalog no warehouse: left out", *ident)
        return None
    symlinks = SymlinksDatasetFacet(
        identifiers=[Identifier(s.namespace, s.name, naming.SYMLINK_TYPE) for s in name.symlinks]
    )
    return kind(name.namespace, name.name, facets={"symlinks": symlinks, **(facets or {})}, **extra)


def output_datasets(
    lake: LakeConfig,
    manifest: Manifest,
    source_namespace: str | None,
    *,
    statistics: bool,
) -> list[Any]:
    """The lake tables a batch writes (each data table, for a change batch its changelog, and the
    history tables of tables that keep one).

    ``statistics`` adds the rows written (staged rows: rows loaded, or changes applied), which is
    only true once the apply has run. Without a ``source_namespace`` there is no column lineage.
    """
    from airflow.providers.common.compat.openlineage.facet import (
        OutputDataset,
        OutputStatisticsOutputDatasetFacet,
    )

    # (entry, kind) in output order; entries are not hashable (a batch's carry catalog facts). A
    # history table is written only where a table keeps one: it is named only when it exists.
    wanted: list[tuple[TableManifest, str]] = [(entry, "table") for entry in manifest.tables]
    kinds = ("changelog table", "history table") if manifest.kind == "batch" else ("history table",)
    wanted += [(entry, kind) for kind in kinds for entry in manifest.tables]
    identifiers = [lake.companions(entry.schema, entry.table)[kind] for entry, kind in wanted]
    known = read_lake_tables(lake, identifiers)
    kept = [i for i, (_, kind) in enumerate(wanted) if kind != "history table" or identifiers[i] in known]
    wanted, identifiers = [wanted[i] for i in kept], [identifiers[i] for i in kept]
    outputs = []
    for (entry, _), ident in zip(wanted, identifiers, strict=True):
        table = known.get(ident)
        fields = table.fields if table is not None else [(c.name, c.arrow_type) for c in entry.columns]
        facets: dict[str, Any] = {"schema": schema_facet(fields)}
        if source_namespace is not None:
            source = postgres_name(manifest.database, entry.schema, entry.table)
            facets["columnLineage"] = column_lineage(
                fields, source_namespace, source, (c.name for c in entry.columns),
                hashed_columns(entry.column_transforms),
            )  # fmt: skip
        output_facets: dict[str, Any] = {}
        if statistics:
            output_facets["outputStatistics"] = OutputStatisticsOutputDatasetFacet(rowCount=entry.rows)
        dataset = lake_dataset(OutputDataset, lake, ident, table, facets, outputFacets=output_facets)
        if dataset is not None:
            outputs.append(dataset)
    return outputs
