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


class PostgresCdcPublishTablesOperator(BaseOperator):
    """Publish tables (with column lists and row filters) in the pipeline's publication, idempotently.

    The publication change commits before the task ends, so a re-snapshot that starts after it
    sees the new membership, and the pipeline's slot streams the tables' changes from that
    commit on: the re-snapshot's consistent point is later, so nothing falls between the two.
    Returns (XCom) every requested table as ``schema.table`` (those to re-snapshot); the log
    says which ones changed. Row filters are SQL from the DAG's author, never from data.

    :param publication: the publication to change. (templated)
    :param tables: ``"schema.table"`` names or ``{"table", "columns", "row_filter"}`` objects. (templated)
    :param postgres_conn_id: Airflow connection of the source database. (templated)
    """

    template_fields: Sequence[str] = ("publication", "tables", "postgres_conn_id")

    def __init__(
        self,
        *,
        publication: str,
        tables: Sequence[str | Mapping[str, Any]],
        postgres_conn_id: str = PostgresCdcHook.default_conn_name,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.publication = publication
        self.tables = tables
        self.postgres_conn_id = postgres_conn_id

    def execute(self, context: Context) -> list[str]:
        specs = [table_spec(entry) for entry in self.tables or ()]
        if not specs:
            self.log.info("no table to publish")
            return []
        changed = self._get_hook().publish_tables(self.publication, specs)
        self.log.info(
            "publication %s: %s changed, %s already published as asked",
            self.publication, changed or "none",
            [s.qualified for s in specs if s.qualified not in changed] or "none",
        )  # fmt: skip
        return [spec.qualified for spec in specs]

    def _get_hook(self) -> PostgresCdcHook:
        return PostgresCdcHook(self.postgres_conn_id)
