"""OpenLineage datasets of a staged batch: the published PostgreSQL tables in, the Iceberg tables out.

Names follow the OpenLineage naming spec, so lineage from other producers joins ours:

* a source table is namespace ``postgres://{host}:{port}`` (the source connection's host and port,
  5432 when unset) and name ``{database}.{schema}.{table}``, names as PostgreSQL spells them (the
  postgres provider's SQL lineage names them so too);
* a lake table is what :func:`formats.assets.openlineage_dataset` makes of its Asset URI:
  namespace ``iceberg://<catalog>``, name ``<lake namespace>.<table>``; its changelog table
  (``<table>__pgl_changelog``) likewise;
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
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from airflow_provider_postgres_cdc.formats import lake as lake_format
from airflow_provider_postgres_cdc.formats.assets import CutRef, LakeTableRef, openlineage_dataset
from airflow_provider_postgres_cdc.formats.lake import LakeConfig
from airflow_provider_postgres_cdc.formats.manifest import Manifest, TableManifest, is_sibling, sibling_name
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


def lake_dataset_name(
    lake: LakeConfig, schema: str, table: str, *, changelog: bool = False
) -> tuple[str, str]:
    """(namespace, name) of the lake table (or its changelog) mirroring the source ``schema.table``."""
    ident = lake.changelog_identifier(schema, table) if changelog else lake.identifier(schema, table)
    return openlineage_dataset(LakeTableRef(lake.catalog, *ident).uri)


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
    fields: Fields, source_namespace: str, source_name: str, source_columns: Iterable[str]
) -> Any:
    """Identity lineage: each output column from the same-named source column (an overflow
    sibling ``<c>__pgl_text``, the exact text of ``c``, from ``c`` too); columns without a source
    column (the changelog's own, dropped ones) have none."""
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
        identity = source == name
        transformation = Transformation(
            type="DIRECT",
            subtype="IDENTITY" if identity else "TRANSFORMATION",
            description="" if identity else f"exact text of {source} where its lake type cannot hold it",
        )
        lineage[name] = Fields(
            inputFields=[InputField(source_namespace, source_name, source, transformations=[transformation])],
            transformationType="IDENTITY" if identity else None,
            transformationDescription="identical" if identity else transformation.description,
        )
    return ColumnLineageDatasetFacet(fields=lineage)


def lake_fields(lake: LakeConfig, identifiers: Iterable[tuple[str, str]]) -> dict[tuple[str, str], Fields]:
    """The Iceberg columns (name, Iceberg type) of lake tables that exist, read with pyiceberg.

    Empty when the catalog cannot be read (lineage then falls back to the staged columns): lineage
    must never make a task wait on, or fail with, the catalog.
    """
    from airflow_provider_postgres_cdc.engine.lake_catalog import open_catalog

    try:
        catalog = open_catalog(lake)
    except Exception as exc:
        log.info(
            "OpenLineage: lake catalog %s not readable (%s); schemas from the manifest", lake.catalog, exc
        )
        return {}
    found: dict[tuple[str, str], Fields] = {}
    for ident in identifiers:
        try:
            table = catalog.load_table(ident)
        except Exception:  # not created yet (a first load's START), or gone
            continue
        found[ident] = [(f.name, str(f.field_type)) for f in table.schema().fields]
    return found


def output_datasets(
    lake: LakeConfig,
    manifest: Manifest,
    source_namespace: str | None,
    *,
    statistics: bool,
) -> list[Any]:
    """The lake tables a batch writes (each data table, and for a change batch its changelog).

    ``statistics`` adds the rows written (staged rows: rows loaded, or changes applied), which is
    only true once the apply has run. Without a ``source_namespace`` there is no column lineage.
    """
    from airflow.providers.common.compat.openlineage.facet import (
        OutputDataset,
        OutputStatisticsOutputDatasetFacet,
    )

    # (entry, changelog?) in output order; entries are not hashable (a batch's carry catalog facts).
    wanted: list[tuple[TableManifest, bool]] = [(entry, False) for entry in manifest.tables]
    if manifest.kind == "batch":
        wanted += [(entry, True) for entry in manifest.tables]
    identifiers = [
        lake.changelog_identifier(entry.schema, entry.table)
        if changelog
        else lake.identifier(entry.schema, entry.table)
        for entry, changelog in wanted
    ]
    known = lake_fields(lake, identifiers)
    outputs = []
    for (entry, changelog), ident in zip(wanted, identifiers, strict=True):
        fields = known.get(ident) or [(c.name, c.arrow_type) for c in entry.columns]
        facets: dict[str, Any] = {"schema": schema_facet(fields)}
        if source_namespace is not None:
            source = postgres_name(manifest.database, entry.schema, entry.table)
            facets["columnLineage"] = column_lineage(
                fields, source_namespace, source, (c.name for c in entry.columns)
            )
        output_facets: dict[str, Any] = {}
        if statistics:
            output_facets["outputStatistics"] = OutputStatisticsOutputDatasetFacet(rowCount=entry.rows)
        namespace, name = lake_dataset_name(lake, entry.schema, entry.table, changelog=changelog)
        outputs.append(
            OutputDataset(namespace=namespace, name=name, facets=facets, outputFacets=output_facets)
        )
    return outputs
