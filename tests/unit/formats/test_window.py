"""Exactly once per change (window.py): what a table and its changelog still take from a batch."""

from __future__ import annotations

from airflow_provider_postgres_cdc.formats import lake
from airflow_provider_postgres_cdc.formats.lake import TableState
from airflow_provider_postgres_cdc.formats.lsn import ZERO, Lsn
from airflow_provider_postgres_cdc.formats.window import Window, changelog_window, logged_end, table_window


def state(base: int, applied: int) -> TableState:
    return TableState(1, "s", "batch", "b", Lsn(base), Lsn(applied))


def logged(applied: int) -> dict[str, str]:
    """A changelog commit's summary: it logged changes up to ``applied``."""
    return {lake.APPLIED_END_LSN: str(Lsn(applied)), lake.LOGGED_FROM_LSN: "0/10", lake.SLOT: "s"}


def test_a_new_table_takes_every_change_of_the_batch() -> None:
    assert table_window(Lsn(500), None) == Window(ZERO, Lsn(500))


def test_a_table_takes_what_is_past_both_its_snapshot_and_its_applied_end() -> None:
    assert table_window(Lsn(500), state(100, 300)) == Window(Lsn(300), Lsn(500))  # partly applied
    assert table_window(Lsn(500), state(400, 400)) == Window(Lsn(400), Lsn(500))  # straddles its snapshot


def test_a_window_inside_what_the_table_holds_is_empty() -> None:
    assert table_window(Lsn(300), state(100, 300)).empty  # the same batch again
    assert table_window(Lsn(200), state(100, 300)).empty  # a shorter window from an older slot position
    assert not table_window(Lsn(301), state(100, 300)).empty


def test_a_changelog_resumes_after_its_newest_commit_whatever_batch_id_it_had() -> None:
    history = [(3, {"added-data-files": "1"}), (2, logged(300)), (1, logged(200))]  # compaction on top
    assert logged_end(history) == Lsn(300)
    assert changelog_window(Lsn(500), Lsn(100), history) == Window(Lsn(300), Lsn(500))


def test_a_changelog_never_logs_what_the_snapshot_holds() -> None:
    assert changelog_window(Lsn(500), Lsn(400), [(1, logged(300))]) == Window(Lsn(400), Lsn(500))
    assert changelog_window(Lsn(500), Lsn(100), []) == Window(Lsn(100), Lsn(500))
    assert logged_end([]) == ZERO


def test_a_changelog_ahead_of_its_table_takes_nothing_twice() -> None:
    # The append committed, the merge did not (a crash between): the table redoes the batch alone.
    assert not table_window(Lsn(500), state(100, 300)).empty
    assert changelog_window(Lsn(500), Lsn(100), [(1, logged(500))]).empty
