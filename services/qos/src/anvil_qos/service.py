"""The qos process. The foundation registers, detects what the host allows and says it once; probes
and the throttling policy land with their own issue."""

from __future__ import annotations

import asyncio

from anvil_core.logs import get_logger
from anvil_core.metrics import serve_metrics
from anvil_core.registry import Registry
from prometheus_client import Gauge

from anvil_qos.capability import detect
from anvil_qos.settings import QosSettings

__all__ = ["Qos"]

log = get_logger("anvil.qos")
mode_gauge = Gauge("anvil_qos_mode", "1 for the active observation mode", ["mode"])


class Qos:
    def __init__(self, settings: QosSettings) -> None:
        self.s = settings
        self.capability = detect()
        self.registry = Registry(
            settings.redis_url,
            "qos",
            settings.service_id,
            settings.heartbeat_ttl_s,
            settings.heartbeat_interval_s,
            fields=lambda: {"mode": self.capability.mode, "reason": self.capability.reason},
        )

    async def run(self, stop: asyncio.Event) -> None:
        serve_metrics(self.s.metrics_port, "qos", self.s.service_id)
        mode_gauge.labels(mode=self.capability.mode).set(1)
        if self.capability.mode != "ebpf":
            log.warning("eBPF unavailable; observing through /proc", extra={"reason": self.capability.reason})
        await self.registry.start()
        await stop.wait()
        await self.registry.stop()
