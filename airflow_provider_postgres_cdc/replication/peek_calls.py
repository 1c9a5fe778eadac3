"""How the peek transport cuts one window into several SQL calls, so the server and the client overlap.

``pg_logical_slot_peek_binary_changes`` materialises its whole result before the first row leaves
the server, so with one call the client waits for the server's decoding, then decodes and stages
everything itself: the two add up. Calling ``pg_logical_slot_get_binary_changes`` with
``upto_nchanges`` on a temporary copy of the slot instead returns the window in runs of whole
transactions, each call starting where the last one ended (the copy's confirmed position), and
the server decodes the next run while the client works on the last one.

Each call decodes the WAL again from the copy's ``restart_lsn``, but only runs the output plugin
for what it returns; measured on 1M changes, re-reading the whole window costs about a seventh of
decoding it. So the calls are few: a small first one, so the client starts early, then about
:data:`LATER_CALLS` calls of equal size, estimated from the first call's messages per WAL byte.
A window whose WAL is shorter than the slot's backlog before it (``restart_lsn`` far behind, held
by a long transaction) is read in one call: every call would re-read that backlog.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from airflow_provider_postgres_cdc.formats.lsn import Lsn

FIRST_CALL_MESSAGES = 100_000
LATER_CALLS = 3
MAX_CALLS = 8
_INT4_MAX = 2**31 - 1


def worth_splitting(restart_lsn: Lsn, start: Lsn, upto_lsn: Lsn) -> bool:
    """Whether to read the window ``start``..``upto_lsn`` in several calls (see module docstring)."""
    return upto_lsn > start and start - restart_lsn <= upto_lsn - start


@dataclass(slots=True)
class PeekCalls:
    """The ``upto_nchanges`` of each call over the window ``start``..``upto_lsn``.

    The server stops a call at the first commit at or past ``upto_nchanges`` messages, so the
    calls end exactly where one call with ``max_messages`` would have: every call asks for at
    most what ``max_messages`` leaves. ``0`` means no limit (the last call reads to the bound).
    """

    start: Lsn
    upto_lsn: Lsn
    max_messages: int | None
    first: int
    calls: int = 0
    messages: int = 0
    _steady: int = 0

    def first_limit(self) -> int:
        """``upto_nchanges`` of the first call."""
        return self._limit(self.first)

    def next_limit(self, returned: int, asked: int, reached: Lsn) -> int | None:
        """After a call that asked for ``asked`` messages, returned ``returned`` and left the copy
        at ``reached``: the next call's ``upto_nchanges``, or ``None`` when the window is read."""
        self.calls += 1
        self.messages += returned
        if asked == 0 or returned < asked or reached >= self.upto_lsn:
            return None  # the server stopped at the bound, not at the count
        if self.max_messages is not None and self.messages >= self.max_messages:
            return None
        if self.calls + 1 >= MAX_CALLS:
            return self._limit(0)
        if not self._steady:
            self._steady = max(self.first, self._estimate_rest(reached) // LATER_CALLS + 1)
        return self._limit(self._steady)

    def _estimate_rest(self, reached: Lsn) -> int:
        """Messages left before ``upto_lsn``, at the density seen so far."""
        done_bytes = reached - self.start
        if done_bytes <= 0:
            return 0
        return math.ceil(self.messages * (self.upto_lsn - reached) / done_bytes)

    def _limit(self, wanted: int) -> int:
        """``wanted`` (0: no limit) within what ``max_messages`` leaves and the SQL int range."""
        if self.max_messages is not None:
            left = max(self.max_messages - self.messages, 1)
            wanted = left if wanted == 0 else min(wanted, left)
        return min(wanted, _INT4_MAX)
