"""How the Airflow side finds a pipeline's tables (lake_catalog.owned_tables): through the slot's index,
confirmed by the owner property, on a real (SQLite-backed) pyiceberg catalog.

That the Spark job writes the index these tests write by hand is tests/integration/spark/test_lake_index.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from airflow_provider_postgres_cdc.engine.lake_catalog import open_catalog, owned_tables
from airflow_provider_postgres_cdc.formats import lake_index
from airflow_provider_postgres_cdc.formats.lake import OWNER_PROPERTY, LakeConfig, local_lake
from tests.pipeline_lake import create_owned_table, register

SLOT = "shop_cdc"
COLUMNS = pa.schema([("id", pa.int64())])


@pytest.fixture
def lake(tmp_path: Path) -> LakeConfig:
    (tmp_path / "lake" / "warehouse").mkdir(parents=True)
    return local_lake(str(tmp_path / "lake"))


@pytest.fixture
def catalog(lake: LakeConfig) -> Any:
    catalog = open_catalog(lake)
    catalog.create_namespace("public")
    return catalog


def found(catalog: Any, lake: LakeConfig, slot: str = SLOT) -> list[tuple[str, str]]:
    return [tuple(table.name()[-2:]) for table in owned_tables(catalog, lake, slot)]


def test_a_pipeline_without_an_index_has_no_tables(catalog: Any, lake: LakeConfig) -> None:
    catalog.create_table(("public", "orders"), COLUMNS, properties={OWNER_PROPERTY: SLOT})
    assert found(catalog, lake) == []  # owned by property, but never registered: not looked for


def test_the_index_narrows_and_the_owner_property_confirms(catalog: Any, lake: LakeConfig) -> None:
    create_owned_table(catalog, lake, SLOT, ("public", "orders"), COLUMNS)
    create_owned_table(catalog, lake, SLOT, ("public", "items"), COLUMNS)
    create_owned_table(catalog, lake, "other_slot", ("public", "theirs"), COLUMNS)
    catalog.create_table(("public", "unmarked"), COLUMNS)
    register(catalog, lake, SLOT, [("public", "theirs"), ("public", "unmarked")])  # named, not owned
    assert found(catalog, lake) == [("public", "items"), ("public", "orders")]
    assert found(catalog, lake, "other_slot") == [("public", "theirs")]


def test_a_dropped_table_is_skipped_and_a_recreated_one_found_once(catalog: Any, lake: LakeConfig) -> None:
    catalog.create_namespace("gone")
    create_owned_table(catalog, lake, SLOT, ("public", "orders"), COLUMNS)
    create_owned_table(catalog, lake, SLOT, ("gone", "items"), COLUMNS)
    register(catalog, lake, SLOT, [("never", "created")])  # a job that crashed before creating it
    catalog.drop_table(("gone", "items"))
    catalog.drop_namespace("gone")
    assert found(catalog, lake) == [("public", "orders")]
    catalog.drop_table(("public", "orders"))
    catalog.create_table(("public", "orders"), COLUMNS, properties={OWNER_PROPERTY: SLOT})  # re-snapshot
    register(catalog, lake, SLOT, [("public", "orders")])  # and registered twice, as racing jobs may
    index = catalog.load_table(lake_index.index_identifier(lake, SLOT))
    assert index.scan().to_arrow().num_rows == 4
    assert found(catalog, lake) == [("public", "orders")]
