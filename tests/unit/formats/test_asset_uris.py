"""Asset URIs of lake tables and cuts: valid, distinct and reversible for any name (formats/assets.py)."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_postgres_cdc.formats import assets
from airflow_provider_postgres_cdc.formats.lake import LakeConfig

HOSTILE = ["orders", "my table", "a.b", "50%", "x/y", "Ünïcödé", "日本", "a%2Eb", "?#&=", "self", " "]
names = st.text(min_size=1, max_size=20)


def test_table_uri_shape() -> None:
    ref = assets.LakeTableRef("lake", "public", "orders")
    assert ref.uri == "iceberg://lake/public/orders"
    assert assets.parse_asset_uri(ref.uri) == ref
    assert assets.CutRef("lake", "shop_cdc").uri == "postgres-cdc://lake/shop_cdc"


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_names_give_ascii_uris_that_parse_back(name: str) -> None:
    lake = LakeConfig(catalog="läke")
    namespace, table = lake.identifier(name, name)
    ref = assets.LakeTableRef(lake.catalog, namespace, table)
    assert ref.uri.isascii() and " " not in ref.uri
    parts = urlsplit(ref.uri)
    assert not parts.query and not parts.fragment
    assert assets.parse_asset_uri(ref.uri) == ref
    cut = assets.CutRef(lake.catalog, name)
    assert assets.parse_asset_uri(cut.uri) == cut


@given(names, names, names, names)
def test_distinct_names_give_distinct_uris(ns1: str, t1: str, ns2: str, t2: str) -> None:
    first, second = assets.LakeTableRef("c", ns1, t1), assets.LakeTableRef("c", ns2, t2)
    assert (first.uri == second.uri) == ((ns1, t1) == (ns2, t2))
    assert assets.parse_asset_uri(first.uri) == first


@given(names, names)
def test_openlineage_names_are_unambiguous_for_lake_namespaces(schema: str, table: str) -> None:
    lake = LakeConfig()
    ref = assets.LakeTableRef("lake", *lake.identifier(schema, table))
    namespace, name = assets.openlineage_dataset(ref.uri)
    assert namespace == "iceberg://lake"
    lake_namespace, _, lake_table = name.partition(".")
    assert (lake_namespace, lake_table) == lake.identifier(schema, table)


def test_equivalent_spellings_normalize_to_one_uri() -> None:
    assert (
        assets.normalize(urlsplit("ICEBERG://lake/%70ublic/orders%7e")).geturl()
        == "iceberg://lake/public/orders~"
    )


@pytest.mark.parametrize(
    "uri",
    [
        "iceberg://lake/public",
        "iceberg://lake/a/b/c",
        "iceberg:///public/orders",
        "iceberg://lake/public/orders?x=1",
        "iceberg://user@lake/public/orders",
        "postgres-cdc://lake",
        "postgres-cdc://lake/a/b",
        "s3://bucket/key",
    ],
)
def test_malformed_uris_say_what_is_wrong(uri: str) -> None:
    with pytest.raises(ValueError, match=r"asset URI"):
        assets.parse_asset_uri(uri)
