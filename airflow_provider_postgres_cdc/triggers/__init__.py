"""Deferrable triggers of the Postgres CDC provider (run by the Airflow triggerer)."""
