"""What every bench result records about its run: the command, the tree measured (ANVIL_COMMIT, else
the checkout's HEAD), the machine, the date and the 1-minute load average at the end."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def commit() -> str:
    """The tree measured: ANVIL_COMMIT (a device copy's git can be stale), else the checkout's HEAD."""
    if env := os.environ.get("ANVIL_COMMIT"):
        return env
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    return out.stdout.strip() or "unknown"


def run_meta(script: str) -> dict[str, Any]:
    """``script``: the bench's path as typed (e.g. "bench/link_latency.py"), for the command line."""
    try:
        load1: float | None = round(os.getloadavg()[0], 2)
    except OSError:
        load1 = None
    return {
        "command": f"python {script} " + " ".join(sys.argv[1:]),
        "commit": commit(),
        "machine": f"{platform.node()}, {platform.machine()}, {os.cpu_count()} CPUs",
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "load_1min_at_end": load1,
    }
