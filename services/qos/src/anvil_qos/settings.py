"""QoS settings (env: ANVIL_<FIELD>)."""

from __future__ import annotations

from anvil_core.settings import ServiceSettings

__all__ = ["QosSettings"]


class QosSettings(ServiceSettings):
    metrics_port: int = 8006
