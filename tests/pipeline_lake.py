"""Pipeline tables made with pyiceberg, as the apply job makes them, for tests and benchmarks that
need a lake without running Spark.

The job marks a table with the ``pgl.slot`` property and registers it in the slot's index
(``formats/lake_index.py``); readers find a table only through both, so a table made here gets both.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pyarrow as pa

from airflow_provider_postgres_cdc.formats import lake_index
from airflow_provider_postgres_cdc.formats.lake import OWNER_PROPERTY, LakeConfig

INDEX_SCHEMA = pa.schema([(name, pa.string()) for name in lake_index.COLUMNS])


def register(catalog: Any, config: LakeConfig, slot: str, identifiers: Iterable[tuple[str, str]]) -> None:
    """Append index entries for ``identifiers`` (creating the slot's index first when it is new)."""
    index_identifier = lake_index.index_identifier(config, slot)
    catalog.create_namespace_if_not_exists(index_identifier[0])
    index = catalog.create_table_if_not_exists(
        index_identifier, INDEX_SCHEMA, properties={"comment": lake_index.index_comment(slot)}
    )
    rows = [dict(zip(lake_index.COLUMNS, identifier, strict=True)) for identifier in identifiers]
    index.append(pa.Table.from_pylist(rows, INDEX_SCHEMA))


def create_owned_table(
    catalog: Any, config: LakeConfig, slot: str, identifier: tuple[str, str], schema: Any
) -> Any:
    """A new table of ``slot``'s pipeline: owner property set, registered in the slot's index."""
    table = catalog.create_table(identifier, schema, properties={OWNER_PROPERTY: slot})
    register(catalog, config, slot, [identifier])
    return table
