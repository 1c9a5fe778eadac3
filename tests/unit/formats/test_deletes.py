"""The ``deletes`` option: one mode for every table or a mapping naming tables, as given in Python,
as JSON or as a template renders it, and the errors of a bad one (its refusals of a keyless table
or a switch: test_table_modes.py)."""

from __future__ import annotations

import pytest

from airflow_provider_postgres_cdc.errors import DeletesOptionError
from airflow_provider_postgres_cdc.formats.deletes import (
    DELETES_PROPERTY,
    mode_for,
    option_text,
    parse_deletes,
    recorded_mode,
)


@pytest.mark.parametrize(
    ("option", "parsed"),
    [
        (None, None),
        ("", None),
        ({}, None),
        ("{}", None),
        ("soft", "soft"),
        (" hard ", "hard"),
        ('"soft"', "soft"),  # {{ params.deletes | tojson }} of a text
        ({"public.orders": "soft"}, {"public.orders": "soft"}),
        ('{"public.orders": "soft"}', {"public.orders": "soft"}),
        ("{'public.orders': 'hard'}", {"public.orders": "hard"}),  # a plain {{ params.deletes }}
    ],
)
def test_the_option_reads_every_way_it_is_given(option: object, parsed: object) -> None:
    assert parse_deletes(option) == parsed  # type: ignore[arg-type]
    assert parse_deletes(option_text(parse_deletes(option))) == parsed  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("Soft", 'deletes is "hard" or "soft" for every table'),
        ("[1]", 'deletes is "hard" or "soft" for every table'),
        ({"orders": "soft"}, "'orders' is not a schema.table name"),
        ({"public.orders": "archive"}, "must be 'hard' or 'soft', not 'archive'"),
    ],
)
def test_a_bad_option_says_what_to_write(option: object, message: str) -> None:
    with pytest.raises(DeletesOptionError, match=message.replace("(", r"\(")):
        parse_deletes(option)  # type: ignore[arg-type]


def test_a_table_the_option_does_not_name_keeps_its_recorded_mode() -> None:
    option = parse_deletes({"public.orders": "soft"})
    assert mode_for(option, "public.orders") == "soft"
    assert mode_for(option, "public.items") is None
    assert mode_for("hard", "public.items") == "hard" and mode_for(None, "public.items") is None
    assert recorded_mode({DELETES_PROPERTY: "soft"}) == "soft" and recorded_mode({}) == "hard"
