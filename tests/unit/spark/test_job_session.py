"""``job_session``: the settings file set on the session, and SIGTERM on a Spark Connect session.

A fake session class stands in for pyspark's (no JVM, no server); a class from a module named like
pyspark's Connect client makes it a Connect session.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_postgres_cdc.spark import job_session as module
from airflow_provider_postgres_cdc.spark.job_session import SESSION_CONF_ENV, job_session


class FakeConf:
    def __init__(self, refused: dict[str, str]) -> None:
        self.values: dict[str, str] = {}
        self.refused = refused

    def set(self, key: str, value: str) -> None:
        if key in self.refused:
            raise RuntimeError(self.refused[key])
        self.values[key] = value


class FakeSession:
    def __init__(self, refused: dict[str, str] | None = None) -> None:
        self.conf = FakeConf(refused or {})
        self.app_name = ""
        self.interrupted = 0
        self.stopped = False

    def stop(self) -> None:
        self.stopped = True

    def interruptAll(self) -> list[str]:  # noqa: N802 - pyspark's name
        self.interrupted += 1
        return ["op-1"]


class ConnectSession(FakeSession):
    pass


ConnectSession.__module__ = "pyspark.sql.connect.session"


def use(monkeypatch: pytest.MonkeyPatch, session: FakeSession) -> None:
    class Builder:
        def appName(self, name: str) -> Builder:  # noqa: N802 - pyspark's name
            session.app_name = name
            return self

        def getOrCreate(self) -> FakeSession:  # noqa: N802 - pyspark's name
            return session

    monkeypatch.setattr(module, "SparkSession", type("SparkSession", (), {"builder": Builder()}))


def test_the_settings_file_is_set_on_the_session_and_left_in_place(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = {"spark.sql.catalog.lake": "org.apache.iceberg.spark.SparkCatalog", "fs.s3a.x": "1",
                "spark.sql.extensions": "ext"}  # fmt: skip
    path = tmp_path / "session.json"
    path.write_text(json.dumps(settings))
    monkeypatch.setenv(SESSION_CONF_ENV, str(path))
    session = FakeSession(refused={"spark.sql.extensions": "[CANNOT_MODIFY_STATIC_CONFIG] Cannot modify"})
    use(monkeypatch, session)

    assert job_session("apply_batch.py") is session
    assert session.app_name == "apply_batch.py"
    assert session.conf.values == {
        "spark.sql.catalog.lake": "org.apache.iceberg.spark.SparkCatalog",
        "fs.s3a.x": "1",
    }
    assert (
        "keeps its own spark.sql.extensions" in capsys.readouterr().err
    )  # a server-start setting: a warning
    assert path.exists()  # the operator's to delete


def test_another_refused_setting_fails_the_job(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = tmp_path / "session.json"
    path.write_text(json.dumps({"spark.sql.catalog.lake.uri": "x"}))
    monkeypatch.setenv(SESSION_CONF_ENV, str(path))
    use(monkeypatch, FakeSession(refused={"spark.sql.catalog.lake.uri": "UNAVAILABLE: server gone"}))
    with pytest.raises(RuntimeError, match="UNAVAILABLE"):
        job_session("apply_batch.py")


def test_without_a_settings_file_spark_submit_s_session_is_returned_as_is(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(SESSION_CONF_ENV, raising=False)
    session = FakeSession()
    use(monkeypatch, session)
    before = signal.getsignal(signal.SIGTERM)
    assert job_session("maintain_lake.py") is session and session.conf.values == {}
    assert signal.getsignal(signal.SIGTERM) is before  # a classic session keeps Spark's own handling


def test_sigterm_interrupts_a_connect_session_s_operations_and_exits_143(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(SESSION_CONF_ENV, raising=False)
    session = ConnectSession()
    use(monkeypatch, session)
    before = signal.getsignal(signal.SIGTERM)
    try:
        job_session("apply_batch.py")
        handler: Any = signal.getsignal(signal.SIGTERM)
        assert callable(handler)
        exits: list[int] = []
        monkeypatch.setattr(module, "_exit", exits.append)
        handler(signal.SIGTERM, None)
        assert exits == [143] and session.interrupted == 1 and session.stopped
        assert "1 operation(s) on the server interrupted" in capsys.readouterr().err
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # a second SIGTERM ends it at once
    finally:
        signal.signal(signal.SIGTERM, before)
