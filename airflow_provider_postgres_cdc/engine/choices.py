"""The engine's enumerated settings, as ``Literal`` types and the tuples of their values.

Kept apart from the modules that act on them (``drain``, ``snapshot``), which load pyarrow, so the
Airflow faces can check a DAG's arguments when it is parsed without loading the engine.
"""

from __future__ import annotations

from typing import Literal, get_args

Transport = Literal["peek", "stream"]
TRANSPORTS: tuple[Transport, ...] = get_args(Transport)

SlotMode = Literal["create", "temporary", "recover"]
SLOT_MODES: tuple[SlotMode, ...] = get_args(SlotMode)

CopyEngine = Literal["local", "spark"]
COPY_ENGINES: tuple[CopyEngine, ...] = get_args(CopyEngine)
