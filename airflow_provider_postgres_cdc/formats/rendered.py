"""A per-table option as a templated operator argument renders it: the text back to its value.

A DAG param holding a mapping reaches an operator as text once Jinja renders it: JSON through
``{{ params.x | tojson }}`` (the factories' DAGs), or Python's repr through a plain
``{{ params.x }}``. Standard library only, like the options' modules that use it.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Callable, Mapping
from typing import Any


def rendered_value(text: str) -> object:
    """The value ``text`` renders: JSON, else a Python literal; ``ValueError`` when it is neither."""
    try:
        return json.loads(text)
    except ValueError:
        try:
            return ast.literal_eval(text)
        except (ValueError, SyntaxError):
            raise ValueError(f"neither JSON nor a Python literal: {text!r}") from None


def rendered_mapping(option: object, error: Callable[[object], Exception]) -> Mapping[str, Any] | None:
    """A per-table option as a mapping: itself, or the mapping its rendered text holds; None when
    nothing is given (None or blank text). Anything else raises ``error(option)``."""
    if option is None or (isinstance(option, str) and not option.strip()):
        return None
    if isinstance(option, str):
        try:
            option = rendered_value(option)
        except ValueError:
            raise error(option) from None
    if not isinstance(option, Mapping):
        raise error(option)
    return option
