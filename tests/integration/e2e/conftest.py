"""End-to-end tests share e2e_support.py; --import-mode=importlib keeps test directories off sys.path."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
