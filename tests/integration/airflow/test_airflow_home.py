"""A home copied from the test kit's migrated template is a migrated home of its own.

Both homes copy this virtualenv's template (the first makes it, if no earlier test did); Airflow must
find the copied DB at its head revision, and each home's airflow.cfg must point at its own files and
hold its own secrets: a path left pointing into the template would run every test on one shared DB.
"""

from __future__ import annotations

import configparser
import filecmp
from pathlib import Path

import pytest
from cryptography.fernet import Fernet

from airflow_provider_postgres_cdc.testing.airflow_home import AirflowHome

pytestmark = [pytest.mark.integration, pytest.mark.airflow]


def config(home: AirflowHome) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    parser.read_string((home.home / "airflow.cfg").read_text())
    return parser


@pytest.mark.timeout(300)
def test_a_copied_home_is_at_the_head_revision_with_its_own_files_and_secrets(tmp_path: Path) -> None:
    assert AirflowHome.template_dir is not None
    first, second = (AirflowHome(tmp_path / name, tmp_path / "dags") for name in ("first", "second"))
    first.migrate()
    second.migrate()
    # Two migrations differ (their log_template rows' timestamps); two copies of one template do not.
    assert filecmp.cmp(first.home / "airflow.db", second.home / "airflow.db", shallow=False)

    result = second.airflow("db", "check-migrations", "--migration-wait-timeout", "1")
    assert result.returncode == 0, result.stdout[-4000:]

    text = (second.home / "airflow.cfg").read_text()
    assert str(AirflowHome.template_dir) not in text
    for placeholder in ["{AIRFLOW_HOME}", "{FERNET_KEY}", "{SECRET_KEY}", "{JWT_SECRET_KEY}"]:
        assert placeholder not in text
    ours, theirs = config(second), config(first)
    assert ours.get("database", "sql_alchemy_conn") == f"sqlite:///{second.home}/airflow.db"
    assert ours.get("logging", "base_log_folder") == f"{second.home}/logs"
    for section, option in [("core", "fernet_key"), ("api", "secret_key"), ("api_auth", "jwt_secret")]:
        assert ours.get(section, option) not in ("", theirs.get(section, option))
    Fernet(ours.get("core", "fernet_key"))  # raises unless a valid key
