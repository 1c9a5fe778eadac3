"""Databases in other server encodings reach the lake as exact Unicode.

Every connection asks for ``client_encoding=UTF8``, so the server converts LATIN1, WIN1252 and
EUC_JP text, values and names alike, for the snapshot's COPY, the SQL peek and the stream. A
SQL_ASCII database cannot convert: its bytes are staged by the rule of ``raw_text.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg2
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from psycopg2 import sql

from airflow_provider_postgres_cdc.engine.drain import DrainSettings, drain_batch
from airflow_provider_postgres_cdc.engine.snapshot import SnapshotRun, jdbc_connection, take_snapshot
from airflow_provider_postgres_cdc.errors import NameEncodingError, PostgresCdcError
from airflow_provider_postgres_cdc.formats.manifest import Manifest
from airflow_provider_postgres_cdc.replication import check_prerequisites, connect, drop_slot
from airflow_provider_postgres_cdc.testing import PostgresCluster
from airflow_provider_postgres_cdc.values.raw_text import escape_bytes, raw_bytes

# Per encoding: schema, table and column names and text the encoding can hold.
SAMPLES = {
    # "Ã©" is the UTF-8 of "é" read as LATIN1: garbled silently if the bytes were not converted.
    "LATIN1": ("schéma", "tablé", "colonne_ø", ["café ÿ", "Ñandú", "Grüße «» Ã©"]),
    "WIN1252": ("schéma€", "tâble", "col_œ", ["€uro „quoted“", "Œuvre — ‰", "naïve…"]),
    "EUC_JP": ("スキーマ", "表", "列", ["日本語テキスト", "ｶﾀｶﾅ と ひらがな", "漢字①"]),
}
COLUMNS = ["id", "t", "v", "c", "j", "a"]


@pytest.fixture
def encoded_db(pg_cluster: PostgresCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh database in the encoding the test is parametrised with."""
    name = f"e_{uuid.uuid4().hex[:10]}"
    pg_cluster.execute(
        sql.SQL("CREATE DATABASE {} ENCODING {} LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0").format(
            sql.Identifier(name), sql.Literal(request.param)
        )
    )
    yield name
    pg_cluster.drop_database(name)


def utf8_connection(dsn: str) -> Any:
    conn = psycopg2.connect(dsn, options="-c client_encoding=UTF8")
    conn.autocommit = True
    return conn


def staged_rows(directory: str, manifest: Manifest, qualified: str) -> list[dict[str, Any]]:
    entry = next(e for e in manifest.tables if e.qualified == qualified)
    table = pa.concat_tables([pq.read_table(f"{directory}/{f}") for f in entry.files])
    return sorted(table.to_pylist(), key=lambda row: row["id"])


def snapshot_and_drains(
    dsn: str, staging: str, insert: Callable[[], None]
) -> Iterator[tuple[str, str, Manifest]]:
    """(path, directory, manifest) of the snapshot, then, after ``insert()``, of each drain transport."""
    path, manifest = take_snapshot(dsn, "enc", ["pub"], f"{staging}/snapshot")
    yield "snapshot", path.rsplit("/", 1)[0], manifest
    insert()
    for transport in ("peek", "stream"):
        settings = DrainSettings("enc", ("pub",), f"{staging}/{transport}", transport=transport)  # type: ignore[arg-type]
        result = drain_batch(dsn, settings)
        yield transport, result.batch_uri.removeprefix("file://"), result.manifest


@pytest.mark.integration
@pytest.mark.parametrize("encoded_db", list(SAMPLES), indirect=True)
def test_converted_encodings_stage_exact_unicode(
    pg_cluster: PostgresCluster, encoded_db: str, tmp_path: str
) -> None:
    encoding = pg_cluster.execute("SHOW server_encoding", encoded_db)[0][0]
    schema, table, column, texts = SAMPLES[encoding]
    dsn = pg_cluster.dsn(encoded_db)
    conn = utf8_connection(dsn)
    target = sql.Identifier(schema, table)
    with conn.cursor() as cur:
        cur.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        cur.execute(
            sql.SQL(
                "CREATE TABLE {} (id int PRIMARY KEY, t text, v varchar(40), c char(30), j json, a text[], "
                "{} text)"
            ).format(target, sql.Identifier(column))
        )
        cur.execute(sql.SQL("CREATE PUBLICATION pub FOR TABLE {}").format(target))

    def insert(first: int) -> None:
        with conn.cursor() as cur:
            for i, text in enumerate(texts, start=first):
                cur.execute(
                    sql.SQL("INSERT INTO {} VALUES (%s, %s, %s, %s, %s, %s, %s)").format(target),
                    (i, text, text, text, f'{{"{text}": ["{text}"]}}', [text, "x,y", text], text),
                )

    insert(1)
    with conn.cursor() as cur:
        cur.execute(
            sql.SQL("SELECT id, t, v, c, j::text, a, {} FROM {} ORDER BY id").format(
                sql.Identifier(column), target
            )
        )
        expected = [dict(zip([*COLUMNS, column], row, strict=True)) for row in cur.fetchall()]
    assert expected[0]["t"] == texts[0]
    for name, directory, manifest in snapshot_and_drains(dsn, str(tmp_path), lambda: insert(101)):
        rows = staged_rows(directory, manifest, f"{schema}.{table}")
        got = [{k: row[k] for k in [*COLUMNS, column]} for row in rows]
        if name != "snapshot":
            shifted = [{**row, "id": row["id"] + 100} for row in expected]
            assert got == shifted, name
        else:
            assert got == expected, name
    report = check_prerequisites(connect(dsn))
    assert (report.server_encoding, report.client_encoding) == (encoding, "UTF8")
    assert report.warnings() == []
    conn.close()


# Raw bytes a SQL_ASCII database holds: invalid UTF-8 (a LATIN1 é, a lone 0xff next to a
# backslash COPY escapes), valid UTF-8, and a valid character of the escape range.
RAW_VALUES = [b"caf\xe9", b"\xc3\xa9t\xc3\xa9 \xe2\x82\xac", b"x\\\xff\ty", "\U0010fe90!".encode()]


def cli(*args: str) -> str:
    """A ``pgcdc`` command's output, run as a user would."""
    result = subprocess.run(
        [sys.executable, "-m", "airflow_provider_postgres_cdc.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def literal(value: bytes) -> bytes:
    """A standard-conforming string literal of raw bytes (psycopg2 sends ``bytes`` as bytea)."""
    return b"'" + value.replace(b"'", b"''") + b"'"


@pytest.mark.integration
@pytest.mark.parametrize("encoded_db", ["SQL_ASCII"], indirect=True)
def test_sql_ascii_bytes_follow_the_documented_rule(
    pg_cluster: PostgresCluster, encoded_db: str, tmp_path: str
) -> None:
    dsn = pg_cluster.dsn(encoded_db)
    raw = psycopg2.connect(dsn, client_encoding="SQL_ASCII")
    raw.autocommit = True
    schema, table = "schéma".encode(), "tablé".encode()
    target = b'"' + schema + b'"."' + table + b'"'
    with raw.cursor() as cur:
        cur.execute(b'CREATE SCHEMA "' + schema + b'"')
        cur.execute(
            b"CREATE TABLE " + target + b" (id int PRIMARY KEY, t text, v varchar(40), j json, a text[])"
        )
        cur.execute(b"CREATE PUBLICATION pub FOR TABLE " + target)

    def insert(first: int) -> None:
        with raw.cursor() as cur:
            for i, value in enumerate(RAW_VALUES, start=first):
                text, json = (
                    literal(value),
                    literal(b'{"k": "' + value.replace(b"\\", b"\\\\").replace(b"\t", b"\\t") + b'"}'),
                )
                cur.execute(
                    b"INSERT INTO %s VALUES (%d, %s, %s, %s, ARRAY[%s, 'b'])"
                    % (target, i, text, text, json, text)
                )

    insert(1)
    for name, directory, manifest in snapshot_and_drains(dsn, str(tmp_path), lambda: insert(101)):
        rows = staged_rows(directory, manifest, "schéma.tablé")
        assert [row["t"] for row in rows] == [escape_bytes(v) for v in RAW_VALUES], name
        assert [raw_bytes(row["v"]) for row in rows] == RAW_VALUES, name
        assert [raw_bytes(row["a"][0]) for row in rows] == RAW_VALUES, name
        assert [row["a"][1] for row in rows] == ["b"] * len(RAW_VALUES), name
        assert raw_bytes(rows[0]["j"]) == b'{"k": "caf\xe9"}', name
        # Valid UTF-8 outside the escape range is exactly what Python's codec reads.
        assert rows[1]["t"] == RAW_VALUES[1].decode("utf-8") == "été €", name
    report = check_prerequisites(connect(dsn))
    assert report.server_encoding == "SQL_ASCII" and "U+10FE00" in report.warnings()[0]
    check = json.loads(cli("check", "--dsn", dsn, "--json"))
    assert (check["server_encoding"], check["client_encoding"]) == ("SQL_ASCII", "UTF8")
    assert "U+10FE00" in check["warnings"][0]
    # The peek command shows what is not UTF-8 replaced, instead of failing on it.
    assert "caf\ufffd" in cli(
        "peek", "--dsn", dsn, "--slot-name", "enc", "--publications", "pub"
    ).encode().decode("unicode_escape")
    conn = connect(dsn)
    drop_slot(conn, "enc")
    conn.close()
    raw.close()


@pytest.mark.integration
@pytest.mark.parametrize("encoded_db", ["SQL_ASCII"], indirect=True)
@pytest.mark.parametrize("transport", ["peek", "stream"])
def test_sql_ascii_name_that_is_not_utf8_is_refused_with_the_fix(
    pg_cluster: PostgresCluster, encoded_db: str, tmp_path: str, transport: str
) -> None:
    dsn = pg_cluster.dsn(encoded_db)
    raw = psycopg2.connect(dsn, client_encoding="SQL_ASCII")
    raw.autocommit = True
    with raw.cursor() as cur:
        cur.execute(b'CREATE TABLE "tabl\xe9" (id int PRIMARY KEY)')
        cur.execute(b'CREATE PUBLICATION pub FOR TABLE "tabl\xe9"')
        cur.execute(b"SELECT pg_create_logical_replication_slot('enc', 'pgoutput')")
        cur.execute(b'INSERT INTO "tabl\xe9" VALUES (1)')
    raw.close()
    settings = DrainSettings("enc", ("pub",), str(tmp_path), transport=transport)  # type: ignore[arg-type]
    with pytest.raises(NameEncodingError, match=r"0xe9.*Rename it to valid UTF-8"):
        drain_batch(dsn, settings)


@pytest.mark.integration
@pytest.mark.parametrize("encoded_db", ["SQL_ASCII"], indirect=True)
def test_spark_copy_engine_refuses_sql_ascii_before_submitting(
    pg_cluster: PostgresCluster, encoded_db: str, tmp_path: str
) -> None:
    pg_cluster.execute(
        "CREATE TABLE t (id int PRIMARY KEY, v text); CREATE PUBLICATION pub FOR TABLE t", encoded_db
    )
    url, properties, _ = jdbc_connection(pg_cluster.dsn(encoded_db))
    with (
        pytest.raises(PostgresCdcError, match=r"SQL_ASCII.*copy_engine='local'"),
        SnapshotRun(pg_cluster.dsn(encoded_db), "spark_enc", ["pub"], str(tmp_path)) as run,
    ):
        run.spark_job_spec(url, properties)
