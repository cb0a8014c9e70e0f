"""The observer contract, the eBPF observer, and the choice between it and the /proc fallback.

An observer turns the current targets into cumulative readings (`samples.Sample`). The qos service
owns exactly one, calls `set_targets` whenever the registry changes (at most once a tick) and
`sample` once a tick, both from one thread, and `close` once at shutdown.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Protocol

from anvil_qos.probes.bpf_loader import BpfUnavailable, unavailable_reason
from anvil_qos.procfs import ProcfsObserver
from anvil_qos.samples import Sample
from anvil_qos.targets import Target

if TYPE_CHECKING:
    from anvil_qos.probes.cuda import CudaProbe
    from anvil_qos.probes.tcp import TcpProbe

__all__ = ["EbpfObserver", "Observer", "open_observer"]


class Observer(Protocol):
    mode: str  # "ebpf" or "procfs", reported in the registry record and metrics
    reason: str  # why eBPF is off ("" in ebpf mode)

    def set_targets(self, targets: Sequence[Target], ports: Iterable[int]) -> None:
        """Watch exactly these processes and local TCP ports from now on. A newly added target's
        counters start at zero; a removed one's are dropped."""

    def sample(self) -> Sample:
        """Cumulative readings for the current targets (a target that died is left out)."""

    def close(self) -> None:
        """Detach everything; the observer is unusable afterwards."""


class EbpfObserver:
    """Run-queue + CPU probe on every target, TCP probe on the ports, CUDA probe on executors."""

    mode = "ebpf"
    reason = ""

    def __init__(self, cuda_library: str = "", cuda_probe: bool = True) -> None:
        # Imported here: the probes pull in bcc, which the /proc path must not need.
        from anvil_qos.probes.cuda import CudaProbe
        from anvil_qos.probes.runqueue import RunQueueProbe
        from anvil_qos.probes.tcp import TcpProbe

        self.runqueue = RunQueueProbe()
        self.tcp: TcpProbe | None = None
        self.cuda: CudaProbe | None = None
        try:
            self.tcp = TcpProbe()
            self.cuda = CudaProbe(cuda_library) if cuda_probe else None
        except BaseException:
            self.close()
            raise

    @property
    def notes(self) -> tuple[str, ...]:
        if self.cuda is None:
            return ("GPU probe off by settings (ANVIL_CUDA_PROBE=0)",)
        return (self.cuda.off_reason,) if self.cuda.off_reason else ()

    def set_targets(self, targets: Sequence[Target], ports: Iterable[int]) -> None:
        self.runqueue.set_targets(targets)
        if self.tcp is not None:
            self.tcp.set_ports(set(ports) | {t.port for t in targets if t.port})
        if self.cuda is not None:
            self.cuda.set_targets([t for t in targets if t.kind == "executor"])

    def sample(self) -> Sample:
        from anvil_qos.probes.cuda import REDISCOVER_S

        if self.cuda is not None and time.monotonic() - self.cuda.discovered_at > REDISCOVER_S:
            self.cuda.discover()
        return Sample(
            "ebpf",
            time.monotonic(),
            tuple(self.runqueue.read()),
            tuple(self.tcp.read()) if self.tcp else (),
            tuple(self.cuda.read()) if self.cuda else (),
            self.notes,
        )

    def close(self) -> None:
        for probe in (self.cuda, self.tcp, self.runqueue):
            if probe is not None:
                probe.close()


def open_observer(force_procfs: bool = False, cuda_library: str = "", cuda_probe: bool = True) -> Observer:
    """The eBPF observer where it can load, else the /proc one carrying the reason (never raises
    for a missing capability: qos always runs, honestly labelled)."""
    if force_procfs:
        return ProcfsObserver("procfs forced by settings (ANVIL_FORCE_PROCFS)")
    reason = unavailable_reason()
    if not reason:
        try:
            return EbpfObserver(cuda_library, cuda_probe)
        except BpfUnavailable as exc:
            reason = str(exc)
    return ProcfsObserver(f"{reason} (`anvil doctor` lists each missing item and its fix)")
