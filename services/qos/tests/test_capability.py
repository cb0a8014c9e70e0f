"""The qos service says which observation mode it can use, and why."""

from __future__ import annotations

import os

from anvil_qos.capability import detect


def test_mode_is_named_and_explained() -> None:
    cap = detect()
    assert cap.mode in ("ebpf", "procfs")
    if cap.mode == "procfs":
        assert cap.reason
    if os.geteuid() != 0:
        assert cap.mode == "procfs" and "not root" in cap.reason
