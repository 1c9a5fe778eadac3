"""``PostgresCdcHook`` reads a ``postgres`` connection: libpq extras pass, PostgresHook's are ignored.

Connections come from ``AIRFLOW_CONN_<ID>`` in Airflow's JSON form; nothing connects to a server.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from airflow_provider_postgres_cdc.errors import ConnectionExtrasError, PostgresCdcError
from airflow_provider_postgres_cdc.hooks.postgres import PostgresCdcHook, is_libpq_keyword

SECRET = "s3cret-pass"
FIELDS = {"host": "db.example.com", "port": 5433, "login": "cdc", "password": SECRET, "schema": "shop"}
BASE = {"host": "db.example.com", "port": 5433, "user": "cdc", "password": SECRET, "dbname": "shop"}


def hook_for(
    monkeypatch: pytest.MonkeyPatch, extra: dict[str, Any], conn_id: str = "shop_db"
) -> PostgresCdcHook:
    connection = {"conn_type": "postgres", **FIELDS, "extra": extra}
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(connection))
    return PostgresCdcHook(conn_id)


def both_paths(hook: PostgresCdcHook) -> tuple[dict[str, Any], dict[str, Any]]:
    """The blocking lookup (operators, CLI) and the event loop's (triggers): one rule for both."""
    return hook.connection_params(), asyncio.run(hook.aconnection_params())


def test_it_is_a_standard_postgres_connection() -> None:
    assert (PostgresCdcHook.conn_name_attr, PostgresCdcHook.default_conn_name, PostgresCdcHook.conn_type) == (
        "postgres_conn_id", "postgres_default", "postgres")  # fmt: skip
    assert PostgresCdcHook().postgres_conn_id == "postgres_default"
    behaviour = PostgresCdcHook.get_ui_field_behaviour()
    assert behaviour["relabeling"] == {"schema": "Database"}
    assert set(json.loads(behaviour["placeholders"]["extra"])) <= {"sslmode", "application_name"}


def test_libpq_keywords_in_the_extras_pass_through(monkeypatch: pytest.MonkeyPatch) -> None:
    extra = {"sslmode": "verify-full", "application_name": "cdc", "keepalives_idle": 60,
             "options": "-c statement_timeout=0", "target_session_attrs": "read-write"}  # fmt: skip
    for params in both_paths(hook_for(monkeypatch, extra)):
        assert params == {**BASE, **extra}


def test_postgres_hooks_own_extras_are_ignored_with_one_warning(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    extra = {"sslmode": "require", "cursor": "dictcursor", "sqlalchemy_query": {"a": "b"},
             "aws_conn_id": "aws", "enable_log_db_messages": True, "iam": False}  # fmt: skip
    hook = hook_for(monkeypatch, extra)
    capsys.readouterr()
    params = hook.connection_params()
    logged = capsys.readouterr()
    assert params == {**BASE, "sslmode": "require"}
    # Airflow's task logging (structlog) prints hook warnings as one line each.
    (warning,) = [line for line in (logged.out + logged.err).splitlines() if "ignoring" in line]
    assert "warning" in warning
    assert (
        "connection 'shop_db': ignoring the extras 'aws_conn_id', 'cursor', 'enable_log_db_messages', "
        "'iam', 'sqlalchemy_query': they configure Airflow's PostgresHook "
        "(apache-airflow-providers-postgres), not airflow-provider-postgres-cdc" in warning
    )
    assert SECRET not in logged.out + logged.err
    assert asyncio.run(hook.aconnection_params()) == params


@pytest.mark.parametrize("iam", [True, "true"])
def test_iam_authentication_is_refused_saying_what_to_do(
    monkeypatch: pytest.MonkeyPatch, iam: object
) -> None:
    hook = hook_for(monkeypatch, {"iam": iam, "aws_conn_id": "aws"})
    with pytest.raises(ConnectionExtrasError) as raised:
        hook.connection_params()
    message = str(raised.value)
    assert "connection 'shop_db' sets the extra iam" in message and "not supported" in message
    assert "Remove iam" in message and "password" in message and "sslcert" in message
    with pytest.raises(ConnectionExtrasError, match="sets the extra iam"):
        asyncio.run(hook.aconnection_params())


def test_any_other_extra_is_refused_naming_every_key(monkeypatch: pytest.MonkeyPatch) -> None:
    # "sslca" is a common slip for sslrootcert; "ssl_mode" would otherwise connect without TLS.
    hook = hook_for(
        monkeypatch, {"sslmode": "require", "ssl_mode": "verify-full", "sslca": "/ca.pem", "cursor": "x"}
    )
    with pytest.raises(ConnectionExtrasError) as raised:
        hook.connection_params()
    message = str(raised.value)
    assert isinstance(raised.value, PostgresCdcError)
    assert message.startswith(
        "connection 'shop_db' has extras that are neither libpq connection keywords nor extras of "
        "Airflow's PostgresHook: 'ssl_mode', 'sslca'. Correct their names (libpq keywords: https://"
    )
    assert message.endswith("or remove them from the connection's extras")
    assert "'sslmode'" not in message and "'cursor'" not in message and SECRET not in message
    with pytest.raises(ConnectionExtrasError, match="'ssl_mode', 'sslca'"):
        asyncio.run(hook.aconnection_params())


def test_the_test_button_reports_a_refused_extra_without_connecting(monkeypatch: pytest.MonkeyPatch) -> None:
    ok, message = hook_for(monkeypatch, {"sslca": "/ca.pem"}).test_connection()
    assert not ok and "'sslca'" in message


@pytest.mark.parametrize(
    ("key", "known"),
    [
        ("sslmode", True),
        ("sslrootcert", True),
        ("target_session_attrs", True),
        ("passfile", True),
        ("cursor", False),
        ("database", False),  # psycopg2 takes it as a Python argument; libpq does not know it
        ("cluster-identifier", False),
        ("host=evil dbname", False),
        ("", False),
    ],
)
def test_libpq_itself_decides_what_a_keyword_is(key: str, known: bool) -> None:
    assert is_libpq_keyword(key) is known
