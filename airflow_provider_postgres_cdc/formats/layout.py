"""Where staged data lives (docs/FORMATS.md, "Layout"): every staged name, defined once.

    <staging>/<slot>/batch-<start LSN hex16>/<schema>.<table>/part-v<NNN>-<NNNN>.parquet
    <staging>/<slot>/batch-<...>/<schema>.<table>/missing-0000.parquet
    <staging>/<slot>/snapshot-<consistent point hex16>/<schema>.<table>/part-<NNNNN>-<NNNN>.parquet
    <staging>/<slot>/<batch id>/_manifest.json        written last: its presence marks the batch complete
    <staging>/<slot>/_slot_created.json               the consistent point the pipeline slot was created at

Standard library only: the Spark job ships it, and the drain, the snapshot, retention and the job
name directories by it. LSNs print as 16 hex digits so that names sort by LSN as text.
"""

from __future__ import annotations

import posixpath

MANIFEST_NAME = "_manifest.json"
SLOT_CREATED_NAME = "_slot_created.json"
BATCH_PREFIX = "batch-"
SNAPSHOT_PREFIX = "snapshot-"
PART_PREFIX = "part-"
PARQUET_SUFFIX = ".parquet"
MISSING_VALUES_PREFIX = "missing"
"""Prefix of the one-row file of a table's missing values (engine/catalog_facts.py)."""

# Characters that would make a table directory name ambiguous ("." separates schema and table).
_ENCODED = {"%": "%25", "/": "%2F", ".": "%2E"}


def change_batch_id(start_lsn: int) -> str:
    """``batch-<start LSN as 16 hex digits>``: a drained batch's directory, named by where it starts."""
    return f"{BATCH_PREFIX}{int(start_lsn):016X}"


def snapshot_batch_id(consistent_point: int) -> str:
    """``snapshot-<consistent point as 16 hex digits>``: a snapshot's directory."""
    return f"{SNAPSHOT_PREFIX}{int(consistent_point):016X}"


def batch_path(slot: str, batch_id: str) -> str:
    """A batch's directory relative to the staging root."""
    return posixpath.join(slot, batch_id)


def change_part_prefix(version: int) -> str:
    """Part files of a batch's table written under its ``version``-th relation version."""
    return f"{PART_PREFIX}v{version:03d}"


def snapshot_part_prefix(range_index: int) -> str:
    """Part files of a snapshot's table copied from its ``range_index``-th block range."""
    return f"{PART_PREFIX}{range_index:05d}"


def part_file_name(prefix: str, number: int) -> str:
    """The ``number``-th Parquet file of a writer with ``prefix``."""
    return f"{prefix}-{number:04d}{PARQUET_SUFFIX}"


def is_part_file(name: str) -> bool:
    """Whether a file in a table directory is staged data (not ``_SUCCESS``, checksums, manifests)."""
    return name.startswith(PART_PREFIX) and name.endswith(PARQUET_SUFFIX)


def encode_name_part(name: str) -> str:
    """A schema or table name with `%`, `/` and `.` percent-encoded (staging directories, lake namespaces)."""
    return "".join(_ENCODED.get(ch, ch) for ch in name)


def decode_name_part(text: str) -> str:
    """Inverse of :func:`encode_name_part`."""
    # Only the three escapes encode_name_part produces exist; decode %25 last so "%252E" stays "%2E".
    return text.replace("%2F", "/").replace("%2E", ".").replace("%25", "%")


def table_dir_name(schema: str, table: str) -> str:
    """``schema.table`` with ``/``, ``%`` and ``.`` percent-encoded in each part (``s.a%2Eb``)."""
    return f"{encode_name_part(schema)}.{encode_name_part(table)}"


def parse_table_dir_name(name: str) -> tuple[str, str]:
    """Inverse of :func:`table_dir_name`."""
    schema, sep, table = name.partition(".")
    if not sep or "." in table:
        raise ValueError(f"not a table directory name: {name!r}")
    return decode_name_part(schema), decode_name_part(table)
