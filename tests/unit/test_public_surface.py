"""What users read speaks of the product as it is: its own name, and no history of how it was built."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OTHER_EXTENSION = "pg" + "logical"  # the PostgreSQL extension this package is not (and needs not)
ISSUE_REFERENCE = re.compile(r"\b" + "iss" + r"ues? #?\d+", re.IGNORECASE)


def tracked_text_files() -> list[Path]:
    """The repository's files as git tracks them (a checkout), or every file but caches (an sdist)."""
    try:
        listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True)
        names = [ROOT / name for name in listed.stdout.splitlines()]
    except (OSError, subprocess.CalledProcessError):
        names = [p for p in ROOT.rglob("*") if not any(part.startswith(".") for part in p.parts)]
    texts = []
    for path in names:
        if path.is_file() and path.suffix not in (".parquet", ".whl", ".jar"):
            try:
                path.read_text()
            except UnicodeDecodeError:
                continue
            texts.append(path)
    return texts


def lines_matching(pattern: re.Pattern[str], paths: list[Path]) -> list[str]:
    return [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()[:120]}"
        for path in paths
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]


def test_the_other_extension_is_named_once_to_say_this_is_not_it() -> None:
    outside_tests = [p for p in tracked_text_files() if p.relative_to(ROOT).parts[0] != "tests"]
    found = lines_matching(re.compile(OTHER_EXTENSION, re.IGNORECASE), outside_tests)
    assert len(found) == 1 and found[0].startswith("README.md:"), "\n".join(found)


def test_no_file_refers_to_issue_numbers() -> None:
    assert lines_matching(ISSUE_REFERENCE, tracked_text_files()) == []
