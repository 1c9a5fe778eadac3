"""The lake's tables and a pipeline's consistent cut as Airflow Assets (README "Assets").

The URIs are defined in :mod:`.formats.assets`; this module makes Airflow objects of them and
holds the handler and OpenLineage converter the provider registers for the two schemes.

Which tables a batch changes is known only once it is drained, so the writing tasks declare an
:class:`~airflow.sdk.AssetAlias` as their outlet and attach one event per table written to it
at run time (``outlet_events[alias].add(asset, extra=...)``); Airflow creates an Asset the first
time an event names it. A downstream DAG schedules on the Assets themselves
(``schedule=[cut_asset("lake", "shop_cdc")]``), built here so that its name and URI are the ones
the events carry.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import SplitResult

from airflow.sdk import Asset, AssetAlias

from airflow_provider_postgres_cdc.formats import assets as uris
from airflow_provider_postgres_cdc.formats.lake import LakeConfig

if TYPE_CHECKING:
    from airflow.providers.common.compat.openlineage.facet import Dataset as OpenLineageDataset

TABLES_ALIAS = "postgres_cdc_lake_tables"
"""Default alias of the tasks that write lake tables (the apply and the snapshot load)."""
CUTS_ALIAS = "postgres_cdc_cuts"
"""Default alias of the ack, which emits the pipeline's cut."""


def table_asset(lake: LakeConfig, schema: str, table: str) -> Asset:
    """The Asset of the lake table that mirrors the source table ``schema.table``."""
    namespace, name = lake.identifier(schema, table)
    return Asset(uri=uris.LakeTableRef(lake.catalog, namespace, name).uri)


def cut_asset(catalog: str | LakeConfig, slot: str) -> Asset:
    """The Asset of the consistent cuts of ``slot``'s pipeline in the lake of ``catalog``.

    :param catalog: the lake's Spark catalog name (the lake connection's ``catalog``), or its config.
    """
    name = catalog.catalog if isinstance(catalog, LakeConfig) else catalog
    return Asset(uri=uris.CutRef(name, slot).uri)


def alias(name: str) -> AssetAlias:
    return AssetAlias(name=name)


def sanitize_uri(parts: SplitResult) -> SplitResult:
    """Airflow's URI handler for ``iceberg://`` and ``postgres-cdc://`` (registered by the provider)."""
    return uris.normalize(parts)


def convert_asset_to_openlineage(asset: Asset, lineage_context: Any) -> OpenLineageDataset:
    """The OpenLineage dataset of an Asset of either scheme (registered by the provider)."""
    from airflow.providers.common.compat.openlineage.facet import Dataset as OpenLineageDataset

    namespace, name = uris.openlineage_dataset(asset.uri)
    return OpenLineageDataset(namespace=namespace, name=name)
