"""pgoutput's text and binary routes stage the same typed values and overflow siblings.

Values come from a live server: the same changes are peeked once as text and once with the
``binary`` option, decoded by the columnar decoder, and must give equal tables whose sibling
texts, and ``time`` texts, are the server's own ``::text`` of each value.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from airflow_provider_postgres_cdc.formats.manifest import sibling_name
from airflow_provider_postgres_cdc.pgoutput.columnar import BatchDecoder
from airflow_provider_postgres_cdc.testing import PostgresCluster

pytestmark = pytest.mark.integration

COLUMNS = ("d", "ts", "tstz", "n", "t")
SCHEMA = """
CREATE TABLE v (id int PRIMARY KEY, d date, ts timestamp, tstz timestamptz, n numeric(10,2), t time);
CREATE PUBLICATION pub FOR TABLE v;
"""
ROWS = """
INSERT INTO v VALUES
 (1, '2024-02-29', '2024-01-02 03:04:05.5', '2024-01-02 03:04:05.123456+00', 12.34, '12:34:56.5'),
 (2, 'infinity', '-infinity', 'infinity', 'NaN', '24:00:00'),
 (3, '-infinity', '0044-03-15 01:02:03 BC', '10000-01-01 00:00:00+00', NULL, '00:00:00'),
 (4, '0044-03-15 BC', '10000-01-01', '0044-03-15 12:00:00.25+00 BC', -0.5, '23:59:59.999999'),
 (5, '10000-01-01', 'infinity', '-infinity', NULL, NULL),
 (6, '0001-01-01', '0001-01-01 00:00:00', '9999-12-31 23:59:59.999999+00', NULL, '00:00:00.000001');
UPDATE v SET d = '2024-01-01', t = '01:00:00' WHERE id = 2;
UPDATE v SET d = 'infinity' WHERE id = 1;
"""


def _decoded(pg: PostgresCluster, db: str, binary: bool) -> tuple[pa.Table, list[bytes]]:
    options = ", 'binary', 'true'" if binary else ""
    rows = pg.execute(
        "SELECT data FROM pg_logical_slot_peek_binary_changes('s', NULL, NULL, 'proto_version', '1',"
        f" 'publication_names', 'pub'{options})",
        db,
    )
    messages = [bytes(r[0]) for r in rows]
    (table,) = BatchDecoder().decode(messages).tables
    return table.to_table(), messages


def test_text_and_binary_routes_stage_postgresql_text_for_what_does_not_fit(
    pg_cluster: PostgresCluster, pg_dbname: str
) -> None:
    db = pg_dbname
    pg_cluster.execute(SCHEMA, db)
    pg_cluster.execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput')", db)
    pg_cluster.execute(ROWS, db)
    (text, text_messages), (binary, binary_messages) = (
        _decoded(pg_cluster, db, False),
        _decoded(pg_cluster, db, True),
    )
    assert text_messages != binary_messages  # the server did send the binary format
    assert text.schema.names == binary.schema.names
    assert text.drop(["_pgl_commit_time"]).equals(binary.drop(["_pgl_commit_time"]))
    assert {sibling_name(c) for c in ("d", "ts", "tstz", "n")} <= set(text.schema.names)
    assert sibling_name("t") not in text.schema.names and text.schema.field("t").type == pa.string()
    expected = pg_cluster.execute(
        "SET TIME ZONE 'UTC'; SELECT d::text, ts::text, tstz::text, n::text, t::text FROM v ORDER BY id", db
    )
    staged = {row["id"]: row for row in text.to_pylist()}  # the last change of each row is its state
    for (row_id, *_), source in zip(
        pg_cluster.execute("SELECT id FROM v ORDER BY id", db), expected, strict=True
    ):
        row = staged[row_id]
        for name, value in zip(COLUMNS, source, strict=True):
            if name == "t":
                assert row["t"] == value
            elif row.get(sibling_name(name)) is not None:
                assert row[name] is None and row[sibling_name(name)] == value, (row_id, name)
            else:
                assert (row[name] is None) == (value is None), (row_id, name)
    assert staged[2][sibling_name("d")] is None and staged[1][sibling_name("d")] == "infinity"
