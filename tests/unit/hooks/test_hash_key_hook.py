"""``PostgresCdcHashKeyHook`` reads the key of ``column_transforms`` from a connection's password."""

from __future__ import annotations

import json

import pytest

from airflow_provider_postgres_cdc.errors import ColumnTransformsError
from airflow_provider_postgres_cdc.formats.column_transforms import key_id
from airflow_provider_postgres_cdc.hooks.hash_key import PostgresCdcHashKeyHook, column_transformer

KEY = "0123456789abcdef-the-key"


def test_the_password_is_the_key_and_the_transformer_hides_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_PII_KEY", json.dumps({"conn_type": "generic", "password": KEY}))
    assert PostgresCdcHashKeyHook("pii_key").get_conn() == KEY.encode()
    transformer = column_transformer('{"public.c": {"email": "hash"}}', "pii_key")
    assert transformer is not None and transformer.key_id == key_id(KEY.encode())
    assert KEY not in repr(transformer)


def test_a_missing_connection_or_a_short_key_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ColumnTransformsError, match=r"connection 'nowhere', which does not exist: create it"):
        column_transformer({"public.c": {"email": "hash"}}, "nowhere")
    monkeypatch.setenv("AIRFLOW_CONN_SHORT", json.dumps({"conn_type": "generic", "password": "short"}))
    with pytest.raises(ColumnTransformsError, match="holds no hash key of at least 16 bytes"):
        column_transformer({"public.c": {"email": "hash"}}, "short")


def test_no_key_is_read_when_nothing_is_hashed() -> None:
    assert column_transformer(None, "nowhere") is None
    dropping = column_transformer({"public.c": {"ssn": "drop"}}, "nowhere")
    assert dropping is not None and dropping.key_id is None
