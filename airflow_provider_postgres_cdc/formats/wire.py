"""Byte layouts of pgoutput's fixed-width message parts, defined once for every reader.

Each layout is what follows the message's type byte (and, inside a streamed chunk, its Xid), in
network order, as the message-format page lists the fields: the per-message decoder unpacks
them, the columnar decoder reads the same fields of many messages at once at the offsets
:func:`field_offsets` derives, and the drain's sequencing and transports read commit positions
with them. Standard library only, so the decoder and the replication layer share it.
"""

from __future__ import annotations

import struct

BEGIN = struct.Struct("!QqI")
"""Begin: Int64 final LSN, Int64 commit time, Int32 xid."""
COMMIT = struct.Struct("!BQQq")
"""Commit: Int8 flags, Int64 commit LSN, Int64 end LSN, Int64 commit time."""
STREAM_START = struct.Struct("!IB")
"""Stream Start: Int32 xid, Int8 first-segment flag."""
STREAM_COMMIT = struct.Struct("!IBQQq")
"""Stream Commit: Int32 xid, Int8 flags, Int64 commit LSN, Int64 end LSN, Int64 commit time."""
STREAM_ABORT = struct.Struct("!II")
"""Stream Abort: Int32 xid, Int32 subtransaction xid."""
STREAM_ABORT_V4 = struct.Struct("!IIQq")
"""Stream Abort with protocol 4 and ``streaming = parallel``: plus Int64 abort LSN and time."""
BEGIN_PREPARE_HEAD = struct.Struct("!QQqI")
"""Begin Prepare before its gid: Int64 prepare LSN, Int64 end LSN, Int64 prepare time, Int32 xid."""
PREPARE_HEAD = struct.Struct("!BQQqI")
"""Prepare, Commit Prepared and Stream Prepare before their gid: Int8 flags, two Int64 LSNs, Int64
time, Int32 xid."""
ROLLBACK_PREPARED_HEAD = struct.Struct("!BQQqqI")
"""Rollback Prepared before its gid: Int8 flags, two Int64 end LSNs, two Int64 times, Int32 xid."""
COLUMN_TAIL = struct.Struct("!Ii")
"""A Relation message's column after its name: Int32 type OID, Int32 typmod."""


def field_offsets(layout: struct.Struct) -> tuple[int, ...]:
    """Where each field of ``layout`` starts in a message, counting the type byte before it."""
    offsets = []
    position = 1
    for code in layout.format.lstrip("!"):
        offsets.append(position)
        position += struct.calcsize("!" + code)
    return tuple(offsets)
