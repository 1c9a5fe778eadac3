"""PostgreSQL log sequence numbers as an ordered value type."""

from __future__ import annotations

import re

_LSN_TEXT = re.compile(r"^([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})$")


class Lsn(int):
    """A WAL position: a 64-bit integer that prints as PostgreSQL does (``16/B374D848``).

    Subclassing ``int`` keeps ordering, hashing and arithmetic exact and free: the
    difference of two LSNs is a byte count, which is what replication lag is.
    """

    __slots__ = ()

    MAX = 0xFFFFFFFFFFFFFFFF

    def __new__(cls, value: int | str | Lsn) -> Lsn:
        if isinstance(value, str):
            return cls.parse(value)
        if not 0 <= value <= cls.MAX:
            raise ValueError(f"LSN {value} is outside 0..2**64-1")
        return super().__new__(cls, value)

    @classmethod
    def parse(cls, text: str) -> Lsn:
        """Parse PostgreSQL's ``X/Y`` text form (as returned by ``pg_lsn`` columns)."""
        match = _LSN_TEXT.match(text.strip())
        if match is None:
            raise ValueError(f"not an LSN: {text!r} (expected the form 'X/Y', e.g. '0/16B3748')")
        return super().__new__(cls, (int(match.group(1), 16) << 32) | int(match.group(2), 16))

    def __str__(self) -> str:
        return f"{int(self) >> 32:X}/{int(self) & 0xFFFFFFFF:X}"

    def __repr__(self) -> str:
        return f"Lsn('{self}')"


ZERO = Lsn(0)
