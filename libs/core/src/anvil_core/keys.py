"""Every Redis key Anvil uses, defined once (ARCHITECTURE.md, "Coordination")."""

from __future__ import annotations

import re

__all__ = [
    "EVENTS",
    "PREFIX",
    "TENANT_NAME",
    "artifact_key",
    "check_tenant",
    "gateway_stats_key",
    "gateway_stats_pattern",
    "model_key",
    "model_unloaded_key",
    "model_versions_key",
    "profile_key",
    "qos_base_key",
    "qos_limits_key",
    "served_key",
    "shm_key",
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


def gateway_stats_key(service_id: str) -> str:
    """String: one gateway process's Triton statistics (JSON list of model entries, its share),
    rewritten with its registry entry's TTL at every heartbeat; the others add it to their answers."""
    return f"anvil:gwstats:{service_id}"


def gateway_stats_pattern() -> str:
    return "anvil:gwstats:*"


def model_key(name: str) -> str:
    """Hash of one model's deployed (served) version: spec (JSON, the plan's), status (COMPILED),
    version, artifact, artifact_dir, placement (fields in ``anvil_core.deployments``). Written by the
    operator's tools only (`anvil deploy` / `undeploy`); every service reads it."""
    return f"anvil:model:{name}"


def model_unloaded_key(name: str) -> str:
    """Hash {reason, ts}: the model is unloaded (the repository API's unload, `anvil undeploy`):
    nothing may serve it while the key exists. Written by the operator's tools and the gateway
    (the repository API's load deletes it); read by every service."""
    return f"anvil:unloaded:{name}"


def served_key(executor_id: str) -> str:
    """Hash of what one executor serves, warm: model name -> JSON {artifact, version, spec} (the spec
    it serves). Rewritten whole by that executor at every beat, with its registry entry's TTL, so it
    disappears with the executor (``anvil_core.deployments.publish_served``)."""
    return f"anvil:served:{executor_id}"


def model_versions_key(name: str) -> str:
    """Hash of one model's repository: version -> JSON {artifact, artifact_dir, spec, placement,
    deployed_at} (``anvil_core.deployments``). Outside ``model_key("*")``'s pattern on purpose."""
    return f"anvil:versions:{name}"


def artifact_key(artifact_id: str) -> str:
    """Hash of one compiled artifact: its manifest (JSON), written by the compiler; ``{key}:lock``
    is the compile lock of that id (a string with a TTL, owned by one compiler)."""
    return f"anvil:artifact:{artifact_id}"


def shm_key(region: str) -> str:
    """Hash of one ZeroCopy region a gateway serves: name, bytes, slot_bytes, slot_count, gateway.
    Written with a TTL and refreshed every heartbeat by the gateway that mapped it; deleted when it
    is dropped. The executor maps a region only while this key exists."""
    return f"anvil:shm:{region}"


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


TENANT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")  # never "*", the wildcard of limits


def check_tenant(name: str) -> str:
    """A tenant name as it may appear in keys and limits (``tenant:priority``); ValueError otherwise."""
    if not TENANT_NAME.fullmatch(name):
        raise ValueError(
            f"tenant name {name[:80]!r} must be 1-64 letters, digits, '_', '.' or '-', "
            "starting with a letter or digit"
        )
    return name


def tenants_key() -> str:
    """Hash: sha256 hex of an API key -> tenant name (`anvil tenant add`)."""
    return "anvil:tenants"


def slo_key() -> str:
    """Hash: field "{priority}" -> JSON {"attainment": float 0..1, "p99_ms": float, "requests": int,
    "window_s": float, "ts": float}. Written by the scheduler every second, read by qos."""
    return "anvil:slo"
