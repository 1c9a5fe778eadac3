"""Text from a SQL_ASCII database: raw bytes staged as Unicode, exactly and recoverably.

PostgreSQL converts text to the session's ``client_encoding`` (every connection asks for
UTF8, see ``replication/connection.py``), except in a SQL_ASCII database: there the server
stores bytes unchecked and cannot convert them, so the snapshot and the drain read them as
stored (``client_encoding=SQL_ASCII``) and apply this one rule (docs/FORMATS.md, "Text from a
SQL_ASCII database"):

* the value's bytes are read as UTF-8;
* every byte that is not part of a valid UTF-8 sequence becomes the code point U+10FE00 plus
  the byte (bytes 0x80-0xFF, so U+10FE80-U+10FEFF, in Unicode's private use plane 16);
* a valid sequence that itself encodes a code point of U+10FE80-U+10FEFF has each of its
  four bytes escaped the same way, so an escape is never ambiguous.

So valid UTF-8 text (what most SQL_ASCII databases hold) is staged unchanged, a value holds
escaped bytes exactly when it contains a code point of U+10FE80-U+10FEFF (the flag), and
:func:`raw_bytes` returns the stored bytes of any staged value. Escaping works on bytes, never
on ASCII, so COPY's backslash escapes and array or JSON syntax around a value are untouched.
"""

from __future__ import annotations

import re

import pyarrow as pa
import pyarrow.compute as pc

ESCAPE_BASE = 0x10FE00
"""Byte ``b`` (0x80-0xFF) that is not valid UTF-8 is staged as ``chr(ESCAPE_BASE + b)``."""

# Characters that must be written as escapes: Python's surrogateescape stand-ins for invalid
# bytes (U+DC80-U+DCFF) and real characters of the escape range.
_TO_ESCAPE = re.compile("[\udc80-\udcff\U0010fe80-\U0010feff]")
_ESCAPE_RANGE = "[\U0010fe80-\U0010feff]"
_STRING_OF = {
    pa.binary(): pa.string(),
    pa.large_binary(): pa.large_string(),
    pa.binary_view(): pa.string_view(),
}


def escape_bytes(raw: bytes) -> str:
    """The staged text of one stored value (the rule in the module docstring)."""
    text = raw.decode("utf-8", "surrogateescape")
    return _TO_ESCAPE.sub(_escape_match, text)


def _escape_match(match: re.Match[str]) -> str:
    return "".join(chr(ESCAPE_BASE + byte) for byte in match.group().encode("utf-8", "surrogateescape"))


def raw_bytes(staged: str) -> bytes:
    """The stored bytes of a value staged from a SQL_ASCII database (inverse of :func:`escape_bytes`)."""
    return "".join(
        chr(0xDC00 + ord(char) - ESCAPE_BASE) if 0x10FE80 <= ord(char) <= 0x10FEFF else char
        for char in staged
    ).encode("utf-8", "surrogateescape")


def escape_raw_text(values: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """A binary array of stored values as the matching string array, by :func:`escape_bytes`.

    Vectorised when every value is valid UTF-8 outside the escape range (the usual case);
    otherwise per value, in Python.
    """
    if isinstance(values, pa.ChunkedArray):
        return pa.chunked_array([escape_raw_text(chunk) for chunk in values.chunks], _STRING_OF[values.type])
    target = _STRING_OF[values.type]
    try:
        text = values.cast(target)
    except pa.ArrowInvalid:
        pass
    else:
        plain = text if target == pa.string() else text.cast(pa.string())
        if not pc.any(pc.match_substring_regex(plain, _ESCAPE_RANGE)).as_py():
            return text
    return pa.array([None if v is None else escape_bytes(v) for v in values.to_pylist()], target)
