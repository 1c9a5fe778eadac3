"""Sensors of the Postgres CDC provider."""
