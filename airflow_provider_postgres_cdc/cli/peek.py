"""``pgcdc peek``: print a slot's pending pgoutput messages as JSON lines, without consuming them.

It reads with ``pg_logical_slot_peek_binary_changes``, so the slot does not move; the output is
one JSON object per message, values in PostgreSQL's text form, for debugging what a drain would
see. Changes look like::

    {"op": "update", "lsn": "0/16B3748", "xid": 731, "schema": "public", "table": "t",
     "new": {"id": "1", "big": null}, "old": null, "key": {"id": "1"}, "unchanged_toast": ["big"]}
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from typing import Any

from airflow_provider_postgres_cdc.cli.common import add_connection_arguments, open_connection
from airflow_provider_postgres_cdc.formats.lsn import Lsn
from airflow_provider_postgres_cdc.formats.pgtypes import pg_timestamp
from airflow_provider_postgres_cdc.pgoutput.decoder import PgOutputDecoder
from airflow_provider_postgres_cdc.pgoutput.messages import (
    TRUNCATE_CASCADE,
    TRUNCATE_RESTART_IDENTITY,
    Begin,
    Commit,
    Delete,
    Insert,
    LogicalMessage,
    Message,
    Relation,
    Truncate,
    TupleData,
    TupleKind,
    Update,
)
from airflow_provider_postgres_cdc.replication.connection import read_raw_text
from airflow_provider_postgres_cdc.replication.publications import publication_names_option

_FETCH_ROWS = 2000


def peek_options(args: argparse.Namespace) -> list[str]:
    """The pgoutput options as the flat name/value list the peek function takes."""
    options = [
        "proto_version",
        str(args.proto_version),
        "publication_names",
        publication_names_option(args.publications),
    ]
    if args.streaming:
        options += ["streaming", "on"]
    if args.binary:
        options += ["binary", "true"]
    if args.messages:
        options += ["messages", "true"]
    return options


def _timestamp(value: int) -> str:
    """A pgoutput timestamp (microseconds since 2000-01-01 UTC) as ISO 8601."""
    return pg_timestamp(value).isoformat()


def _value(data: TupleData, index: int) -> Any:
    """Text values as text; binary-format ones (``--binary``) as ``{"binary": hex}``."""
    value = data.values[index]
    if value is None:
        return None
    if data.kinds[index] == TupleKind.BINARY:
        return {"binary": value.hex()}
    return value.decode("utf-8", errors="replace")


def _row(relation: Relation, data: TupleData | None, only_keys: bool = False) -> dict[str, Any] | None:
    if data is None:
        return None
    return {
        column.name: _value(data, i)
        for i, column in enumerate(relation.columns)
        if not (only_keys and not column.is_key) and not data.is_unchanged(i)
    }


def describe(message: Message, decoder: PgOutputDecoder, lsn: str, xid: int) -> Iterator[dict[str, Any]]:
    """The JSON objects printed for one message (a truncate prints one per relation)."""
    head: dict[str, Any] = {"lsn": lsn, "xid": xid}
    if isinstance(message, Begin):
        yield {
            "op": "begin",
            **head,
            "final_lsn": str(message.final_lsn),
            "commit_time": _timestamp(message.commit_time),
        }
    elif isinstance(message, Commit):
        yield {
            "op": "commit", **head, "commit_lsn": str(message.commit_lsn), "end_lsn": str(message.end_lsn),
            "commit_time": _timestamp(message.commit_time),
        }  # fmt: skip
    elif isinstance(message, Insert | Update | Delete):
        relation = decoder.relations[message.relation_id]
        new = None if isinstance(message, Delete) else message.new
        old = None if isinstance(message, Insert) else message.old
        old_kind = None if isinstance(message, Insert) else message.old_kind
        op = {Insert: "insert", Update: "update", Delete: "delete"}[type(message)]
        key_source = old if old is not None else new
        yield {
            "op": op, **head, "schema": relation.namespace, "table": relation.name,
            "new": _row(relation, new),
            "old": _row(relation, old) if old_kind == "O" else None,
            "key": _row(relation, key_source, only_keys=True),
            "unchanged_toast": [] if new is None else [
                c.name for i, c in enumerate(relation.columns) if new.is_unchanged(i)
            ],
        }  # fmt: skip
    elif isinstance(message, Truncate):
        for relation_id in message.relation_ids:
            relation = decoder.relations[relation_id]
            yield {
                "op": "truncate", **head, "schema": relation.namespace, "table": relation.name,
                "new": None, "old": None, "key": None, "unchanged_toast": [],
                "cascade": bool(message.options & TRUNCATE_CASCADE),
                "restart_identity": bool(message.options & TRUNCATE_RESTART_IDENTITY),
            }  # fmt: skip
    elif isinstance(message, LogicalMessage):
        yield {
            "op": "message", **head, "transactional": message.transactional, "prefix": message.prefix,
            "content": message.content.decode("utf-8", errors="replace"),
            "content_hex": message.content.hex(),
        }  # fmt: skip
    else:
        yield {"op": _snake(type(message).__name__), **head, **_plain_fields(message)}


def _snake(name: str) -> str:
    return "".join("_" + c.lower() if c.isupper() else c for c in name).lstrip("_")


def _plain_fields(message: Message) -> dict[str, Any]:
    """Other messages (relation, stream_start...): their fields, LSNs as text, times as ISO."""
    fields: dict[str, Any] = {}
    for name in getattr(message, "__slots__", ()):
        value = getattr(message, name)
        if isinstance(value, Lsn):
            value = str(value)
        elif name.endswith("_time") and isinstance(value, int):
            value = _timestamp(value)
        elif isinstance(value, tuple):
            value = [
                {"name": c.name, "type_oid": c.type_oid, "typmod": c.typmod, "key": c.is_key} for c in value
            ]
        fields[name] = value
    return fields


def run_peek(args: argparse.Namespace) -> int:
    decoder = PgOutputDecoder(args.proto_version)
    upto = None if args.upto_lsn is None else str(Lsn.parse(args.upto_lsn))
    placeholders = ", ".join(["%s"] * len(peek_options(args)))
    query = (
        "SELECT lsn::text, xid::text, data FROM pg_logical_slot_peek_binary_changes"
        f"(%s, %s::pg_lsn, %s, {placeholders})"
    )
    with open_connection(args) as conn:
        read_raw_text(conn)  # SQL_ASCII: show stored bytes (replacing what is not UTF-8), not an error
        conn.autocommit = False  # a server-side cursor streams rows instead of loading them all
        with conn.cursor(name="postgres_cdc_peek") as cursor:
            cursor.itersize = _FETCH_ROWS
            cursor.execute(query, [args.slot_name, upto, args.limit, *peek_options(args)])
            for lsn, xid, data in cursor:
                message = decoder.decode(bytes(data), Lsn.parse(lsn))
                for line in describe(message, decoder, lsn, int(xid)):
                    sys.stdout.write(json.dumps(line) + "\n")
        conn.rollback()
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    peek = subparsers.add_parser(
        "peek", help="print a slot's pending changes as JSON lines without consuming them (pgoutput)"
    )
    add_connection_arguments(peek)
    peek.add_argument("--slot-name", required=True, help="logical replication slot using pgoutput")
    peek.add_argument(
        "--publications",
        dest="publications",
        action="extend",
        nargs="+",
        required=True,
        metavar="NAME",
        help="publications to decode with (one or more)",
    )
    peek.add_argument("--upto-lsn", metavar="LSN", help="stop at this LSN (X/Y)")
    peek.add_argument(
        "--limit",
        type=int,
        metavar="N",
        help="stop after the transaction in which N messages were reached (the server's upto_nchanges)",
    )
    peek.add_argument("--proto-version", type=int, choices=(1, 2, 3, 4), default=1, help="pgoutput protocol")
    peek.add_argument("--streaming", action="store_true", help="stream large in-progress transactions (>= 2)")
    peek.add_argument(
        "--binary", action="store_true", help="binary-format values, printed as {'binary': hex}"
    )
    peek.add_argument("--messages", action="store_true", help="include pg_logical_emit_message messages")
    peek.set_defaults(func=run_peek)
