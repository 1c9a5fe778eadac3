"""The ``_manifest.json`` of a staged snapshot or change batch (docs/FORMATS.md, format version 1).

A manifest is written last, so its presence is what makes a staged directory complete; the
Spark apply job reads the same JSON without importing this module, so every field here is
defined on that page and changes there first.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from airflow_provider_postgres_cdc.errors import ManifestFormatError
from airflow_provider_postgres_cdc.formats.layout import table_dir_name
from airflow_provider_postgres_cdc.formats.lsn import Lsn
from airflow_provider_postgres_cdc.formats.schema_changes import CatalogFacts, RelationVersion

FORMAT_VERSION = 1

Kind = Literal["snapshot", "batch"]
ReplicaIdentity = Literal["d", "f", "i", "n"]

SIBLING_SUFFIX = "__pgl_text"
"""Reserved ending of overflow sibling columns (docs/TYPES.md): defined here, where the job reads it too."""


def sibling_name(column: str) -> str:
    """The sibling column of ``column``: its exact text where the typed value is NULL by overflow."""
    return column + SIBLING_SUFFIX


def is_sibling(name: str) -> bool:
    """Whether a staged column is an overflow sibling rather than a source column."""
    return name.endswith(SIBLING_SUFFIX)


def utc_now() -> str:
    """Now, as manifests write times (ISO 8601, UTC, microseconds)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _require(data: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in data:
        raise ManifestFormatError(f"manifest {where} lacks {key!r}")
    return data[key]


@dataclass(frozen=True, slots=True)
class ColumnManifest:
    """One staged column: its PostgreSQL type (name, OID, typmod) and the Arrow type it is stored as."""

    name: str
    pg_type: str
    type_oid: int
    typmod: int
    arrow_type: str
    key: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "pg_type": self.pg_type,
            "type_oid": self.type_oid,
            "typmod": self.typmod,
            "arrow_type": self.arrow_type,
            "key": self.key,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ColumnManifest:
        where = "column"
        return cls(
            name=str(_require(data, "name", where)),
            pg_type=str(_require(data, "pg_type", where)),
            type_oid=int(_require(data, "type_oid", where)),
            typmod=int(_require(data, "typmod", where)),
            arrow_type=str(_require(data, "arrow_type", where)),
            key=bool(data.get("key", False)),
        )


@dataclass(frozen=True, slots=True)
class TableManifest:
    """One table's staged files, columns, keys and the filter/column list that selected its rows.

    ``files`` are relative to the batch directory. ``row_filter`` is ``None`` when every row is
    published; ``column_list`` is ``None`` when every column is.
    """

    schema: str
    table: str
    columns: tuple[ColumnManifest, ...]
    key_columns: tuple[str, ...]
    replica_identity: ReplicaIdentity
    rows: int
    files: tuple[str, ...]
    row_filter: str | None = None
    column_list: tuple[str, ...] | None = None
    warnings: tuple[str, ...] = ()
    # Batches: each relation version's columns and files, and the catalog facts of the columns at
    # drain time (schema_changes.py); absent in older manifests.
    versions: tuple[RelationVersion, ...] = ()
    catalog: CatalogFacts | None = None
    # What the staged values were transformed by (formats/column_transforms.py); empty: nothing.
    column_transforms: str = ""

    @property
    def path(self) -> str:
        return table_dir_name(self.schema, self.table)

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.table}"

    @property
    def counts_rows(self) -> bool:
        """Whether the table is a multiset (no key, or REPLICA IDENTITY FULL): the rows themselves count.

        A FULL table with a primary key is one too: the stream carries no key for it, and its
        multiset simply never holds a duplicate.
        """
        return self.replica_identity in ("f", "n") or not self.key_columns

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": self.schema,
            "table": self.table,
            "path": self.path,
            "columns": [column.to_dict() for column in self.columns],
            "key_columns": list(self.key_columns),
            "replica_identity": self.replica_identity,
            "rows": self.rows,
            "files": list(self.files),
            "row_filter": self.row_filter,
            "column_list": None if self.column_list is None else list(self.column_list),
            "warnings": list(self.warnings),
            **({"versions": [v.to_dict() for v in self.versions]} if self.versions else {}),
            **({"catalog": self.catalog.to_dict()} if self.catalog is not None else {}),
            **({"column_transforms": self.column_transforms} if self.column_transforms else {}),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TableManifest:
        where = "table"
        identity = str(_require(data, "replica_identity", where))
        if identity not in ("d", "f", "i", "n"):
            raise ManifestFormatError(f"replica_identity must be one of d, f, i, n, not {identity!r}")
        column_list = data.get("column_list")
        return cls(
            schema=str(_require(data, "schema", where)),
            table=str(_require(data, "table", where)),
            columns=tuple(ColumnManifest.from_dict(c) for c in _require(data, "columns", where)),
            key_columns=tuple(str(c) for c in _require(data, "key_columns", where)),
            replica_identity=identity,  # type: ignore[arg-type]
            rows=int(_require(data, "rows", where)),
            files=tuple(str(f) for f in _require(data, "files", where)),
            row_filter=data.get("row_filter"),
            column_list=None if column_list is None else tuple(str(c) for c in column_list),
            warnings=tuple(str(w) for w in data.get("warnings", ())),
            versions=tuple(RelationVersion.from_dict(v) for v in data.get("versions") or ()),
            catalog=None if data.get("catalog") is None else CatalogFacts.from_dict(data["catalog"]),
            column_transforms=str(data.get("column_transforms") or ""),
        )


# A batch of up to this many changes (a snapshot: rows) makes a short Spark job. In a fresh JVM,
# compiling costs more than it saves there: the job's queries are interpreted rather than compiled
# to Java (spark/table_runs.py), and its driver JVM compiles with C1 only (operators/spark_apply.py).
SHORT_JOB_ROWS = 100_000


@dataclass(frozen=True, slots=True)
class ManifestStats:
    """Totals of a batch (``changes``/``transactions`` are 0 for a snapshot, which has rows instead).

    ``newest_commit_time`` is the commit time of the batch's last transaction (ISO 8601, UTC), the
    start of its end-to-end latency; ``None`` for a snapshot or a batch with no transaction.
    ``full`` says the batch stopped at its ``max_messages`` or ``max_bytes`` bound before the WAL
    the drain found, so the slot holds more than this batch (a CDC run catches up on it).
    """

    changes: int = 0
    transactions: int = 0
    bytes: int = 0
    seconds: float = 0.0
    newest_commit_time: str | None = None
    full: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "changes": self.changes,
            "transactions": self.transactions,
            "bytes": self.bytes,
            "seconds": self.seconds,
            "newest_commit_time": self.newest_commit_time,
            "full": self.full,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ManifestStats:
        newest = data.get("newest_commit_time")
        return cls(
            changes=int(data.get("changes", 0)),
            transactions=int(data.get("transactions", 0)),
            bytes=int(data.get("bytes", 0)),
            seconds=float(data.get("seconds", 0.0)),
            newest_commit_time=None if newest is None else str(newest),
            full=bool(data.get("full", False)),
        )


@dataclass(frozen=True, slots=True)
class Manifest:
    """A staged snapshot (``kind="snapshot"``) or drained change batch (``kind="batch"``).

    For a snapshot ``start_lsn == end_lsn ==`` the slot's consistent point and
    ``snapshot_name`` is the exported snapshot the copy read; for a batch they are the LSN
    window and ``snapshot_name`` is ``None``. ``snapshot_slot`` names the slot that exported
    the snapshot: ``slot`` itself for an initial snapshot, a temporary slot for a re-snapshot
    (whose ``slot`` is the pipeline's slot, the stream it continues); ``snapshot_taken_at`` when
    that slot was created.
    """

    kind: Kind
    slot: str
    database: str
    batch_id: str
    start_lsn: Lsn
    end_lsn: Lsn
    tables: tuple[TableManifest, ...]
    snapshot_name: str | None = None
    snapshot_slot: str | None = None
    created_at: str = field(default_factory=utc_now)
    stats: ManifestStats = field(default_factory=ManifestStats)
    format_version: int = FORMAT_VERSION
    snapshot_taken_at: str | None = None

    @property
    def consistent_time(self) -> str:
        """When the source was as a snapshot holds it: the time its slot was created (every
        transaction it holds committed before), or, for a manifest that lacks it, when it was
        written."""
        return self.snapshot_taken_at or self.created_at

    def table(self, schema: str, table: str) -> TableManifest:
        """The entry of one table; ``KeyError`` when the manifest has none."""
        for entry in self.tables:
            if entry.schema == schema and entry.table == table:
                return entry
        raise KeyError(f"{schema}.{table} is not in manifest {self.batch_id}")

    @property
    def total_rows(self) -> int:
        return sum(entry.rows for entry in self.tables)

    @property
    def short_job(self) -> bool:
        """Whether a Spark job of this manifest is short (see :data:`SHORT_JOB_ROWS`)."""
        return self.total_rows <= SHORT_JOB_ROWS

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "format_version": self.format_version,
            "kind": self.kind,
            "slot": self.slot,
            "database": self.database,
            "batch_id": self.batch_id,
            "start_lsn": str(self.start_lsn),
            "end_lsn": str(self.end_lsn),
        }
        if self.kind == "snapshot":
            data["snapshot_name"] = self.snapshot_name
            if self.snapshot_slot is not None:
                data["snapshot_slot"] = self.snapshot_slot
            if self.snapshot_taken_at is not None:
                data["snapshot_taken_at"] = self.snapshot_taken_at
        data["created_at"] = self.created_at
        data["tables"] = [entry.to_dict() for entry in self.tables]
        data["stats"] = self.stats.to_dict()
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, ensure_ascii=False) + "\n"

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Manifest:
        where = "document"
        version = _require(data, "format_version", where)
        if version != FORMAT_VERSION:
            raise ManifestFormatError(
                f"manifest format_version {version!r} is not supported (this package reads {FORMAT_VERSION})"
            )
        kind = _require(data, "kind", where)
        if kind not in ("snapshot", "batch"):
            raise ManifestFormatError(f"manifest kind must be 'snapshot' or 'batch', not {kind!r}")
        try:
            start_lsn = Lsn.parse(str(_require(data, "start_lsn", where)))
            end_lsn = Lsn.parse(str(_require(data, "end_lsn", where)))
        except ValueError as exc:
            raise ManifestFormatError(str(exc)) from exc
        return cls(
            kind=kind,
            slot=str(_require(data, "slot", where)),
            database=str(_require(data, "database", where)),
            batch_id=str(_require(data, "batch_id", where)),
            start_lsn=start_lsn,
            end_lsn=end_lsn,
            tables=tuple(TableManifest.from_dict(t) for t in _require(data, "tables", where)),
            snapshot_name=data.get("snapshot_name"),
            snapshot_slot=data.get("snapshot_slot"),
            snapshot_taken_at=data.get("snapshot_taken_at"),
            created_at=str(_require(data, "created_at", where)),
            stats=ManifestStats.from_dict(data.get("stats") or {}),
            format_version=FORMAT_VERSION,
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> Manifest:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ManifestFormatError(f"manifest is not valid JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise ManifestFormatError("manifest JSON must be an object")
        return cls.from_dict(data)
