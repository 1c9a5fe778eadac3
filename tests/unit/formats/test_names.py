"""Lake names: the portable rule and its inverse (formats/names.py), and both rules in LakeConfig."""

from __future__ import annotations

import json

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from airflow_provider_postgres_cdc.errors import LakeConfigError, LakeNameError
from airflow_provider_postgres_cdc.formats import lake
from airflow_provider_postgres_cdc.formats.lake import LakeConfig
from airflow_provider_postgres_cdc.formats.names import (
    MAX_NAME_LENGTH,
    portable_name,
    refusal,
    source_name,
)

# The hostile names of the drain and quoting tests (tests/integration/drain/test_names.py,
# tests/integration/replication/test_identifier_quoting.py), and the shapes the rule must handle.
HOSTILE = [
    "My Schema",
    "v1.2 sales%",
    "Prix €",
    'x"; DROP TABLE victims; --',
    "s'; DROP TABLE victims; --",
    "UPPER",
    "_leading",
    "trailing_",
    "a__b",
    "2024_sales",
    "aws_costs",
    "t__pgl_changelog",
    "a/b",
    "",
    "😀",
    "a" * 63,
]
PORTABLE = LakeConfig(names="portable")
# Any text, weighted towards the characters that make names hard: case, separators, escapes.
NAMES = st.text(st.one_of(st.sampled_from("aAzZ09_ .%/-\"'$€ü"), st.characters(codec="utf-8")), max_size=40)


@pytest.mark.parametrize(
    ("source", "portable"),
    [
        ("orders", "orders"),
        ("order_items", "order_items"),
        ("v2", "v2"),
        ("Orders", "0_orders"),
        ("OrderItems", "0_order_items"),
        ("My Schema", "0_my_220_schema"),
        ("v1.2 sales%", "0v1_22e2_220sales_225"),
        ("_leading", "0_0leading"),
        ("a__b", "0a_0_0b"),
        ("2024_sales", "02024_0sales"),
        ("aws_costs", "0aws_0costs"),
        ("Prix €", "0_prix_220_420ac"),
        ("😀", "0_51f600"),
        ("", "0"),
    ],
)
def test_portable_names_keep_plain_names_and_spell_out_the_rest(source: str, portable: str) -> None:
    assert portable_name(source) == portable  # the examples of docs/LAKE.md "Names"
    assert source_name(portable) == source


@given(NAMES)
@example("Sales")
@example("")
def test_every_name_reads_back_and_is_one_the_catalogs_take(name: str) -> None:
    encoded = portable_name(name)
    assert source_name(encoded) == name
    assert "__" not in encoded  # so "<table>__pgl_changelog" is never another table's name
    if len(encoded) <= MAX_NAME_LENGTH:
        assert refusal(encoded, namespace=False) is None
        assert refusal(encoded + lake.CHANGELOG_SUFFIX, namespace=False) is None


@given(NAMES, NAMES)
@example("Sales", "sales")
@example("a b", "a_b")
@example("ä", "_2e4")
def test_different_names_never_share_a_portable_name(first: str, second: str) -> None:
    if first != second:
        assert portable_name(first) != portable_name(second)


def test_hostile_names_get_lake_names_every_catalog_takes() -> None:
    tables = [(schema, table) for schema in HOSTILE for table in HOSTILE]
    PORTABLE.check_names(tables)
    for schema, table in tables:
        namespace, name = PORTABLE.identifier(schema, table)
        assert refusal(namespace, namespace=True) is None and refusal(name, namespace=False) is None
        assert PORTABLE.source_of(namespace, name) == (schema, table)


@pytest.mark.parametrize(
    "name",
    ["Orders", "_x", "0_", "0_7", "0_2zz", "0_2F", "0a", "0_3041", "0_6110000", "aws_x", "a-b", "a__b"],
)
def test_names_the_rule_never_makes_read_back_as_none(name: str) -> None:
    assert source_name(name) is None


@pytest.mark.parametrize(
    ("name", "namespace", "why"),
    [
        ("Orders", False, "only a-z, 0-9 and _"),
        ("_x", False, "starting and ending with a letter or digit"),
        ("x_", False, "starting and ending"),
        ("a.b", False, "only a-z"),
        ("a-b", False, "only a-z"),
        ("x" * 256, False, "256 characters long, over the 255"),
        ("aws_x", True, "start with 'aws'"),
    ],
)
def test_refusals_say_what_seaweedfs_and_s3_tables_refuse(name: str, namespace: bool, why: str) -> None:
    assert why in (refusal(name, namespace=namespace) or "")
    assert refusal("x" * 255, namespace=True) is None
    assert refusal("aws_x", namespace=False) is None  # only namespaces are kept from "aws"


@given(NAMES, NAMES, st.sampled_from(["", "cdc_", "p.x%"]))
@example("My Schema", "t__pgl_changelog", "")
def test_source_of_inverts_identifier_under_both_rules(schema: str, table: str, prefix: str) -> None:
    preserve = LakeConfig(namespace_prefix=prefix)
    if not table.endswith(lake.COMPANION_SUFFIXES):  # "preserve": a companion's name
        assert preserve.source_of(*preserve.identifier(schema, table)) == (schema, table)
    if prefix != "p.x%":
        portable = LakeConfig(namespace_prefix=prefix, names="portable")
        assert portable.source_of(*portable.identifier(schema, table)) == (schema, table)
        assert portable.source_of(*portable.changelog_identifier(schema, table)) is None
        assert portable.source_of(*portable.history_identifier(schema, table)) is None
    configs = [preserve, portable] if prefix != "p.x%" else [preserve]
    for config in configs:  # the companions found from the table's lake name are the ones named
        companions = [config.changelog_identifier(schema, table), config.history_identifier(schema, table)]
        assert lake.companions_of(config.identifier(schema, table)) == companions


def test_preserve_names_are_the_ones_lakes_have_today() -> None:
    config = LakeConfig(namespace_prefix="pg_")
    assert config.identifier("My Schema", "v1.2 sales%") == ("pg_My Schema", "v1.2 sales%")
    assert config.changelog_identifier("a.b%c", "T") == ("pg_a%2Eb%25c", "T__pgl_changelog")
    assert json.loads(config.to_json()) == {"catalog": "lake", "properties": {}, "namespace_prefix": "pg_"}
    assert lake.NAMES_CONF not in config.spark_conf()


def test_portable_names_take_the_prefix_as_it_is() -> None:
    config = LakeConfig(namespace_prefix="cdc_", names="portable")
    assert config.identifier("Sales", "Orders") == ("cdc_0_sales", "0_orders")
    assert config.changelog_identifier("public", "Orders") == ("cdc_public", "0_orders__pgl_changelog")
    assert config.source_of("cdc_0_sales", "0_orders") == ("Sales", "Orders")
    assert config.source_of("other_sales", "orders") is None
    assert config.source_of("cdc_Sales", "orders") is None  # not a name the rule makes
    assert config.spark_conf()[lake.NAMES_CONF] == "portable"


def test_the_setting_round_trips_through_the_connection_extras() -> None:
    config = LakeConfig("lake", {"type": "rest", "uri": "http://x"}, "cdc_", "portable")
    assert json.loads(config.to_json())["names"] == "portable"
    assert LakeConfig.from_json(config.to_json()) == config
    assert LakeConfig.from_mapping({"names": "preserve"}).names == "preserve"
    with pytest.raises(LakeConfigError, match=r"'names' must be one of \['preserve', 'portable'\]"):
        LakeConfig.from_mapping({"names": "lowercase"})


@pytest.mark.parametrize("prefix", ["Cdc_", "_cdc", "cdc.", "cdc-"])
def test_a_portable_lake_refuses_a_prefix_that_is_not_portable(prefix: str) -> None:
    with pytest.raises(LakeConfigError, match=r"namespace_prefix .* is not portable"):
        LakeConfig(namespace_prefix=prefix, names="portable")
    LakeConfig(namespace_prefix=prefix)  # "preserve" encodes what it must


@pytest.mark.parametrize("kind", ["changelog", "history"])
def test_preserve_refuses_a_table_that_would_be_another_tables_changelog_or_history(kind: str) -> None:
    tables = [("public", "t"), ("public", "Orders"), ("public", f"t__pgl_{kind}")]
    with pytest.raises(LakeNameError) as refused:
        LakeConfig().check_names(tables)
    message = str(refused.value)
    assert f"public.t and public.t__pgl_{kind} would share the lake table public.t__pgl_" in message
    assert f"'preserve' name rule (the {kind} of the first, the table of the second)" in message
    assert "set names 'portable'" in message and "slot has not moved" in message
    PORTABLE.check_names(tables)  # "t__pgl_changelog" is 0t_0_0pgl_0changelog there
    LakeConfig().check_names([("public", "Orders"), ("Public", "orders")])  # "preserve" keeps case apart


def test_portable_refuses_names_too_long_naming_the_table_and_the_name() -> None:
    PORTABLE.check_names([(" " * 63, "t")])  # 253 characters: still a namespace the catalogs take
    with pytest.raises(LakeNameError) as refused:
        PORTABLE.check_names([("public", "ok"), ("public", " " * 63)])
    message = str(refused.value)
    assert 'source table public."' in message and "would get the lake changelog table name" in message
    assert "268 characters long, over the 255" in message and "Rename the source table" in message
    with pytest.raises(LakeNameError, match=r"lake namespace name 'aws' .* start with 'aws'"):
        LakeConfig(namespace_prefix="a", names="portable").check_names([("ws", "t")])
