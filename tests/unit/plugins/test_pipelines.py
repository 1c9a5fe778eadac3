"""The report view's pipelines Variable: the pipeline vocabulary of the DAGs, refused with what to write."""

from __future__ import annotations

import pytest

from airflow_provider_postgres_cdc.errors import LakeConfigError
from airflow_provider_postgres_cdc.plugins.pipelines import PipelineSpec, parse_pipelines


def test_pipelines_are_read_with_the_dags_names() -> None:
    text = '[{"postgres_conn_id": "db", "slot_name": "s", "lake_conn_id": "lk", "publications": ["p", "q"]}]'
    assert parse_pipelines(text) == [PipelineSpec("db", "s", "lk", ("p", "q"), 10.0)]
    (one,) = parse_pipelines('[{"postgres_conn_id": "db", "slot_name": "s", "lake_conn_id": "lk", '
                             '"publications": "p", "timeout": 3}]')  # fmt: skip
    assert (one.publications, one.timeout) == (("p",), 3.0)
    assert parse_pipelines(None) == parse_pipelines("") == []


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[{", "not valid JSON"),
        ('{"postgres_conn_id": "db"}', "must be a JSON list of pipelines"),
        (
            '[{"conn_id": "db", "slot": "s", "lake_conn_id": "lk"}]',
            r"needs string postgres_conn_id, slot_name and lake_conn_id .*\"slot_name\": \"\.\.\.\"",
        ),
    ],
)
def test_a_wrong_variable_is_refused_saying_what_to_write(text: str, message: str) -> None:
    with pytest.raises(LakeConfigError, match=message):
        parse_pipelines(text)
