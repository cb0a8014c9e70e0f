"""bench/link_latency.py: every transport carries its round trips to a fresh echo process and back,
and the echo process ends when told (the timings themselves are the bench's, not asserted here)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from link_latency import TRANSPORTS, run_transport


@pytest.mark.parametrize("name", TRANSPORTS)
def test_each_transport_echoes_every_message(tmp_path: Path, name: str) -> None:
    rtt = run_transport(name, 64, 20, 0.0, tmp_path)
    assert len(rtt) == 20 and all(t > 0 for t in rtt)
    assert not (tmp_path / f"{name}.sock").exists()  # the socket file is removed with its echo process
