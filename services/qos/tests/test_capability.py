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


def test_the_procfs_fallback_points_to_anvil_doctor(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from anvil_qos import observer

    monkeypatch.setattr(observer, "unavailable_reason", lambda: "not root (loading eBPF needs CAP_BPF)")
    obs = observer.open_observer()
    try:
        assert obs.mode == "procfs" and obs.reason.startswith("not root") and "anvil doctor" in obs.reason
    finally:
        obs.close()
