"""Unit-test fixtures: the captured server messages of ``tests/data/pgoutput``."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from airflow_provider_postgres_cdc.formats.lsn import Lsn

DATA = Path(__file__).resolve().parents[1] / "data" / "pgoutput"
SCENARIOS = ("proto1", "binary", "stream", "two_phase")


@dataclass(frozen=True)
class Capture:
    name: str
    protocol_version: int
    options: dict[str, str]
    messages: list[bytes]
    lsns: list[int]
    xids: list[int]
    text_messages: list[bytes]  # scenario "binary": the same changes in text format


def load(name: str) -> Capture:
    raw = json.loads((DATA / f"{name}.json").read_text())
    return Capture(
        name,
        int(raw["options"]["proto_version"]),
        raw["options"],
        [bytes.fromhex(m["data"]) for m in raw["messages"]],
        [int(Lsn.parse(m["lsn"])) for m in raw["messages"]],
        [int(m["xid"]) for m in raw["messages"]],
        [bytes.fromhex(m["data"]) for m in raw.get("text_messages", [])],
    )


@pytest.fixture(scope="session")
def captures() -> dict[str, Capture]:
    """Every captured scenario, by name."""
    return {name: load(name) for name in SCENARIOS}
