"""Lake values checked by PostgreSQL itself: each must print as the source value's ``::text``.

A lake value is its overflow sibling's text when the sibling is set (the typed column must then
be NULL), else the typed value, sent back to the server and cast to the column's type and then
to text. Shared by the overflow tests and the type matrix (docs/TYPES.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import psycopg2
from psycopg2 import sql

from airflow_provider_postgres_cdc.engine.lake_catalog import read_table
from airflow_provider_postgres_cdc.formats.lake import LakeConfig
from airflow_provider_postgres_cdc.formats.manifest import sibling_name


@dataclass
class Verdict:
    """One column's round trip: values equal as typed, equal via the sibling, and the differences."""

    typed: int = 0
    via_sibling: int = 0
    nulls: int = 0
    differences: list[tuple[int, object, str | None]] = field(default_factory=list)

    @property
    def text(self) -> str:
        if self.differences:
            return f"DIFFERS ({len(self.differences)} values)"
        total = self.typed + self.via_sibling
        if self.via_sibling:
            return f"equal ({self.via_sibling} of {total} via sibling)"
        return f"equal ({total} values)"


def lake_vs_postgres(dsn: str, lake: LakeConfig, table: str, columns: dict[str, str]) -> dict[str, Verdict]:
    """Per column (name -> PostgreSQL type): how every lake row's value compares with the source's."""
    lake_rows = {row["id"]: row for row in read_table(lake, "public", table).to_pylist()}
    verdicts = {name: Verdict() for name in columns}
    conn = psycopg2.connect(dsn)
    with conn, conn.cursor() as cur:
        cur.execute("SET TIME ZONE 'UTC'")
        texts = sql.SQL(", ").join(sql.SQL("{}::text").format(sql.Identifier(c)) for c in columns)
        cur.execute(sql.SQL("SELECT id, {} FROM {} ORDER BY id").format(texts, sql.Identifier(table)))
        source = {row[0]: row[1:] for row in cur.fetchall()}
        assert sorted(source) == sorted(lake_rows), "the lake holds other rows than the source"
        casts = sql.SQL(", ").join(sql.SQL("(%s)::{}::text").format(sql.SQL(t)) for t in columns.values())
        for key, source_texts in source.items():
            row = lake_rows[key]
            typed = [row[c] for c in columns]
            # Floats as their repr text: psycopg2's bare literal -0.0 would be parsed as numeric 0.
            sent = [repr(v) if isinstance(v, float) else v for v in typed]
            cur.execute(sql.SQL("SELECT {}").format(casts), sent)
            (cast_back,) = cur.fetchall()
            for name, text, value, back in zip(columns, source_texts, typed, cast_back, strict=True):
                verdict = verdicts[name]
                sibling = row.get(sibling_name(name))
                if sibling is not None:
                    if value is None and sibling == text:
                        verdict.via_sibling += 1
                    else:
                        verdict.differences.append((key, (value, sibling), text))
                elif back != text:
                    verdict.differences.append((key, value, text))
                elif text is None:
                    verdict.nulls += 1
                else:
                    verdict.typed += 1
    conn.close()
    return verdicts
