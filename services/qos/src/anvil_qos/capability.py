"""What this host lets the qos service observe: eBPF (root, tracefs, bcc, kernel headers) or only /proc.

A cheap check (no compile); `observer.open_observer` makes the final call by loading the probes.
"""

from __future__ import annotations

from dataclasses import dataclass

from anvil_qos.probes.bpf_loader import unavailable_reason

__all__ = ["Capability", "detect"]


@dataclass(frozen=True)
class Capability:
    mode: str  # "ebpf" or "procfs"
    reason: str  # why eBPF is not available, empty in ebpf mode


def detect() -> Capability:
    reason = unavailable_reason()
    return Capability("procfs", reason) if reason else Capability("ebpf", "")
