"""Checks of operator arguments that run when a DAG is parsed, or once a templated value is rendered.

A wrong choice or a missing staging root then fails the DAG file's import (or the task, for a
template) with a message naming what to pass, instead of failing deep in the engine at run time.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def is_template(value: Any) -> bool:
    """A Jinja template Airflow renders before ``execute`` (checked only once rendered)."""
    return isinstance(value, str) and "{{" in value


def check_choice(argument: str, value: Any, choices: Iterable[str]) -> None:
    """Raise ``ValueError`` naming the valid ``choices`` unless ``value`` is one (or is a template)."""
    valid = tuple(choices)
    if not is_template(value) and value not in valid:
        raise ValueError(f"{argument} must be one of {', '.join(map(repr, valid))}, not {value!r}")


def check_staging(staging: Any) -> None:
    """Raise ``ValueError`` unless a staging root is given: there is no default location."""
    if not is_template(staging) and not (isinstance(staging, str) and staging.strip()):
        raise ValueError(
            f"staging must name the staging root, a local path or a file://, s3://, gs:// or hdfs:// URI "
            f"that every worker reaches (the pipeline DAGs take it as the 'staging' param), not {staging!r}"
        )


def check_positive(argument: str, value: Any) -> None:
    """Raise ``ValueError`` unless ``value`` is a positive whole number (or is a template)."""
    if is_template(value):
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{argument} must be a positive whole number, not {value!r}")


def rendered_positive(argument: str, value: Any) -> int:
    """``value`` once Airflow rendered it (a template renders to text) as a positive whole number;
    ``ValueError`` as :func:`check_positive` raises it otherwise."""
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    check_positive(argument, value)
    return int(value)
