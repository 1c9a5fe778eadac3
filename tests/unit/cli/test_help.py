"""``pgcdc`` explains itself: the top help and every command's help, in the pipeline's vocabulary."""

from __future__ import annotations

import subprocess
import sys

import pytest

COMMANDS = ("check", "slots", "publications", "lag", "peek", "report")


def help_of(*argv: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "airflow_provider_postgres_cdc.cli", *argv, "--help"],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    return " ".join(result.stdout.split())  # argparse wraps lines where the terminal ends


def test_the_top_help_lists_every_command_and_how_they_connect() -> None:
    text = help_of()
    assert text.startswith("usage: pgcdc")
    for command in COMMANDS:
        assert f" {command} " in text
    assert "--postgres-conn-id (the id of an Airflow postgres connection" in text


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_connects_through_a_postgres_connection_or_a_dsn(command: str) -> None:
    text = help_of(command)
    assert f"usage: pgcdc {command} [-h] (--dsn DSN | --postgres-conn-id CONN_ID)" in text
    assert "id of an Airflow postgres connection to the database" in text
    assert "--slot " not in text and "--publication " not in text  # the flags are --slot-name, --publications
