"""Publication names as pgoutput's ``publication_names`` option wants them."""

from __future__ import annotations

import pytest

from airflow_provider_postgres_cdc.replication.publications import publication_names_option


def test_publication_names_are_quoted_as_identifiers() -> None:
    assert publication_names_option(["pub", "Mixed,Case", 'q"uote']) == '"pub","Mixed,Case","q""uote"'
    with pytest.raises(ValueError):
        publication_names_option([])
