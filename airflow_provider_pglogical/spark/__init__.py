"""The PySpark apply job, shipped as a file for ``spark-submit`` (it imports nothing from this package)."""

from __future__ import annotations

from pathlib import Path

APPLY_JOB_PATH = str(Path(__file__).with_name("apply_batch.py"))
