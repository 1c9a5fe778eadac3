"""What a drain is asked to do (:class:`DrainSettings`) and what it hands back (:class:`DrainResult`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from airflow_provider_postgres_cdc.engine.choices import Transport
from airflow_provider_postgres_cdc.engine.column_hashing import ColumnTransformer
from airflow_provider_postgres_cdc.engine.object_store import S3Options
from airflow_provider_postgres_cdc.engine.sequencing import DEFAULT_MAX_MEMORY_BYTES
from airflow_provider_postgres_cdc.formats.lake import LakeConfig
from airflow_provider_postgres_cdc.formats.manifest import Manifest

MIN_MEMORY_BYTES = 32 << 20


@dataclass(frozen=True, slots=True)
class DrainSettings:
    """What to drain and how.

    :param slot: the replication slot (pgoutput).
    :param publications: publication names passed to pgoutput.
    :param staging: staging root (local path, ``file://``, ``s3://``, ``gs://``, ``hdfs://``).
    :param transport: ``"peek"`` (SQL interface, the default: several times faster for
        batches; it reads a temporary copy of the slot in a few calls, see
        ``replication/peek_calls.py``) or ``"stream"`` (``START_REPLICATION`` protocol 2 with
        ``streaming on``).
    :param streaming: the stream transport's ``streaming`` mode: ``"on"`` (protocol 2) or
        ``"parallel"`` (protocol 4, PostgreSQL 16+; its Stream Abort carries the abort's LSN and
        time). Either way in-progress transactions count only at their commit.
    :param max_messages: stop at the first commit after this many pgoutput messages.
    :param max_bytes: bound the WAL window read to this many bytes after the start.
    :param max_memory_bytes: the drain's memory budget, whatever the transaction sizes (default
        512 MiB; at least 32 MiB). Transactions not yet committed are kept in memory up to an
        eighth of it and spilled to ``spill_dir`` beyond; committed ones are decoded and staged
        in pieces of a 48th of it. Peak RSS stays under this plus the interpreter's fixed
        overhead (``benchmarks/big_transaction.py`` measures both).
    :param spill_dir: where spill files go (``$TMPDIR`` or ``/tmp`` by default); they are
        unlinked as soon as created, so nothing is left behind even by a killed drain.
    :param chunk_bytes: transport chunk size (default: a 48th of ``max_memory_bytes``).
    :param chunk_messages: the stream also yields a chunk after this many messages.
    :param staging_options: endpoint and credentials of an ``s3://`` staging store (default: pyarrow's
        environment chain); the store is checked before the slot is read.
    :param lake: the lake the batch is for: every published table's lake names are checked against
        its name rule (:meth:`LakeConfig.check_names`) before anything is staged; None checks nothing.
    :param transforms: columns hashed or dropped before anything of them is staged
        (``engine/column_hashing.py``); their names are checked against the publications first.
    """

    slot: str
    publications: tuple[str, ...]
    staging: str
    transport: Transport = "peek"
    streaming: Literal["on", "parallel"] = "on"
    max_messages: int | None = 1_000_000
    max_bytes: int | None = None
    max_memory_bytes: int = DEFAULT_MAX_MEMORY_BYTES
    spill_dir: str | None = None
    chunk_bytes: int | None = None
    chunk_messages: int = 100_000
    max_rows_per_batch: int = 65_536
    progress_seconds: float = 5.0
    staging_options: S3Options | None = None
    lake: LakeConfig | None = None
    transforms: ColumnTransformer | None = None

    def __post_init__(self) -> None:
        if self.max_memory_bytes < MIN_MEMORY_BYTES:
            raise ValueError(
                f"max_memory_bytes={self.max_memory_bytes} is too small: give the drain at least 32 MiB"
            )
        if self.max_messages is not None and self.max_messages < 1:
            raise ValueError(f"max_messages={self.max_messages}: use at least 1, or None for no limit")


@dataclass(frozen=True, slots=True)
class DrainResult:
    """The staged batch: its manifest, where it is, and whether an earlier attempt made it."""

    manifest: Manifest
    manifest_uri: str
    batch_uri: str
    reused: bool

    def summary(self) -> dict[str, Any]:
        """Small JSON for XCom: where the manifest is and what the batch holds."""
        return {
            "manifest": self.manifest_uri,
            "batch_uri": self.batch_uri,
            "slot": self.manifest.slot,
            "batch_id": self.manifest.batch_id,
            "start_lsn": str(self.manifest.start_lsn),
            "end_lsn": str(self.manifest.end_lsn),
            "changes": self.manifest.stats.changes,
            "transactions": self.manifest.stats.transactions,
            "tables": {t.qualified: t.rows for t in self.manifest.tables},
            "reused": self.reused,
            "seconds": self.manifest.stats.seconds,
            "newest_commit_time": self.manifest.stats.newest_commit_time,
            "full": self.manifest.stats.full,
        }
