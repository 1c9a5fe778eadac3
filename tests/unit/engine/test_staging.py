"""Staging on the local file system: URIs, bounded part files, the manifest written last and atomically."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from airflow_provider_postgres_cdc.engine.staging import PartFileWriter, StagingLocation
from airflow_provider_postgres_cdc.formats.lsn import Lsn
from airflow_provider_postgres_cdc.formats.manifest import Manifest


def test_local_paths_and_file_uris_resolve_to_the_same_place(tmp_path: Path) -> None:
    by_path = StagingLocation.resolve(str(tmp_path))
    by_uri = StagingLocation.resolve(tmp_path.as_uri())
    assert by_path.is_local and by_uri.is_local
    assert by_path.root == by_uri.root == str(tmp_path)
    assert by_path.uri_of(by_path.path("s", "b")) == (tmp_path / "s" / "b").as_uri()


def test_unknown_scheme_is_refused() -> None:
    with pytest.raises(pa.ArrowInvalid):
        StagingLocation.resolve("nosuch://bucket/x")


def test_part_files_roll_over_at_the_size_limit_and_keep_every_row(tmp_path: Path) -> None:
    location = StagingLocation.resolve(str(tmp_path))
    schema = pa.schema([("id", pa.int64()), ("txt", pa.string())])
    writer = PartFileWriter(location, location.path("t"), schema, prefix="part-00003", max_file_bytes=50_000)
    for start in range(0, 20_000, 1_000):
        ids = pa.array(range(start, start + 1_000), pa.int64())
        writer.write(pa.record_batch([ids, pa.array([f"row {i} " * 5 for i in range(1_000)])], schema=schema))
    writer.close()
    assert len(writer.files) > 3
    assert [Path(f).name for f in writer.files[:2]] == ["part-00003-0000.parquet", "part-00003-0001.parquet"]
    sizes = [Path(f).stat().st_size for f in writer.files]
    assert writer.bytes == sum(sizes)
    assert max(sizes) < 50_000 + 60_000  # the limit plus at most one row group
    table = pa.concat_tables([pq.read_table(f) for f in writer.files])
    assert table.column("id").to_pylist() == list(range(20_000)) and writer.rows == 20_000


def test_an_empty_table_still_stages_its_schema(tmp_path: Path) -> None:
    location = StagingLocation.resolve(str(tmp_path))
    schema = pa.schema([("id", pa.int32())])
    writer = PartFileWriter(location, location.path("empty"), schema)
    writer.close()
    assert len(writer.files) == 1
    assert pq.read_table(writer.files[0]).schema == schema
    other = PartFileWriter(location, location.path("empty"), schema, prefix="part-00001")
    other.close(keep_empty=False)
    assert other.files == [] and sorted(p.name for p in (tmp_path / "empty").iterdir()) == [
        "part-00000-0000.parquet"
    ]


def test_manifest_is_written_under_its_final_name_and_batches_report_completeness(tmp_path: Path) -> None:
    location = StagingLocation.resolve(str(tmp_path))
    done = location.batch_dir("slot", "snapshot-01")
    half = location.batch_dir("slot", "snapshot-02")
    for directory in (done, half):
        location.filesystem.create_dir(directory)
    manifest = Manifest("snapshot", "slot", "db", "snapshot-01", Lsn(1), Lsn(1), (), snapshot_name="x")
    path = location.write_manifest(done, manifest)
    assert sorted(p.name for p in Path(done).iterdir()) == ["_manifest.json"]
    assert Path(path).read_text(encoding="utf-8") == manifest.to_json()
    assert location.read_manifest(done) == manifest
    assert location.list_batches("slot") == [("snapshot-01", True), ("snapshot-02", False)]
    assert location.list_batches("slot", prefix="batch-") == []
    assert location.list_batches("other") == []
    assert location.delete_dir(half) and not location.delete_dir(half)
    assert location.list_files(done) == [path]


def test_object_store_uris_name_the_bucket_and_give_spark_s3a() -> None:
    location = StagingLocation(
        pafs.S3FileSystem(anonymous=True, region="us-east-1"), "bucket/cdc", "s3://bucket/cdc"
    )
    path = location.path("slot", "snapshot-01")
    assert location.uri_of(path) == "s3://bucket/cdc/slot/snapshot-01"
    assert location.uri_of(path, hadoop=True) == "s3a://bucket/cdc/slot/snapshot-01"


def test_the_slot_creation_point_is_recorded_beside_the_batches_and_forgotten(tmp_path: Path) -> None:
    location = StagingLocation.resolve(str(tmp_path / "staging"))
    assert location.slot_created("shop_cdc") is None  # nothing recorded: a re-run falls back
    location.record_slot_created("shop_cdc", Lsn.parse("0/16B3748"))
    location.record_slot_created("other", Lsn.parse("1/0"))
    assert location.slot_created("shop_cdc") == Lsn.parse("0/16B3748")
    assert location.list_batches("shop_cdc") == []  # not a batch, for retention or a re-run
    location.record_slot_created("shop_cdc", Lsn.parse("0/20000000"))  # the slot created anew
    assert location.slot_created("shop_cdc") == Lsn.parse("0/20000000")
    location.forget_slot_created("shop_cdc")
    location.forget_slot_created("shop_cdc")  # already gone: nothing to do
    assert location.slot_created("shop_cdc") is None and location.slot_created("other") == Lsn.parse("1/0")
