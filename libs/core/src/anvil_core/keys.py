"""Every Redis key Anvil uses, defined once (ARCHITECTURE.md, "Coordination")."""

from __future__ import annotations

__all__ = [
    "EVENTS",
    "PREFIX",
    "model_key",
    "profile_key",
    "qos_base_key",
    "qos_limits_key",
    "slo_key",
    "svc_key",
    "svc_pattern",
    "tenants_key",
]

PREFIX = "anvil:"
EVENTS = "anvil:events"  # pub/sub channel: JSON {"event": ..., ...}


def svc_key(kind: str, service_id: str) -> str:
    """Hash of one live service; expires unless heartbeated."""
    return f"anvil:svc:{kind}:{service_id}"


def svc_pattern(kind: str) -> str:
    return f"anvil:svc:{kind}:*"


def model_key(name: str) -> str:
    """Hash of one model: spec (JSON), status."""
    return f"anvil:model:{name}"


def profile_key(model: str, device: str) -> str:
    """Hash batch size -> latency in µs, learned from executor reports."""
    return f"anvil:profile:{model}:{device}"


def qos_limits_key() -> str:
    """Hash: field "{tenant}:{priority}" (or "{tenant}:*" or "*:{priority}") -> JSON
    {"rate_rps": float, "burst": int, "reason": str, "ts": float}. Written by qos (and `anvil qos set`),
    read by every gateway's token buckets; a missing field means unlimited."""
    return "anvil:qos:limits"


def qos_base_key() -> str:
    """Hash: field "{tenant}:{priority}" -> JSON {"rate_rps", "burst"}: the operator's base rates that
    qos throttles down from and restores to (`python -m anvil_qos.ctl base set ...`)."""
    return "anvil:qos:base"


def tenants_key() -> str:
    """Hash: sha256 hex of an API key -> tenant name (`anvil tenant add`)."""
    return "anvil:tenants"


def slo_key() -> str:
    """Hash: field "{priority}" -> JSON {"attainment": float 0..1, "p99_ms": float, "requests": int,
    "window_s": float, "ts": float}. Written by the scheduler every second, read by qos."""
    return "anvil:slo"
