"""Operators of the pglogical provider: thin Airflow faces over the engine (snapshot, drain, apply)."""
