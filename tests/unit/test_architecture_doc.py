"""docs/ARCHITECTURE.md is the one description of the layers; it must say what the import check enforces."""

from __future__ import annotations

import re
from pathlib import Path

from tests.unit.test_import_graph import AIRFLOW_ALLOWED, RANKS

DOC = Path(__file__).resolve().parents[2] / "docs" / "ARCHITECTURE.md"
ROW = re.compile(r"^\| (\d+) \| `([a-z_]+)` \| (yes|no) \|")


def documented() -> dict[str, tuple[int, bool]]:
    rows = (ROW.match(line) for line in DOC.read_text().splitlines())
    return {m[2]: (int(m[1]), m[3] == "yes") for m in rows if m}


def test_the_doc_gives_every_part_its_layer() -> None:
    layers = documented()
    assert {part: rank for part, (rank, _) in layers.items()} == RANKS


def test_the_doc_says_which_parts_import_airflow() -> None:
    assert {part for part, (_, airflow) in documented().items() if airflow} == AIRFLOW_ALLOWED


def test_the_doc_lists_layers_highest_first() -> None:
    ranks = [rank for rank, _ in documented().values()]
    assert ranks == sorted(ranks, reverse=True) and len(ranks) > 10
