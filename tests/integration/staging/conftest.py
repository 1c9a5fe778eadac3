"""One real S3 server (SeaweedFS ``weed mini``) for the staging tests of the session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from airflow_provider_postgres_cdc.testing import S3Server


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    with S3Server(buckets=["staging"]) as server:
        yield server
