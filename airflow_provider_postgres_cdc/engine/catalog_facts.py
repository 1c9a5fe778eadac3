"""Catalog facts a batch's schema changes need, read by the drain (schema_changes.py explains the rule).

For each table of a batch: which current columns PostgreSQL keeps a *missing value* for (the value
rows older than an ``ADD COLUMN ... DEFAULT <constant>`` read, ``pg_attribute.attmissingval``) and
which have a default of any kind. The missing values are staged as one Parquet row typed like the
table's changes, so the apply job fills them into older rows with the drain's own text decoding.
"""

from __future__ import annotations

import dataclasses
import logging
import posixpath
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from airflow_provider_postgres_cdc.engine.column_hashing import ColumnTransformer
from airflow_provider_postgres_cdc.engine.staging import PartFileWriter, StagingLocation
from airflow_provider_postgres_cdc.errors import PostgresCdcError
from airflow_provider_postgres_cdc.formats.layout import MISSING_VALUES_PREFIX
from airflow_provider_postgres_cdc.formats.manifest import TableManifest
from airflow_provider_postgres_cdc.formats.schema_changes import CatalogFacts, ColumnFacts
from airflow_provider_postgres_cdc.values.arrow_types import text_to_arrow

log = logging.getLogger(__name__)


# attmissingval is a one-element anyarray of the column's type; its text re-read as text[] gives
# the element's text form. A default of any kind: the column's own, an identity, a domain's.
# A partitioned table stores no rows: its partitions keep the missing values (by column name, as
# their column numbers may differ), and a value counts only when every partition keeps the same.
_FACTS_SQL = """
WITH missing AS (
    SELECT a.attrelid, a.attname, a.atthasmissing AS has,
           CASE WHEN a.atthasmissing THEN (a.attmissingval::text::text[])[1] END AS value
    FROM pg_attribute a
    WHERE a.attnum > 0 AND NOT a.attisdropped
)
SELECT a.attname::text,
       coalesce(p.has, m.has),
       CASE WHEN coalesce(p.has, m.has) THEN coalesce(p.value, m.value) END,
       a.atthasdef OR a.attidentity <> '' OR t.typdefaultbin IS NOT NULL OR t.typdefault IS NOT NULL
FROM pg_attribute a
JOIN pg_class c ON c.oid = a.attrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_type t ON t.oid = a.atttypid
JOIN missing m ON m.attrelid = a.attrelid AND m.attname = a.attname
LEFT JOIN LATERAL (
    SELECT bool_and(l.has) AND count(DISTINCT l.value) = 1 AS has, min(l.value) AS value
    FROM pg_partition_tree(c.oid) tree
    JOIN missing l ON l.attrelid = tree.relid AND l.attname = a.attname
    WHERE tree.isleaf
    HAVING count(*) > 0
) p ON c.relkind = 'p'
WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0 AND NOT a.attisdropped
"""


def read_facts(conn: Any, schema: str, table: str) -> dict[str, ColumnFacts]:
    """The catalog facts of the table's current columns (empty when the table is gone).

    ``conn`` is the drain's autocommit connection: the read holds no snapshot afterwards.
    """
    with conn.cursor() as cur:
        cur.execute(_FACTS_SQL, (schema, table))
        rows = cur.fetchall()
    return {
        name: ColumnFacts(bool(has_missing), bool(has_default), missing)
        for name, has_missing, missing, has_default in rows
    }


def _typed_missing(spec: TableManifest, facts: dict[str, ColumnFacts]) -> pa.Table | None:
    """One row of the missing values, typed as the newest relation version announces each column.

    A value the staged type cannot hold is recorded as unknowable (default without a missing
    value), so the apply job asks for a re-snapshot rather than filling something else.
    """
    last = {c.name: c for c in spec.versions[-1].columns} if spec.versions else {}
    arrays, fields = [], []
    for name, column in list(facts.items()):
        if not column.has_missing or column.missing is None or name not in last:
            continue
        source = last[name]
        try:
            value = text_to_arrow(pa.array([column.missing], pa.string()), source.type_oid, source.typmod)
        except (PostgresCdcError, pa.ArrowException) as exc:
            log.warning("%s: missing value of %r cannot be staged (%s)", spec.qualified, name, exc)
            facts[name] = ColumnFacts(has_missing=False, has_default=True, missing=column.missing)
            continue
        arrays.append(value)
        fields.append(pa.field(name, value.type))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields)) if arrays else None


def record_catalog_facts(
    conn: Any,
    location: StagingLocation,
    batch_dir: str,
    tables: Sequence[TableManifest],
    transforms: ColumnTransformer | None = None,
) -> list[TableManifest]:
    """``tables`` with their catalog facts, the missing values staged beside their changes; under
    ``transforms``, without dropped columns, hashed ones' missing values hashed, and recorded."""
    out = []
    for spec in tables:
        facts = read_facts(conn, spec.schema, spec.table)
        if transforms is not None:
            facts = transforms.facts(spec.qualified, facts)
            spec = transforms.recorded(spec)
        row = _typed_missing(spec, facts)
        missing_file = None
        if row is not None:
            writer = PartFileWriter(
                location, posixpath.join(batch_dir, spec.path), row.schema, prefix=MISSING_VALUES_PREFIX
            )
            writer.write_all(row.to_batches())
            writer.close()
            missing_file = writer.files[0][len(batch_dir.rstrip("/")) + 1 :]
        out.append(dataclasses.replace(spec, catalog=CatalogFacts(facts, missing_file)))
    return out
