"""Subcommands of the ``pglogical`` CLI, one module each, each exposing ``register(subparsers)``."""
