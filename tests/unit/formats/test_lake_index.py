"""The pipeline's index of its lake tables (lake_index.py): its name and how its entries are read."""

from __future__ import annotations

import pytest

from airflow_provider_postgres_cdc.formats import lake_index
from airflow_provider_postgres_cdc.formats.lake import NAME_RULES, LakeConfig, NameRule
from airflow_provider_postgres_cdc.formats.names import refusal

# PostgreSQL slot names: lowercase letters, digits and underscores, any of them first or last.
SLOTS = ["shop_cdc", "_leading", "trailing_", "a__b", "0digits", "x" * 63]


@pytest.mark.parametrize("slot", SLOTS)
@pytest.mark.parametrize("names", NAME_RULES)
@pytest.mark.parametrize("prefix", ["", "team_a_"])
def test_the_index_name_suits_the_strictest_rest_catalogs_whatever_the_slot(
    slot: str, names: NameRule, prefix: str
) -> None:
    """SeaweedFS and S3 Tables take it under either name rule (formats/names.py says what they take)."""
    namespace, table = lake_index.index_identifier(LakeConfig(namespace_prefix=prefix, names=names), slot)
    assert refusal(namespace, namespace=True) is None and refusal(table, namespace=False) is None
    if names == "preserve":
        assert (namespace, table) == (f"{prefix}pgl_pipelines", f"slot_{slot}_tables")


@pytest.mark.parametrize("names", NAME_RULES)
def test_the_index_is_where_the_lake_would_put_its_source_name(names: NameRule) -> None:
    """Named through the config's own rule, so the index follows the lake's names like any table."""
    config = LakeConfig(namespace_prefix="pg_", names=names)
    assert lake_index.index_identifier(config, "s") == config.identifier("pgl_pipelines", "slot_s_tables")
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
