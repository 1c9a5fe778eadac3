"""The lake operators' check of an ``s3://`` warehouse before spark-submit (engine/lake_catalog.py),
against a real S3 server: a bucket that is there passes, a missing one or refused keys fail naming it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_provider_postgres_cdc.engine.lake_catalog import check_warehouse
from airflow_provider_postgres_cdc.errors import LakeStorageError
from airflow_provider_postgres_cdc.formats.lake import LakeConfig
from airflow_provider_postgres_cdc.testing import S3Server


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with S3Server(buckets=["lake"]) as server:
        yield server


def sqlite_lake(s3: S3Server, root: Path, warehouse: str, secret: str | None = None) -> LakeConfig:
    """A SQLite catalog whose warehouse is on ``s3`` through Iceberg's S3FileIO."""
    return LakeConfig(
        "lake",
        {
            "type": "jdbc", "uri": f"jdbc:sqlite:{root}/catalog.db", "warehouse": warehouse,
            "io-impl": "org.apache.iceberg.aws.s3.S3FileIO", "s3.endpoint": s3.endpoint_url,
            "s3.access-key-id": s3.access_key, "s3.secret-access-key": secret or s3.secret_key,
            "s3.region": "us-east-1", "s3.path-style-access": "true",
        },
    )  # fmt: skip


def test_a_warehouse_bucket_that_answers_passes(s3: S3Server, tmp_path: Path) -> None:
    check_warehouse(sqlite_lake(s3, tmp_path, "s3://lake/warehouse"), "lake connection 'shop_lake'")


def test_a_missing_bucket_is_named(s3: S3Server, tmp_path: Path) -> None:
    with pytest.raises(LakeStorageError) as info:
        check_warehouse(sqlite_lake(s3, tmp_path, "s3://nowhere/warehouse"), "lake connection 'shop_lake'")
    assert str(info.value).startswith(
        f"lake connection 'shop_lake': bucket 'nowhere' of the lake's warehouse s3://nowhere/warehouse does "
        f"not exist at {s3.endpoint_url}: create it"
    )


def test_refused_keys_are_named_and_the_secret_is_not(s3: S3Server, tmp_path: Path) -> None:
    lake = sqlite_lake(s3, tmp_path, "s3://lake/warehouse", secret="not-the-secret")
    with pytest.raises(LakeStorageError, match="refused the lake's credentials for bucket 'lake'") as info:
        check_warehouse(lake, "lake connection 'shop_lake'")
    assert "s3.secret-access-key" in str(info.value) and "not-the-secret" not in str(info.value)


def test_a_rest_catalog_s_warehouse_is_the_catalog_s_business(s3: S3Server) -> None:
    check_warehouse(LakeConfig("lake", {"type": "rest", "warehouse": "s3://nowhere/"}), "lake connection 'x'")
