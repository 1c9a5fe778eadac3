"""The pipeline's index of its lake tables (lake_index.py): its name and how its entries are read."""

from __future__ import annotations

import re

import pytest

from airflow_provider_postgres_cdc.formats import lake_index
from airflow_provider_postgres_cdc.formats.lake import LakeConfig

# SeaweedFS's and AWS S3 Tables' rule for namespace and table names (docs/LAKE.md, "REST catalogs").
STRICT_NAME = re.compile(r"[a-z0-9][a-z0-9_-]*")


@pytest.mark.parametrize("slot", ["shop_cdc", "_leading_underscore", "0digits", "x" * 63])
@pytest.mark.parametrize("prefix", ["", "team_a_"])
def test_the_index_name_suits_the_strictest_rest_catalogs_whatever_the_slot(slot: str, prefix: str) -> None:
    """PostgreSQL slot names are lowercase letters, digits and underscores, any of them first."""
    namespace, table = lake_index.index_identifier(LakeConfig(namespace_prefix=prefix), slot)
    assert (namespace, table) == (f"{prefix}pgl_pipelines", f"slot_{slot}")
    assert STRICT_NAME.fullmatch(namespace) and STRICT_NAME.fullmatch(table)


def test_the_index_is_where_the_lake_would_put_its_source_name() -> None:
    """Named through the config's own mapping, so a change of that mapping moves the index with it."""
    config = LakeConfig(namespace_prefix="pg_")
    assert lake_index.index_identifier(config, "s") == config.identifier("pgl_pipelines", "slot_s")
    assert lake_index.index_namespace(config) == config.namespace("pgl_pipelines")


def test_indexed_tables_are_distinct_and_sorted() -> None:
    """Entries repeat when two jobs raced to register a table; incomplete rows name nothing."""
    entries = [("public", "b"), ("public", "a"), ("public", "b"), ("My Schema", "a"), (None, "x"), ("y", "")]
    assert lake_index.indexed_tables(entries) == [("My Schema", "a"), ("public", "a"), ("public", "b")]
    assert lake_index.indexed_tables([]) == []


def test_a_job_registers_only_what_the_index_lacks_once_in_its_order() -> None:
    run = [("public", "b"), ("public", "a"), ("public", "b"), ("public", "c")]
    assert lake_index.unregistered(run, [("public", "c")]) == [("public", "b"), ("public", "a")]
    assert lake_index.unregistered(run[:1], run) == []
