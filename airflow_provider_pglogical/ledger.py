"""Reading the target's ledger from Python: has a staged batch been durably applied?

The Spark apply job writes ``<target>/_ledger/<slot>/<batch id>/<schema>.<table>.json`` for each
table of a batch, after every table of the batch is switched to its new state (docs/FORMATS.md).
The ack reads these files through ``pyarrow.fs`` (no Spark needed) and advances the slot only when
every table of the manifest has its row.
"""

from __future__ import annotations

import json
import posixpath
from typing import Any

import pyarrow.fs as pafs

from airflow_provider_pglogical.lsn import Lsn
from airflow_provider_pglogical.manifest import Manifest
from airflow_provider_pglogical.staging import StagingLocation


def ledger_rows(target: str, slot: str, batch_id: str) -> dict[str, dict[str, Any]]:
    """The ledger rows of one batch keyed by table directory name (empty when none were written)."""
    location = StagingLocation.resolve(target)
    directory = location.path("_ledger", slot, batch_id)
    rows: dict[str, dict[str, Any]] = {}
    for path in location.list_files(directory):
        name = posixpath.basename(path)
        if name.endswith(".json"):
            with location.filesystem.open_input_stream(path) as stream:
                rows[name[: -len(".json")]] = json.loads(stream.read())
    return rows


def missing_tables(target: str, manifest: Manifest) -> list[str]:
    """Tables of ``manifest`` with no ledger row yet: empty means the batch is durably applied.

    A manifest without tables (an empty batch) holds no change, so nothing can be lost by
    acknowledging it, and nothing is missing.
    """
    rows = ledger_rows(target, manifest.slot, manifest.batch_id)
    return [
        table.qualified
        for table in manifest.tables
        if table.path not in rows or _lsn(rows[table.path].get("end_lsn")) != manifest.end_lsn
    ]


def _lsn(value: Any) -> Lsn | None:
    """A ledger LSN, written as ``X/Y`` text or as an integer."""
    if isinstance(value, int):
        return Lsn(value)
    return Lsn.parse(value) if isinstance(value, str) else None


def read_manifest(uri: str) -> Manifest:
    """Read a ``_manifest.json`` from a local path or any ``pyarrow.fs`` URI."""
    if "://" in uri:
        filesystem, path = pafs.FileSystem.from_uri(uri)
    else:
        filesystem, path = pafs.LocalFileSystem(), uri
    with filesystem.open_input_stream(path) as stream:
        return Manifest.from_json(stream.read())
