"""Staging retention on real directories with real manifests: only what nothing can need goes."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from airflow_provider_postgres_cdc.engine.retention import prune_staging
from airflow_provider_postgres_cdc.engine.staging import StagingLocation
from airflow_provider_postgres_cdc.formats.layout import change_batch_id, snapshot_batch_id
from airflow_provider_postgres_cdc.formats.lsn import Lsn
from airflow_provider_postgres_cdc.formats.manifest import ColumnManifest, Manifest, TableManifest

NOW = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)
OLD = (NOW - timedelta(days=3)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
YOUNG = (NOW - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
SLOT = "shop_cdc"


def _table(name: str) -> TableManifest:
    column = ColumnManifest("id", "int8", 20, -1, "int64", key=True)
    return TableManifest(
        "public", name, (column,), ("id",), "d", 1, (f"public.{name}/part-00000-0000.parquet",)
    )


def _stage(root: Path, manifest: Manifest | None, batch_id: str, slot: str = SLOT) -> Path:
    """A staged directory with one part file, and its manifest when given (complete)."""
    location = StagingLocation.resolve(str(root))
    directory = root / slot / batch_id
    (directory / "public.a").mkdir(parents=True)
    (directory / "public.a" / "part-00000-0000.parquet").write_bytes(b"PAR1")
    if manifest is not None:
        location.write_manifest(str(directory), manifest)
    return directory


def _batch(root: Path, start: int, end: int, created_at: str, slot: str = SLOT) -> Path:
    batch_id = change_batch_id(Lsn(start))
    manifest = Manifest(
        "batch", slot, "shop", batch_id, Lsn(start), Lsn(end), (_table("a"),), created_at=created_at
    )
    return _stage(root, manifest, batch_id, slot)


def _snapshot(root: Path, point: int, tables: tuple[str, ...], created_at: str = OLD) -> Path:
    batch_id = snapshot_batch_id(Lsn(point))
    entries = tuple(_table(t) for t in tables)
    manifest = Manifest(
        "snapshot",
        SLOT,
        "shop",
        batch_id,
        Lsn(point),
        Lsn(point),
        entries,
        "00000003-1",
        created_at=created_at,
    )
    return _stage(root, manifest, batch_id)


def _age(directory: Path, days: float) -> None:
    moment = (NOW - timedelta(days=days)).timestamp()
    for path in [directory, *directory.rglob("*")]:
        os.utime(path, (moment, moment))


def _prune(root: Path, confirmed: int, hours: float = 24) -> list[str]:
    return prune_staging(str(root), SLOT, Lsn(confirmed), timedelta(hours=hours), now=NOW)


def test_deletes_only_acknowledged_old_batches(tmp_path: Path) -> None:
    acked_old = _batch(tmp_path, 0x100, 0x200, OLD)
    acked_young = _batch(tmp_path, 0x200, 0x300, YOUNG)
    unacked_old = _batch(tmp_path, 0x300, 0x400, OLD)  # drained, never acknowledged: the only copy
    other_slot = _batch(tmp_path, 0x100, 0x200, OLD, slot="other")

    deleted = _prune(tmp_path, confirmed=0x300)

    assert deleted == [str(acked_old)]
    assert not acked_old.exists()
    assert acked_young.exists() and unacked_old.exists() and other_slot.exists()


def test_batch_ending_exactly_at_the_slot_is_acknowledged(tmp_path: Path) -> None:
    batch = _batch(tmp_path, 0x100, 0x200, OLD)
    assert _prune(tmp_path, confirmed=0x1FF) == []
    assert _prune(tmp_path, confirmed=0x200) == [str(batch)]


def test_incomplete_directory_kept_while_young(tmp_path: Path) -> None:
    writing = _stage(tmp_path, None, change_batch_id(Lsn(0x100)))
    _age(writing, days=0.5)  # a drain wrote into it twelve hours ago: it may still be writing
    assert _prune(tmp_path, confirmed=0x1000) == []
    _age(writing, days=2)  # nothing written for two days: a failed run's leftover
    assert _prune(tmp_path, confirmed=0x1000) == [str(writing)]


def test_newest_snapshot_of_each_table_is_kept(tmp_path: Path) -> None:
    initial = _snapshot(tmp_path, 0x100, ("a", "b"))
    resnapshot_a = _snapshot(tmp_path, 0x300, ("a",))
    # `initial` is still the newest snapshot of b; `resnapshot_a` is the slot's newest.
    assert _prune(tmp_path, confirmed=0x1000) == []

    resnapshot_b = _snapshot(tmp_path, 0x400, ("b",))
    assert _prune(tmp_path, confirmed=0x1000) == [str(initial)]
    assert resnapshot_a.exists() and resnapshot_b.exists()


def test_unacknowledged_or_young_snapshot_is_kept(tmp_path: Path) -> None:
    superseded = _snapshot(tmp_path, 0x100, ("a",))
    unacked = _snapshot(tmp_path, 0x600, ("a",))  # superseded too, but the slot is not past it yet
    _snapshot(tmp_path, 0x700, ("a",))
    assert _prune(tmp_path, confirmed=0x550) == [str(superseded)]
    assert unacked.exists()
    young = tmp_path / "young"
    _snapshot(young, 0x100, ("a",), created_at=YOUNG)
    _snapshot(young, 0x200, ("a",))
    assert _prune(young, confirmed=0x1000) == []


def test_unreadable_manifest_is_kept(tmp_path: Path) -> None:
    directory = _batch(tmp_path, 0x100, 0x200, OLD)
    (directory / "_manifest.json").write_text("{not json")
    assert _prune(tmp_path, confirmed=0x1000) == []
    assert directory.exists()


def test_negative_retention_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="must not be negative"):
        _prune(tmp_path, confirmed=0, hours=-1)
