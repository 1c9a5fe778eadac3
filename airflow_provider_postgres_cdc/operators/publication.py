"""``PostgresCdcPublishTablesOperator``: add tables to a running pipeline's publication."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from airflow.sdk import BaseOperator, Context

from airflow_provider_postgres_cdc.hooks.postgres import PostgresCdcHook
from airflow_provider_postgres_cdc.replication import TableSpec


def table_spec(entry: str | Mapping[str, Any]) -> TableSpec:
    """A table as ``"schema.table"`` or ``{"table": "s.t", "columns": [...], "row_filter": "..."}``."""
    if isinstance(entry, str):
        return TableSpec.parse(entry)
    unknown = set(entry) - {"table", "columns", "row_filter"}
    if "table" not in entry or unknown:
        raise ValueError(
            f"a table to publish is 'schema.table' or an object with 'table' and optional 'columns' and "
            f"'row_filter'; got {dict(entry)!r}"
        )
    columns = entry.get("columns")
    return TableSpec.parse(
        str(entry["table"]), columns=tuple(columns) if columns else None, row_filter=entry.get("row_filter")
    )


def first_publication(publications: str | Sequence[str]) -> str:
    """The publication new tables go to: the first of the pipeline's (one name is a list of one)."""
    names = [publications] if isinstance(publications, str) else list(publications)
    if not names or not names[0]:
        raise ValueError("publications must name a publication (of several, the tables go to the first)")
    return names[0]


class PostgresCdcPublishTablesOperator(BaseOperator):
    """Publish tables (with column lists and row filters) in the pipeline's publication, idempotently.

    The publication change commits before the task ends, so a re-snapshot that starts after it
    sees the new membership, and the pipeline's slot streams the tables' changes from that
    commit on: the re-snapshot's consistent point is later, so nothing falls between the two.
    Returns (XCom) every requested table as ``schema.table`` (those to re-snapshot); the log
    says which ones changed. Row filters are SQL from the DAG's author, never from data.

    :param publications: the pipeline's publication name or names, as the drain and the snapshot
        take them; the tables are added to the first one (a pipeline reading several publications
        gets new tables in its first). (templated)
    :param tables: ``"schema.table"`` names or ``{"table", "columns", "row_filter"}`` objects. (templated)
    :param postgres_conn_id: Airflow connection of the source database. (templated)
    """

    template_fields: Sequence[str] = ("publications", "tables", "postgres_conn_id")

    def __init__(
        self,
        *,
        publications: str | Sequence[str],
        tables: Sequence[str | Mapping[str, Any]],
        postgres_conn_id: str = PostgresCdcHook.default_conn_name,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.publications = publications
        self.tables = tables
        self.postgres_conn_id = postgres_conn_id

    def execute(self, context: Context) -> list[str]:
        specs = [table_spec(entry) for entry in self.tables or ()]
        if not specs:
            self.log.info("no table to publish")
            return []
        publication = first_publication(self.publications)
        changed = self._get_hook().publish_tables(publication, specs)
        self.log.info(
            "publication %s: %s changed, %s already published as asked",
            publication, changed or "none",
            [s.qualified for s in specs if s.qualified not in changed] or "none",
        )  # fmt: skip
        return [spec.qualified for spec in specs]

    def _get_hook(self) -> PostgresCdcHook:
        return PostgresCdcHook(self.postgres_conn_id)
