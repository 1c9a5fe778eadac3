"""Which of a batch's changes a lake table and its changelog still take: exactly once per change.

A batch is a window of the slot's stream, and the same slot position can be read again with
another end: the staged files of an applied but unacknowledged batch were lost (a lifecycle rule,
the staging retention, a changed ``staging``), a promoted standby's copy of the slot lagged behind
the lake, or ``max_messages`` changed between a failed run and its retry. So what a table already
holds is decided per change, by its commit LSN (``_pgl_commit_lsn``, FORMATS.md), never by batch:

* a table holds every change below its base LSN (its snapshot) and below its applied end
  (``pgl.applied-end-lsn``): it takes the changes from the higher of the two up to the batch end;
* its changelog holds every change from the base LSN up to the applied end of its newest pipeline
  commit, which records the range it logged (``pgl.logged-from-lsn`` up to its applied end):
  it takes the changes from the higher of the two. The changelog is appended before the table's
  merge, so after a crash between them it is ahead of the table, never behind.

A window that lies wholly inside what the lake holds is empty: nothing is committed for it, and
the ack may move the slot past it. Standard library only: the Spark job ships it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from airflow_provider_postgres_cdc.formats.lake import TableState, state_of
from airflow_provider_postgres_cdc.formats.lsn import ZERO, Lsn


@dataclass(frozen=True, slots=True)
class Window:
    """The commit LSNs ``start <= lsn < end`` of a batch's changes still to be taken."""

    start: Lsn
    end: Lsn

    @property
    def empty(self) -> bool:
        """Nothing of the batch is left: the lake already holds every change below its end."""
        return self.start >= self.end


def table_window(batch_end: Lsn, state: TableState | None) -> Window:
    """The changes of a batch ending at ``batch_end`` that a table in ``state`` does not hold yet."""
    if state is None:
        return Window(ZERO, batch_end)
    return Window(max(state.base_lsn, state.applied_end_lsn), batch_end)


def logged_end(history: Iterable[tuple[int, Mapping[str, str]]]) -> Lsn:
    """Where a changelog's logged changes end, from its history (newest first): the applied end
    of its newest pipeline commit, ``0/0`` for a changelog with none (or none yet)."""
    state = state_of(history)
    return state.applied_end_lsn if state is not None else ZERO


def changelog_window(
    batch_end: Lsn, base_lsn: Lsn, history: Iterable[tuple[int, Mapping[str, str]]]
) -> Window:
    """The changes of a batch its table's changelog has not logged yet.

    ``base_lsn`` is the table's: changes below it are in the table's snapshot and are not logged.
    """
    return Window(max(base_lsn, logged_end(history)), batch_end)
