"""The OpenLineage of each pipeline task, as the operators' ``get_openlineage_facets_on_*`` return it.

========================  ==================================  ==================================
task                      inputs                              outputs
========================  ==================================  ==================================
snapshot, drain           the published source tables         (none: staging is not a dataset)
apply, load               the published source tables         the lake tables (changelogs, histories)
ack                       the lake tables of the batch        the pipeline's cut
lake maintenance          the slot's lake tables              the same tables (rewritten)
========================  ==================================  ==================================

Every task working on a batch adds the ``postgresCdcBatch`` run facet (LSN window, cut tag).

Each entry point is guarded: without the openlineage provider it returns None at once, and any
error is logged and turned into None, so lineage can never fail or hold up a task (the provider
catches errors too, but a method of ours must not depend on it). The snapshot and the drain know
their batch only once it is staged, so their START events carry no datasets; their COMPLETE
events read the manifest their task returned (XCom).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Sequence
from typing import Any, ParamSpec, TypeVar

from airflow_provider_postgres_cdc.engine.object_store import S3Options
from airflow_provider_postgres_cdc.engine.staging import read_manifest
from airflow_provider_postgres_cdc.formats.lake import LakeConfig, companions_of
from airflow_provider_postgres_cdc.formats.manifest import Manifest
from airflow_provider_postgres_cdc.hooks.lake import PostgresCdcLakeHook
from airflow_provider_postgres_cdc.hooks.postgres import PostgresCdcHook
from airflow_provider_postgres_cdc.hooks.staging import staging_options
from airflow_provider_postgres_cdc.lineage import datasets
from airflow_provider_postgres_cdc.lineage.facets import facet_types

log = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")


@functools.cache
def openlineage_available() -> bool:
    """Whether the openlineage provider (and so its client) can be imported here."""
    try:
        import airflow.providers.openlineage.extractors  # noqa: F401

        facet_types()
    except ImportError:
        return False
    return True


def guarded(build: Callable[P, R]) -> Callable[P, R | None]:
    """None instead of lineage when OpenLineage is absent, or when building it fails (logged)."""

    @functools.wraps(build)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R | None:
        if not openlineage_available():
            return None
        try:
            return build(*args, **kwargs)
        except Exception:
            log.warning(
                "OpenLineage: %s failed; the task goes on without lineage", build.__name__, exc_info=True
            )
            return None

    return wrapper


def _lineage(**parts: Any) -> Any:
    from airflow.providers.openlineage.extractors import OperatorLineage

    return OperatorLineage(**parts)


def _publications(value: str | Sequence[str] | None) -> list[str]:
    if not value:
        return []
    return [value] if isinstance(value, str) else [str(v) for v in value]


def _source_namespace(conn_id: str) -> str:
    return datasets.postgres_namespace(PostgresCdcHook(conn_id).connection_params())


def _source_inputs(manifest: Manifest, conn_id: str, publications: Sequence[str]) -> list[Any]:
    namespace = _source_namespace(conn_id)
    return [datasets.input_dataset(namespace, manifest, entry, publications) for entry in manifest.tables]


def _lake(operator: Any) -> LakeConfig:
    return PostgresCdcLakeHook(str(operator.lake_conn_id)).get_conn()


@guarded
def nothing_yet() -> Any:
    """START of the snapshot and the drain: an empty lineage (None would make the provider warn)."""
    return _lineage()


@guarded
def staged_lineage(operator: Any, task_instance: Any) -> Any:
    """Snapshot or drain, on completion: the source tables its staged manifest (its XCom) holds."""
    summary = task_instance.xcom_pull(task_ids=operator.task_id)
    if not isinstance(summary, dict) or not summary.get("manifest"):
        return None
    manifest = read_manifest(str(summary["manifest"]), _staging(operator))
    inputs = _source_inputs(manifest, str(operator.postgres_conn_id), _publications(operator.publications))
    return _lineage(inputs=inputs, run_facets=datasets.batch_facets(manifest))


def upstream_source(operator: Any, task_instance: Any) -> tuple[str, list[str]] | None:
    """(connection id, publications) of the task that staged the apply's manifest, rendered.

    The apply has no source connection of its own: its direct upstream snapshot or drain (the
    task groups' wiring) names it, as a template rendered here in the apply's context.
    """
    if task_instance is None:
        return None
    context = task_instance.get_template_context()
    for task in operator.upstream_list:
        conn_id = getattr(task, "postgres_conn_id", None)
        if conn_id is None or not hasattr(task, "publications"):
            continue
        rendered = task.render_template(conn_id, context)
        return str(rendered), _publications(task.render_template(task.publications, context))
    return None


@guarded
def apply_lineage(operator: Any, task_instance: Any = None) -> Any:
    """Apply or load: source tables in, lake tables out (with statistics once ``task_instance`` ran).

    At START the apply has no task instance to render its upstream's connection with, so it
    names the lake tables only; at COMPLETE the source tables and the column lineage join them.
    """
    manifest = read_manifest(str(operator.manifest), _staging(operator))
    chosen = set(operator.tables or ())
    if chosen:
        manifest = dataclasses.replace(
            manifest, tables=tuple(t for t in manifest.tables if t.qualified in chosen)
        )
    run_facets = datasets.batch_facets(manifest)
    if not manifest.tables:
        return _lineage(run_facets=run_facets)
    source = upstream_source(operator, task_instance)
    namespace = _source_namespace(source[0]) if source else None
    inputs = []
    if source is not None and namespace is not None:
        inputs = [datasets.input_dataset(namespace, manifest, entry, source[1]) for entry in manifest.tables]
    outputs = datasets.output_datasets(
        _lake(operator), manifest, namespace, statistics=task_instance is not None
    )
    return _lineage(inputs=inputs, outputs=outputs, run_facets=run_facets)


@guarded
def ack_lineage(operator: Any) -> Any:
    """Ack: the batch's lake tables in (their commits are checked), the pipeline's cut out."""
    from airflow.providers.common.compat.openlineage.facet import InputDataset, OutputDataset

    manifest = read_manifest(str(operator.manifest), _staging(operator))
    run_facets = datasets.batch_facets(manifest)
    if not manifest.tables:
        return _lineage(run_facets=run_facets)
    lake = _lake(operator)
    identifiers = [lake.identifier(entry.schema, entry.table) for entry in manifest.tables]
    known = datasets.read_lake_tables(lake, identifiers)
    inputs = [datasets.lake_dataset(InputDataset, lake, ident, known.get(ident)) for ident in identifiers]
    outputs = [OutputDataset(*datasets.cut_dataset_name(lake.catalog, manifest.slot))]
    return _lineage(inputs=[d for d in inputs if d is not None], outputs=outputs, run_facets=run_facets)


@guarded
def maintenance_lineage(operator: Any) -> Any:
    """Lake maintenance: every table of the slot's pipeline (changelogs and histories too), read and
    rewritten."""
    from airflow.providers.common.compat.openlineage.facet import InputDataset, OutputDataset

    from airflow_provider_postgres_cdc.engine.lake_catalog import open_catalog, owned_tables

    lake = _lake(operator)
    catalog = open_catalog(lake)
    found: list[tuple[tuple[str, str], datasets.LakeTable]] = []
    for table in owned_tables(catalog, lake, str(operator.slot_name)):
        namespace, name = table.name()[-2:]
        found.append(((namespace, name), datasets.lake_table(table)))
        for companion in companions_of((namespace, name)):
            if catalog.table_exists(companion):
                found.append((companion, datasets.lake_table(catalog.load_table(companion))))
    inputs, outputs = [], []
    for ident, table in found:
        facets = {"schema": datasets.schema_facet(table.fields)}
        inputs.append(datasets.lake_dataset(InputDataset, lake, ident, table, facets))
        outputs.append(datasets.lake_dataset(OutputDataset, lake, ident, table, facets))
    return _lineage(inputs=inputs, outputs=outputs)


def _staging(operator: Any) -> S3Options | None:
    """The staging store's keys, for an ``s3://`` manifest (the operator's ``staging_conn_id``)."""
    return staging_options(getattr(operator, "staging_conn_id", None))
