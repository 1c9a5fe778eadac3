"""The portable lake-name rule: a source name as a name that restrictive Iceberg catalogs take, and back.

Standard library only (shipped to the Spark job with the rest of ``formats``). AWS S3 Tables takes
only namespace and table names of 1 to 255 characters from ``a-z``, ``0-9`` and ``_`` that start
and end with a letter or digit, and no namespace that starts with ``aws``; SeaweedFS's Iceberg
REST catalog takes the same and ``-``. A portable name is one both take. PostgreSQL names may hold upper case,
spaces, quotes, dots and any Unicode, so ``LakeConfig(names="portable")`` writes each source
schema and table name through :func:`portable_name`:

* a *plain* name (lowercase ASCII words of letters and digits joined by single underscores,
  starting with a letter, not starting with ``aws``), which is what an unquoted PostgreSQL
  identifier usually is, stays as it is: ``orders``, ``order_items``, ``v2``;
* any other name becomes ``0`` followed by its characters, where ``a-z`` and ``0-9`` stand for
  themselves, ``_x`` for the upper-case letter ``X``, ``_0`` for ``_``, and ``_<n><n hex digits>``
  for any other character, its Unicode code point in lower-case hex: ``Orders`` -> ``0_orders``,
  ``My Schema`` -> ``0_my_220_schema``, ``v1.2 sales%`` -> ``0v1_22e2_220sales_225``.

The rule is injective (plain names start with a letter, the others with ``0``, and an escaped
name decodes one way only), so :func:`source_name` reads any name it produced back; and no name
it produces holds ``__``, so ``<name>__pgl_changelog`` can only be a changelog.
"""

from __future__ import annotations

import re

MAX_NAME_LENGTH = 255
"""The longest namespace or table name S3 Tables and SeaweedFS take."""
RESERVED_NAMESPACE_PREFIX = "aws"
"""S3 Tables refuses namespaces that start with it."""
ESCAPED_MARKER = "0"
"""First character of every escaped (not plain) portable name."""

_PLAIN = re.compile(r"[a-z][a-z0-9]*(?:_[a-z0-9]+)*")
_ACCEPTED = re.compile(r"[a-z0-9](?:[a-z0-9_]*[a-z0-9])?")
_HEX = re.compile(r"[0-9a-f]+")
_PREFIX = re.compile(r"[a-z0-9][a-z0-9_]*")


def is_plain(name: str) -> bool:
    """Whether ``name`` is its own portable name."""
    return _PLAIN.fullmatch(name) is not None and not name.startswith(RESERVED_NAMESPACE_PREFIX)


def _escape(char: str) -> str:
    if "a" <= char <= "z" or "0" <= char <= "9":
        return char
    if "A" <= char <= "Z":
        return "_" + char.lower()
    if char == "_":
        return "_0"
    digits = f"{ord(char):x}"
    return f"_{len(digits)}{digits}"


def portable_name(name: str) -> str:
    """``name`` as a portable namespace or table name (module docstring); :func:`source_name` inverts it."""
    if is_plain(name):
        return name
    return ESCAPED_MARKER + "".join(_escape(char) for char in name)


def source_name(portable: str) -> str | None:
    """The source name whose :func:`portable_name` is ``portable``; None when no name has it."""
    if not portable.startswith(ESCAPED_MARKER):
        return portable if is_plain(portable) else None
    chars: list[str] = []
    i = 1
    while i < len(portable):
        char = portable[i]
        code = portable[i + 1 : i + 2]
        if char != "_":
            chars.append(char)
            i += 1
        elif "a" <= code <= "z":
            chars.append(code.upper())
            i += 2
        elif code == "0":
            chars.append("_")
            i += 2
        elif code and code in "123456":
            digits = portable[i + 2 : i + 2 + int(code)]
            if len(digits) != int(code) or not _HEX.fullmatch(digits) or int(digits, 16) > 0x10FFFF:
                return None
            chars.append(chr(int(digits, 16)))
            i += 2 + int(code)
        else:
            return None
    name = "".join(chars)
    # Only the canonical spelling decodes: "0a" (an escaped plain name) or "_3041" (a leading zero)
    # would otherwise read back as a name whose lake name is another.
    return name if portable_name(name) == portable else None


def is_portable_prefix(prefix: str) -> bool:
    """Whether a namespace prefix, written before portable schema names as it is, keeps them portable."""
    return not prefix or _PREFIX.fullmatch(prefix) is not None


def refusal(name: str, *, namespace: bool) -> str | None:
    """Why SeaweedFS or S3 Tables would refuse ``name`` as a namespace or table name; None if both take it."""
    if len(name) > MAX_NAME_LENGTH:
        return f"it is {len(name)} characters long, over the {MAX_NAME_LENGTH} these catalogs take"
    if _ACCEPTED.fullmatch(name) is None:
        return "these catalogs take only a-z, 0-9 and _, starting and ending with a letter or digit"
    if namespace and name.startswith(RESERVED_NAMESPACE_PREFIX):
        return f"S3 Tables refuses namespaces that start with {RESERVED_NAMESPACE_PREFIX!r}"
    return None
