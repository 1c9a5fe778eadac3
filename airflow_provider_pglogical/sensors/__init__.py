"""Sensors of the pglogical provider."""
