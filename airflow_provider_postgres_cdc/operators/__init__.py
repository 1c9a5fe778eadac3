"""Operators of the Postgres CDC provider: thin Airflow faces over the engine (snapshot, drain, apply)."""
