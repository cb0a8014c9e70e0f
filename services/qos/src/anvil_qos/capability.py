"""What this host lets the qos service observe: eBPF (root + BTF + tracefs) or only /proc."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Capability", "detect"]


@dataclass(frozen=True)
class Capability:
    mode: str  # "ebpf" or "procfs"
    reason: str  # why eBPF is not available, empty in ebpf mode


def detect() -> Capability:
    missing = []
    if os.geteuid() != 0:
        missing.append("not root")
    if not Path("/sys/kernel/btf/vmlinux").exists():
        missing.append("no BTF (/sys/kernel/btf/vmlinux)")
    if (
        not Path("/sys/kernel/tracing/events").is_dir()
        and not Path("/sys/kernel/debug/tracing/events").is_dir()
    ):
        missing.append("tracefs not mounted")
    if missing:
        return Capability("procfs", "; ".join(missing))
    return Capability("ebpf", "")
