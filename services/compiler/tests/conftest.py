"""Test helpers of the compiler: make this directory importable (model builders)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
