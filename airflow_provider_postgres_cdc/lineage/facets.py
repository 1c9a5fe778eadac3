"""The two custom OpenLineage facets of this provider, built only when the openlineage provider is there.

* ``postgresCdcBatch`` (run facet): the staged snapshot or change batch a task read, applied or
  acknowledged: slot, kind, batch id, the source LSN window and the consistent-cut tag.
* ``postgresCdcPublication`` (input dataset facet): how PostgreSQL publishes a table to the pipeline:
  its row filter, column list, replica identity and key columns.

Each is defined as the providers define theirs (an ``attrs`` subclass of the client's ``RunFacet``
or ``DatasetFacet`` whose ``_get_schema`` names its JSON schema); the schemas ship in ``schemas/``
next to this module, and a unit test validates emitted facets against them. The classes subclass
the OpenLineage client's, so they are created on first use (:func:`facet_types`) and never at
import: without the provider this module imports, and nothing calls it.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCHEMAS = Path(__file__).with_name("schemas")
"""The facets' JSON schemas, shipped with the package."""
SCHEMA_BASE = (
    "https://github.com/airflow-provider-postgres-cdc/airflow-provider-postgres-cdc/blob/main/"
    "airflow_provider_postgres_cdc/lineage/schemas/"
)
"""Where the schemas are published (the ``$id`` of each file in ``schemas/``)."""

BATCH_FACET = "postgresCdcBatch"
PUBLICATION_FACET = "postgresCdcPublication"


def schema_url(name: str) -> str:
    """A facet's ``_schemaURL``: its schema file and the JSON pointer to its definition."""
    return f"{SCHEMA_BASE}{name}.json#/$defs/{name}"


def schema_of(name: str) -> dict[str, Any]:
    """The JSON schema document of the facet class ``name`` (as shipped in ``schemas/``)."""
    document: dict[str, Any] = json.loads((SCHEMAS / f"{name}.json").read_text(encoding="utf-8"))
    return document


@dataclass(frozen=True, slots=True)
class FacetTypes:
    """The facet classes, created against the installed OpenLineage client."""

    batch: type[Any]
    publication: type[Any]


@functools.cache
def facet_types() -> FacetTypes:
    """Create the facet classes (once); ``ImportError`` when the openlineage provider is absent."""
    import attrs
    from airflow.providers.common.compat.openlineage.facet import DatasetFacet, RunFacet

    if not isinstance(RunFacet, type):  # common.compat's no-op stand-in: no OpenLineage client
        raise ImportError("the OpenLineage client is not installed")

    @attrs.define
    class PostgresCdcBatchRunFacet(RunFacet):  # type: ignore[misc,valid-type]
        """The batch or snapshot of a task run (schemas/PostgresCdcBatchRunFacet.json)."""

        slot: str
        kind: str
        batchId: str  # noqa: N815 - OpenLineage facets are camelCase
        startLsn: str  # noqa: N815
        endLsn: str  # noqa: N815
        cutTag: str | None = None  # noqa: N815
        snapshotName: str | None = None  # noqa: N815
        changes: int = 0
        transactions: int = 0
        rows: int = 0

        @staticmethod
        def _get_schema() -> str:
            return schema_url("PostgresCdcBatchRunFacet")

    @attrs.define
    class PostgresCdcPublicationDatasetFacet(DatasetFacet):  # type: ignore[misc,valid-type]
        """A published table's row filter and column list.

        Its schema: schemas/PostgresCdcPublicationDatasetFacet.json.
        """

        rowFilter: str | None  # noqa: N815
        columnList: list[str] | None  # noqa: N815
        publications: list[str] = attrs.field(factory=list)
        replicaIdentity: str | None = None  # noqa: N815
        keyColumns: list[str] = attrs.field(factory=list)  # noqa: N815

        @staticmethod
        def _get_schema() -> str:
            return schema_url("PostgresCdcPublicationDatasetFacet")

    return FacetTypes(batch=PostgresCdcBatchRunFacet, publication=PostgresCdcPublicationDatasetFacet)
