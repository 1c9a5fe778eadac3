"""``PostgresCdcStagingHook`` reads an ``aws`` connection as the Amazon provider does, hiding the secret."""

from __future__ import annotations

import json

import pytest

from airflow_provider_postgres_cdc.engine.object_store import S3Options
from airflow_provider_postgres_cdc.hooks.staging import PostgresCdcStagingHook, staging_options

SECRET = "s3cr3t-never-shown"


def _conn(monkeypatch: pytest.MonkeyPatch, **fields: object) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_STORE", json.dumps({"conn_type": "aws", **fields}))


def test_login_and_password_are_the_keys_and_extras_the_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    _conn(monkeypatch, login="AKID", password=SECRET,
          extra={"region_name": "eu-west-1", "endpoint_url": "http://127.0.0.1:8333"})  # fmt: skip
    options = PostgresCdcStagingHook("store").get_conn()
    assert options == S3Options("AKID", SECRET, None, "eu-west-1", "http://127.0.0.1:8333")
    assert SECRET not in repr(options) and SECRET not in str(options)
    assert options.scrub(f"denied for {SECRET}") == "denied for ***"


def test_extra_keys_session_token_and_the_s3_service_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    _conn(monkeypatch, extra={
        "aws_access_key_id": "AKID2", "aws_secret_access_key": SECRET, "aws_session_token": "tok",
        "endpoint_url": "https://all.example", "service_config": {"s3": {"endpoint_url": "https://s3.example"}},
    })  # fmt: skip
    options = PostgresCdcStagingHook("store").get_conn()
    assert (options.access_key, options.secret_key, options.session_token) == ("AKID2", SECRET, "tok")
    assert options.endpoint_url == "https://s3.example"  # the per-service endpoint wins, as in the provider
    assert "tok" not in repr(options)


def test_empty_connection_and_no_connection_mean_the_default_chain(monkeypatch: pytest.MonkeyPatch) -> None:
    _conn(monkeypatch)
    assert PostgresCdcStagingHook("store").get_conn() == S3Options()
    assert staging_options(None) is None


def test_filesystem_splits_the_endpoint_and_defaults_the_region() -> None:
    filesystem = S3Options("AKID", SECRET, endpoint_url="http://127.0.0.1:8333").filesystem()
    assert filesystem.region == "us-east-1"
    assert S3Options(region="eu-west-1").filesystem().region == "eu-west-1"
