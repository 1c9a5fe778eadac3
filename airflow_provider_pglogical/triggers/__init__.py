"""Deferrable triggers of the pglogical provider (run by the Airflow triggerer)."""
