"""Typed settings shared by every service; each service subclasses `ServiceSettings`.

Every field can be overridden from the environment as ``ANVIL_<FIELD>`` (upper case), e.g.
``ANVIL_REDIS_URL``. compose.yaml sets the same variables, so `make up` and containers agree.
"""

from __future__ import annotations

import os
import socket
import uuid

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["ServiceSettings", "redact_url"]


def _default_service_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class ServiceSettings(BaseSettings):
    """Settings every Anvil process reads at start-up."""

    model_config = SettingsConfigDict(env_prefix="ANVIL_", frozen=True, extra="ignore")

    # Where the registry lives. The launcher starts an embedded server when this is unset.
    redis_url: str = "redis://127.0.0.1:6379/0"
    # Unique per process; the registry key is anvil:svc:{kind}:{service_id}.
    service_id: str = Field(default_factory=_default_service_id)
    log_level: str = "INFO"
    # Heartbeat every interval; the key expires after ttl, so a killed service disappears from
    # the registry within ttl. 3 heartbeats per TTL tolerates one late beat without flapping.
    heartbeat_interval_ms: int = 1000
    heartbeat_ttl_ms: int = 3000
    # Prometheus /metrics port of this process (Triton's default 8002 belongs to the gateway).
    metrics_port: int = 8002
    # Interface to bind sockets on, and the host name other services use to reach this one.
    bind_host: str = "0.0.0.0"
    advertise_host: str = "127.0.0.1"

    @property
    def heartbeat_interval_s(self) -> float:
        return self.heartbeat_interval_ms / 1000.0

    @property
    def heartbeat_ttl_s(self) -> float:
        return self.heartbeat_ttl_ms / 1000.0


def redact_url(url: str) -> str:
    """Strip the password from a URL before it is logged (``redis://:secret@h`` → ``redis://:***@h``)."""
    if "@" not in url or "://" not in url:
        return url
    scheme, rest = url.split("://", 1)
    creds, host = rest.rsplit("@", 1)
    user = creds.split(":", 1)[0] if ":" in creds else creds
    return f"{scheme}://{user}:***@{host}"
