"""The ``partition_by`` option: every Iceberg transform Spark SQL names, canonical texts, and the
errors of a bad option, each naming the entry at fault and what to write instead."""

from __future__ import annotations

import json

import pytest

from airflow_provider_postgres_cdc.errors import PartitionSpecError
from airflow_provider_postgres_cdc.formats.lsn import Lsn
from airflow_provider_postgres_cdc.formats.manifest import ColumnManifest, Manifest, TableManifest
from airflow_provider_postgres_cdc.formats.partitioning import (
    PartitionField,
    check_manifest,
    option_text,
    parse_field,
    parse_partition_by,
    spec_text,
)


@pytest.mark.parametrize(
    ("text", "field", "spark_sql"),
    [
        ("placed_at", PartitionField("identity", "placed_at"), "`placed_at`"),
        ("identity(region)", PartitionField("identity", "region"), "`region`"),
        ("days(placed_at)", PartitionField("days", "placed_at"), "days(`placed_at`)"),
        ("day(placed_at)", PartitionField("days", "placed_at"), "days(`placed_at`)"),
        ("date(placed_at)", PartitionField("days", "placed_at"), "days(`placed_at`)"),
        ("YEARS( placed_at )", PartitionField("years", "placed_at"), "years(`placed_at`)"),
        ("month(placed_at)", PartitionField("months", "placed_at"), "months(`placed_at`)"),
        ("date_hour(placed_at)", PartitionField("hours", "placed_at"), "hours(`placed_at`)"),
        ("bucket(16, customer_id)", PartitionField("bucket", "customer_id", 16), "bucket(16, `customer_id`)"),
        ("truncate(4,sku)", PartitionField("truncate", "sku", 4), "truncate(4, `sku`)"),
        ('days("Placed At")', PartitionField("days", "Placed At"), "days(`Placed At`)"),
        ('"we""ird`(x)"', PartitionField("identity", 'we"ird`(x)'), '`we"ird``(x)`'),
    ],
)
def test_every_transform_parses_to_its_canonical_field(
    text: str, field: PartitionField, spark_sql: str
) -> None:
    parsed = parse_field(text)
    assert parsed == field and parsed.spark_sql() == spark_sql
    assert parse_field(str(parsed)) == parsed  # the canonical text reads back


def test_the_option_is_a_mapping_or_its_json_or_python_text() -> None:
    option = {"public.orders": ["days(placed_at)", "bucket(8, id)"], "public.plain": []}
    expected = {
        "public.orders": (PartitionField("days", "placed_at"), PartitionField("bucket", "id", 8)),
        "public.plain": (),
    }
    assert parse_partition_by(option) == expected
    assert parse_partition_by(json.dumps(option)) == expected
    assert parse_partition_by(repr(option)) == expected  # a plain {{ params.partition_by }}
    assert parse_partition_by(option_text(expected)) == expected
    assert parse_partition_by(None) == parse_partition_by("") == parse_partition_by("{}") == {}
    assert json.loads(spec_text(expected["public.orders"])) == ["days(placed_at)", "bucket(8, id)"]


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (
            {"public.orders": ["weeks(placed_at)"]},
            "'weeks' is not an Iceberg partition transform; use one of",
        ),
        ({"public.orders": ["bucket(placed_at)"]}, "bucket takes a positive whole number and a column"),
        ({"public.orders": ["truncate(0, sku)"]}, "truncate takes a positive whole number"),
        (
            {"public.orders": ["days(placed at)"]},
            "is not a column name; write a name as is, or in double quotes",
        ),
        ({"public.orders": ["days(a)", "day(a)"]}, "names one field twice"),
        ({"orders": ["days(a)"]}, "'orders' is not a schema.table name"),
        ({"public.orders": "days(a)"}, "is a list of partition fields"),
        (["days(a)"], 'maps "schema.table" names to lists of partition fields'),
        ("{not json", "(a dict, or its JSON text); not '"),
        ({"public.orders": [""]}, "a partition field is a text such as 'days(placed_at)'"),
    ],
)
def test_a_bad_option_names_the_entry_and_the_fix(option: object, message: str) -> None:
    with pytest.raises(PartitionSpecError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_partition_by(option)  # type: ignore[arg-type]


def _manifest(*columns: tuple[str, str]) -> Manifest:
    table = TableManifest(
        schema="public", table="orders", key_columns=("id",), replica_identity="d", rows=1, files=(),
        columns=tuple(ColumnManifest(name, "", 0, -1, arrow) for name, arrow in columns),
    )  # fmt: skip
    return Manifest("batch", "slot", "db", "batch-1", Lsn(1), Lsn(2), (table,))


@pytest.mark.parametrize(
    ("field", "arrow", "ok"),
    [
        ("days(c)", "timestamp[us, tz=UTC]", True),
        ("days(c)", "date32[day]", True),
        ("hours(c)", "date32[day]", False),
        ("hours(c)", "timestamp[us]", True),
        ("months(c)", "string", False),
        ("bucket(4, c)", "decimal128(12, 2)", True),
        ("bucket(4, c)", "double", False),
        ("bucket(4, c)", "bool", False),
        ("truncate(4, c)", "binary", True),
        ("truncate(4, c)", "timestamp[us]", False),
        ("c", "double", True),
        ("c", "list<item: string>", False),
    ],
)
def test_a_transform_takes_only_the_types_iceberg_allows(field: str, arrow: str, ok: bool) -> None:
    manifest = _manifest(("id", "int64"), ("c", arrow))
    specs = parse_partition_by({"public.orders": [field]})
    if ok:
        check_manifest(manifest, specs)
    else:
        with pytest.raises(PartitionSpecError, match="cannot partition column 'c', staged as"):
            check_manifest(manifest, specs)


def test_a_column_the_table_does_not_publish_is_refused_and_other_tables_are_not_checked() -> None:
    manifest = _manifest(("id", "int64"), ("total__pgl_text", "string"))
    with pytest.raises(
        PartitionSpecError, match="names column 'total__pgl_text', which the table does not publish"
    ):
        check_manifest(manifest, parse_partition_by({"public.orders": ["total__pgl_text"]}))
    check_manifest(manifest, parse_partition_by({"public.items": ["days(missing)"]}))  # not in this batch
