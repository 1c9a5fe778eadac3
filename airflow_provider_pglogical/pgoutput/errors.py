"""The decoder's one exception type."""

from __future__ import annotations

from airflow_provider_pglogical.errors import PgLogicalError
from airflow_provider_pglogical.formats.lsn import Lsn


class PgOutputDecodeError(PgLogicalError):
    """A pgoutput message could not be decoded: truncated, unknown, or inconsistent with the stream.

    :param message_type: the message's type character (``"I"``, ``"R"``...), or ``"?"`` when the
        buffer is empty.
    :param offset: byte offset within the message where decoding failed.
    :param lsn: the message's LSN when the caller knows it.
    """

    def __init__(self, reason: str, *, message_type: str, offset: int, lsn: Lsn | None = None) -> None:
        self.reason = reason
        self.message_type = message_type
        self.offset = offset
        self.lsn = lsn
        where = f" at LSN {lsn}" if lsn is not None else ""
        super().__init__(
            f"cannot decode pgoutput message {message_type!r}{where}, byte {offset}: {reason}. Nothing of "
            "the batch was staged and the slot did not move; print the messages there with `pglogical "
            "peek --slot <slot>` and report them with the server version"
        )
