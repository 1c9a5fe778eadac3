"""The type matrix of docs/TYPES.md, measured: it cannot go stale.

One table on the real server has a column per type (the built-ins, an enum, a domain, a
composite, a range and arrays) with sample values, edge cases included. Its rows go through the
local snapshot engine and one CDC batch into the lake (one Spark session); the matrix records,
per type, the staged Arrow type, the Iceberg type, what Spark and pyiceberg read, and whether
every value came back as PostgreSQL prints it (pg_text.py). ``POSTGRES_CDC_WRITE_TYPES_DOC=1``
rewrites the generated part of docs/TYPES.md; otherwise the committed file must match.
"""

from __future__ import annotations

import os
from pathlib import Path

import psycopg2
import pytest
from psycopg2 import sql
from pyspark.sql import SparkSession

from airflow_provider_postgres_cdc.engine.drain import DrainSettings, drain_batch
from airflow_provider_postgres_cdc.engine.lake_catalog import load_table, open_catalog, read_table
from airflow_provider_postgres_cdc.engine.snapshot import take_snapshot
from airflow_provider_postgres_cdc.formats.lake import LakeConfig
from airflow_provider_postgres_cdc.formats.manifest import sibling_name
from airflow_provider_postgres_cdc.spark.apply_batch import apply_manifest
from airflow_provider_postgres_cdc.testing import PostgresCluster
from tests.integration.spark.pg_text import lake_vs_postgres
from tests.pg_majors import XML_MISSING

pytestmark = [pytest.mark.integration, pytest.mark.spark]

DOC = Path(__file__).resolve().parents[3] / "docs" / "TYPES.md"
BEGIN, END = "<!-- BEGIN GENERATED: tests/integration/spark/test_types_doc.py -->", "<!-- END GENERATED -->"
WRITE_ENV = "POSTGRES_CDC_WRITE_TYPES_DOC"

USER_TYPES = """
CREATE TYPE mood AS ENUM ('sad', 'happy');
CREATE DOMAIN posint AS int CHECK (VALUE > 0);
CREATE TYPE pair AS (a int, b text);
CREATE TYPE floatrange AS RANGE (subtype = float8);
"""
# (column, PostgreSQL type, sample values as PostgreSQL text): edge cases included.
CASES: list[tuple[str, str, list[str]]] = [
    ("c_bool", "bool", ["t", "f"]),
    ("c_int2", "int2", ["-32768", "32767"]),
    ("c_int4", "int4", ["-2147483648", "2147483647"]),
    ("c_int8", "int8", ["-9223372036854775808", "9223372036854775807"]),
    ("c_oid", "oid", ["4294967295"]),
    ("c_float4", "float4", ["1.1", "NaN", "-Infinity", "-0"]),
    ("c_float8", "float8", ["0.1", "Infinity", "NaN", "1e-308"]),
    ("c_numeric_10_2", "numeric(10,2)", ["12.34", "-0.01", "NaN"]),
    ("c_numeric_38_0", "numeric(38,0)", ["99999999999999999999999999999999999999"]),
    ("c_numeric_60_2", "numeric(60,2)", ["123456789012345678901234567890123456789012345678.50"]),
    ("c_numeric", "numeric", ["1.50", "NaN", "Infinity", "-Infinity"]),
    ("c_money", "money", ["$1.50", "-$92,233,720,368,547,758.08"]),
    ("c_text", "text", ["tab\tand\nnewline \\ ", ""]),
    ("c_varchar", "varchar(5)", ["abc"]),
    ("c_bpchar", "char(5)", ["ab"]),
    ("c_char", '"char"', ["x"]),
    ("c_name", "name", ["a name"]),
    ("c_bytea", "bytea", ["\\x00ff", "\\x"]),
    ("c_date", "date", ["2024-02-29", "0001-01-01", "infinity", "-infinity", "0044-03-15 BC", "10000-01-01"]),
    ("c_time", "time", ["12:34:56.5", "00:00:00", "24:00:00"]),
    ("c_timetz", "timetz", ["12:00:00+05:30"]),
    ("c_timestamp", "timestamp", ["2024-01-02 03:04:05.5", "infinity", "0044-03-15 BC", "10000-01-01"]),
    (
        "c_timestamptz",
        "timestamptz",
        ["2024-01-02 03:04:05.123456+00", "-infinity", "10000-01-01 00:00:00+00"],
    ),
    ("c_interval", "interval", ["1 year 2 mons 3 days 04:05:06.5", "-1 days"]),
    ("c_uuid", "uuid", ["a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"]),
    ("c_json", "json", ['{"a": null}', "null"]),
    ("c_jsonb", "jsonb", ['{"a": [1, null]}', "null"]),
    ("c_xml", "xml", ["<a>1</a>"]),
    ("c_inet", "inet", ["10.0.0.1", "::1/128"]),
    ("c_cidr", "cidr", ["10.0.0.0/8"]),
    ("c_macaddr", "macaddr", ["08:00:2b:01:02:03"]),
    ("c_bit", "bit(3)", ["101"]),
    ("c_varbit", "varbit", ["1", ""]),
    ("c_pg_lsn", "pg_lsn", ["0/16B3748"]),
    ("c_point", "point", ["(1,2)"]),
    ("c_tsvector", "tsvector", ["a:1 b:2"]),
    ("c_int4range", "int4range", ["[1,10)", "empty"]),
    ("c_enum", "mood", ["happy"]),
    ("c_domain", "posint", ["5"]),
    ("c_composite", "pair", ['(1,"x y")', "(,)"]),
    ("c_range", "floatrange", ["[1.5,2.5)"]),
    ("c_int4_array", "int4[]", ["{1,NULL}", "{}", "{{1,2},{3,4}}", "[0:1]={1,2}"]),
    ("c_text_array", "text[]", ['{"a b",NULL,"\\"q\\"",""}', "{}"]),
    ("c_date_array", "date[]", ["{2024-01-01}", "{2024-01-01,infinity}"]),
    ("c_numeric_array", "numeric(10,2)[]", ["{1.50,NULL}", "{NaN}"]),
    ("c_time_array", "time[]", ["{24:00:00,12:00:00.25}"]),
    ("c_enum_array", "mood[]", ["{happy,sad}"]),
]
COLUMNS = {name: pg_type for name, pg_type, _ in CASES}
ROWS = max(len(samples) for _, _, samples in CASES)


def _insert(dsn: str, first_id: int) -> None:
    """One row per sample index (a column with fewer samples is NULL there), then an all-NULL row."""
    conn = psycopg2.connect(dsn)
    with conn, conn.cursor() as cur:
        names = sql.SQL(", ").join(sql.Identifier(n) for n in ("id", *COLUMNS))
        marks = sql.SQL(", ").join([sql.Placeholder()] * (len(COLUMNS) + 1))
        statement = sql.SQL("INSERT INTO matrix ({}) VALUES ({})").format(names, marks)
        for i in range(ROWS + 1):
            cur.execute(statement, [first_id + i, *[s[i] if i < len(s) else None for _, _, s in CASES]])
    conn.close()


def _matrix(spark: SparkSession, lake: LakeConfig, arrow: dict[str, str], verdicts: dict[str, str]) -> str:
    table = load_table(open_catalog(lake), lake, "public", "matrix")
    assert table is not None
    iceberg = {f.name: str(f.field_type) for f in table.schema().fields}
    spark_types = {
        f.name: f.dataType.simpleString() for f in spark.table(f"{lake.catalog}.public.matrix").schema
    }
    read = read_table(lake, "public", "matrix").schema
    lines = [
        "| PostgreSQL | staged Arrow | Iceberg | Spark reads | pyiceberg reads | round trip | sibling |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, pg_type, _ in CASES:
        sibling = "yes" if sibling_name(name) in iceberg else ""
        cells = [
            f"`{pg_type}`", arrow[name], iceberg[name], spark_types[name], str(read.field(name).type),
            verdicts[name], sibling,
        ]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


@pytest.mark.timeout(900)
def test_type_matrix_matches_docs(
    spark: SparkSession, lake_config: LakeConfig, pg_cluster: PostgresCluster, pg_dbname: str, tmp_path: Path
) -> None:
    if not pg_cluster.has_xml:
        pytest.skip(XML_MISSING)
    dsn = pg_cluster.dsn(pg_dbname)
    pg_cluster.execute(USER_TYPES, pg_dbname)
    body = sql.SQL(", ").join(
        sql.SQL("{} {}").format(sql.Identifier(n), sql.SQL(t)) for n, t in COLUMNS.items()
    )
    pg_cluster.execute(sql.SQL("CREATE TABLE matrix (id int PRIMARY KEY, {})").format(body), pg_dbname)
    pg_cluster.execute("CREATE PUBLICATION matrix_pub FOR TABLE matrix", pg_dbname)
    _insert(dsn, 0)
    staging = str(tmp_path / "staging")
    path, manifest = take_snapshot(dsn, "matrix_slot", ["matrix_pub"], staging)
    apply_manifest(spark, path, lake_config)
    _insert(dsn, 100)  # the same values through the drain
    batch = drain_batch(dsn, DrainSettings("matrix_slot", ("matrix_pub",), staging))
    apply_manifest(spark, batch.manifest_uri, lake_config)

    arrow = {c.name: c.arrow_type for c in manifest.tables[0].columns}
    assert all(arrow[c.name] == c.arrow_type for c in batch.manifest.tables[0].columns if c.name in COLUMNS)
    verdicts = lake_vs_postgres(dsn, lake_config, "matrix", COLUMNS)
    assert {n: v.differences for n, v in verdicts.items() if v.differences} == {}
    generated = _matrix(spark, lake_config, arrow, {n: v.text for n, v in verdicts.items()})

    committed = DOC.read_text(encoding="utf-8")
    head, rest = committed.split(BEGIN + "\n", 1)
    _, tail = rest.split(END, 1)
    if os.environ.get(WRITE_ENV) == "1":
        DOC.write_text(head + BEGIN + "\n" + generated + END + tail, encoding="utf-8")
    else:
        assert rest.split(END, 1)[0] == generated, (
            f"docs/TYPES.md is stale: rerun this test with {WRITE_ENV}=1"
        )
