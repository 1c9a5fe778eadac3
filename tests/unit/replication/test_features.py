"""The supported range: a feature newer than the server's major is refused by name, before any work."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from airflow_provider_postgres_cdc.errors import ServerFeatureError, ServerVersionError
from airflow_provider_postgres_cdc.replication import features


@dataclass
class Server:
    """What ``features`` reads from a psycopg2 connection: ``server_version``."""

    server_version: int


@pytest.mark.parametrize(
    ("feature", "first"),
    [
        (features.ROW_FILTERS, 15),
        (features.STANDBY_DECODING, 16),
        (features.PROTOCOL_4, 16),
        (features.FAILOVER_SLOTS, 17),
        (features.GENERATED_COLUMNS, 18),
        (features.IDLE_SLOT_TIMEOUT, 18),
    ],
)
def test_each_feature_needs_its_major(feature: str, first: int) -> None:
    assert features.supports(Server(first * 10000 + 3), feature)
    features.require(Server(first * 10000), feature)
    older = Server((first - 1) * 10000 + 9)
    assert not features.supports(older, feature)
    with pytest.raises(ServerFeatureError, match=f"need PostgreSQL {first} or later") as error:
        features.require(older, feature)
    assert isinstance(error.value, ServerVersionError)  # caught where too-old servers are
    assert features.FEATURES[feature][1] in str(error.value)
