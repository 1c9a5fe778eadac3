"""Staging storage through ``pyarrow.fs``: local paths, ``file://``, ``s3://``, ``gs://``, ``hdfs://``.

Layout and completeness rule (docs/FORMATS.md): ``<staging>/<slot>/<batch id>/<schema>.<table>/
part-*.parquet`` plus ``_manifest.json``, written last. A directory without its manifest is
incomplete and is deleted and redone, never read.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from airflow_provider_postgres_cdc.engine.object_store import S3Options, check_access
from airflow_provider_postgres_cdc.errors import StagingAccessError
from airflow_provider_postgres_cdc.formats.layout import (
    MANIFEST_NAME,
    SLOT_CREATED_NAME,
    batch_path,
    part_file_name,
)
from airflow_provider_postgres_cdc.formats.lsn import Lsn
from airflow_provider_postgres_cdc.formats.manifest import Manifest

DEFAULT_MAX_FILE_BYTES = 128 * 1024 * 1024
# Object stores replace an object in one PUT, so writing the manifest in place is atomic there;
# file systems get a temporary name and a rename.
_RENAME_ATOMIC = ("local", "hdfs")


@dataclass(frozen=True, slots=True)
class StagingLocation:
    """A staging root: the file system, the root path inside it, and the URI it came from."""

    filesystem: pafs.FileSystem
    root: str
    uri: str
    s3: S3Options | None = None

    @classmethod
    def resolve(cls, uri: str, s3: S3Options | None = None) -> StagingLocation:
        """Parse a local path or ``file://``/``s3://``/``gs://``/``hdfs://`` URI.

        Credentials come from ``s3`` for an ``s3://`` URI when given (an Airflow ``aws``
        connection, ``hooks/staging.py``), else from the environment the way pyarrow reads them
        (AWS_*, GOOGLE_*, Hadoop config); never from the URI text, so the URI can be logged.
        """
        if "://" not in uri:
            return cls(pafs.LocalFileSystem(), str(Path(uri).expanduser().resolve()), uri)
        if s3 is not None and uri.startswith("s3://"):
            return cls(s3.filesystem(), uri[len("s3://") :].rstrip("/"), uri, s3)
        try:
            filesystem, root = pafs.FileSystem.from_uri(uri)
        except OSError as exc:  # pyarrow asks the store (an S3 bucket's region) before anything is read
            raise StagingAccessError(
                f"cannot open staging {uri} with the worker's own credentials ({str(exc).splitlines()[0]}): "
                "name the store's connection (staging_conn_id: an aws connection with its endpoint and keys) "
                "or give the worker credentials for it. Nothing was staged and the slot did not move."
            ) from None
        return cls(filesystem, root.rstrip("/") or "/", uri)

    def check_access(self) -> None:
        """Raise ``StagingAccessError`` if an object store's bucket is missing or refuses the credentials."""
        check_access(self.filesystem, self.root, self.uri, self.s3)

    @property
    def is_local(self) -> bool:
        return str(self.filesystem.type_name) == "local"

    def path(self, *parts: str) -> str:
        """A path inside the root (``parts`` are single names, e.g. slot, batch id, table dir).

        Not for a path this location made already (a batch directory): joining the root again
        doubles an object store's relative root (``bucket/prefix/bucket/prefix/...``).
        """
        return posixpath.join(self.root, *parts)

    def uri_of(self, path: str, *, hadoop: bool = False) -> str:
        """The URI of ``path``: ``file:///…``, ``s3://bucket/…``, ``gs://…``, ``hdfs://…``.

        ``hadoop`` gives the scheme Hadoop's file systems (Spark) use for S3, ``s3a://``.
        """
        kind = self.filesystem.type_name
        if kind == "local":
            return Path(path).as_uri()
        scheme = {"gcs": "gs", "s3": "s3a" if hadoop else "s3"}.get(kind, kind)
        if kind == "hdfs" and self.uri.startswith("hdfs://"):
            authority = self.uri[len("hdfs://") :].split("/", 1)[0]
            return f"hdfs://{authority}{path}"
        return f"{scheme}://{path.lstrip('/')}"

    def exists(self, path: str) -> bool:
        info: pafs.FileInfo = self.filesystem.get_file_info(path)
        return bool(info.type != pafs.FileType.NotFound)

    def list_dirs(self, path: str) -> list[str]:
        """Names of the directories directly under ``path`` (empty when it does not exist)."""
        if not self.exists(path):
            return []
        infos = self.filesystem.get_file_info(pafs.FileSelector(path, recursive=False))
        return sorted(info.base_name for info in infos if info.type == pafs.FileType.Directory)

    def list_files(self, path: str, *, recursive: bool = False) -> list[str]:
        """Paths of the files under ``path`` (empty when it does not exist), sorted."""
        if not self.exists(path):
            return []
        infos = self.filesystem.get_file_info(pafs.FileSelector(path, recursive=recursive))
        return sorted(info.path for info in infos if info.type == pafs.FileType.File)

    def delete_dir(self, path: str) -> bool:
        """Delete a directory and everything in it; returns whether there was one."""
        if not self.exists(path):
            return False
        self.filesystem.delete_dir(path)
        return True

    def batch_dir(self, slot: str, batch_id: str) -> str:
        return self.path(batch_path(slot, batch_id))

    def list_batches(self, slot: str, prefix: str = "") -> list[tuple[str, bool]]:
        """``(batch id, complete)`` for every staged directory of a slot whose name starts with ``prefix``.

        ``complete`` means its manifest exists; incomplete ones are leftovers of a failed run.
        """
        slot_dir = self.path(slot)
        return [
            (name, self.exists(posixpath.join(slot_dir, name, MANIFEST_NAME)))
            for name in self.list_dirs(slot_dir)
            if name.startswith(prefix)
        ]

    def write_manifest(self, batch_dir: str, manifest: Manifest) -> str:
        """Write ``_manifest.json`` into ``batch_dir`` as the last step; returns its path.

        Where the file system can rename atomically the JSON goes to a temporary name first, so
        a reader never sees a half-written manifest.
        """
        final = posixpath.join(batch_dir, MANIFEST_NAME)
        data = manifest.to_json().encode("utf-8")
        if self.filesystem.type_name in _RENAME_ATOMIC:
            temporary = final + ".tmp"
            with self.filesystem.open_output_stream(temporary) as out:
                out.write(data)
            self.filesystem.move(temporary, final)
        else:
            with self.filesystem.open_output_stream(final) as out:
                out.write(data)
        return final

    def read_manifest(self, batch_dir: str) -> Manifest:
        with self.filesystem.open_input_stream(posixpath.join(batch_dir, MANIFEST_NAME)) as stream:
            return Manifest.from_json(stream.read())

    def record_slot_created(self, slot: str, consistent_point: Lsn) -> None:
        """Record where the pipeline's ``slot`` was created, beside its batches.

        PostgreSQL keeps no creation point of a slot, and a slot moves on with every
        acknowledgement, empty batches included. A re-run of the snapshot that created it tells
        a slot the pipeline has used (lake tables hold changes at or past this point) from one a
        dead run left unused (``engine/snapshot/rerun.py``). Retention never removes it.
        """
        slot_dir = self.path(slot)
        self.filesystem.create_dir(slot_dir, recursive=True)
        data = json.dumps({"slot": slot, "consistent_point": str(consistent_point)}).encode("utf-8")
        with self.filesystem.open_output_stream(posixpath.join(slot_dir, SLOT_CREATED_NAME)) as out:
            out.write(data)

    def slot_created(self, slot: str) -> Lsn | None:
        """Where ``slot`` was created, as :meth:`record_slot_created` wrote it; None when nothing
        recorded it (a run that died right after creating it, or lost staging)."""
        path = self.path(slot, SLOT_CREATED_NAME)
        if not self.exists(path):
            return None
        with self.filesystem.open_input_stream(path) as stream:
            return Lsn.parse(json.loads(stream.read())["consistent_point"])

    def forget_slot_created(self, slot: str) -> None:
        """Remove the record of ``slot``'s creation (the slot was dropped)."""
        path = self.path(slot, SLOT_CREATED_NAME)
        if self.exists(path):
            self.filesystem.delete_file(path)


class PartFileWriter:
    """Writes record batches of one schema to ``<directory>/<prefix>-NNNN.parquet`` files of bounded size.

    Each ``write`` becomes one row group, so memory holds one record batch at a time; a new
    file starts once the current one has reached ``max_file_bytes``. Dictionary encoding is off
    by default: staged files are read once by the apply job, and building dictionaries for
    mostly-unique columns cost a third of the write time and made the files larger. Column
    statistics are off too (a fifth of the write time for 1M changes): the apply job reads every
    staged file whole and never filters on them. ``close`` always leaves
    at least one file by default, so a table with no rows still has its schema staged. A batch
    of another schema (one with overflow sibling columns, docs/TYPES.md) starts a new file of
    that schema; ``fields`` lists every field any file got, in first-seen order.
    """

    def __init__(
        self,
        location: StagingLocation,
        directory: str,
        schema: pa.Schema,
        *,
        prefix: str = "part-00000",
        max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
        compression: str = "snappy",
        use_dictionary: bool = False,
        write_statistics: bool = False,
    ) -> None:
        self.location = location
        self.directory = directory
        self.schema = schema
        self.fields: dict[str, pa.Field] = {f.name: f for f in schema}
        self.prefix = prefix
        self.max_file_bytes = max_file_bytes
        self.compression = compression
        self.use_dictionary = use_dictionary
        self.write_statistics = write_statistics
        self.files: list[str] = []
        self.rows = 0
        self.bytes = 0
        self._sink: Any = None
        self._writer: pq.ParquetWriter | None = None

    def _open(self) -> pq.ParquetWriter:
        path = posixpath.join(self.directory, part_file_name(self.prefix, len(self.files)))
        self.location.filesystem.create_dir(self.directory, recursive=True)
        self._sink = self.location.filesystem.open_output_stream(path)
        self._writer = pq.ParquetWriter(
            self._sink,
            self.schema,
            compression=self.compression,
            use_dictionary=self.use_dictionary,
            write_statistics=self.write_statistics,
        )
        self.files.append(path)
        return self._writer

    def _finish_file(self) -> None:
        if self._writer is None:
            return
        self._writer.close()
        self.bytes += self._sink.tell()
        self._sink.close()
        self._writer, self._sink = None, None

    def write(self, batch: pa.RecordBatch) -> None:
        if not batch.schema.equals(self.schema):
            self._finish_file()
            self.schema = batch.schema
            for f in batch.schema:
                self.fields.setdefault(f.name, f)
        writer = self._writer or self._open()
        writer.write_batch(batch)
        self.rows += batch.num_rows
        if self._sink.tell() >= self.max_file_bytes:
            self._finish_file()

    def write_all(self, batches: Iterable[pa.RecordBatch]) -> None:
        for batch in batches:
            self.write(batch)

    def close(self, *, keep_empty: bool = True) -> None:
        """Finish the current file; with no rows written, leave one empty file if ``keep_empty``."""
        if not self.files and keep_empty:
            self._open()
        self._finish_file()

    def abort(self) -> None:
        """Close without the guarantee of a file (the caller deletes the directory)."""
        if self._writer is not None:
            self._writer.close()
            self._sink.close()
            self._writer, self._sink = None, None


def read_manifest(uri: str, s3: S3Options | None = None) -> Manifest:
    """Read a ``_manifest.json`` from a local path or a ``pyarrow.fs`` URI (``s3``: the store's keys)."""
    location = StagingLocation.resolve(posixpath.dirname(uri), s3)
    if not location.is_local:
        location.check_access()
    with location.filesystem.open_input_stream(location.path(posixpath.basename(uri))) as stream:
        return Manifest.from_json(stream.read())
