"""The Redis formats qos reads and writes, parsed and validated at the edge (pure; no I/O).

- `anvil:qos:base` (operators, `python -m anvil_qos.ctl base set`): field "{tenant}:{priority}" ->
  JSON {"rate_rps": float > 0, "burst": int >= 1}. The rate a tenant/priority gets when the system is
  healthy; qos governs exactly these fields. Settings' `base_rates` (env ANVIL_BASE_RATES, same
  JSON as a map) gives defaults that the Redis hash overrides field by field.
- `anvil:qos:limits` (keys.qos_limits_key): field -> JSON {"rate_rps", "burst", "reason", "ts"}; what
  the gateways' token buckets enforce. qos writes its governed fields with reasons starting "qos:".
- `anvil:slo` (keys.slo_key, written by the scheduler): field "{priority}" -> JSON {"attainment",
  "p99_ms", "requests", "window_s", "ts"} (and optionally "slo_ms").
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from anvil_core import keys
from anvil_core.priorities import PRIORITIES

__all__ = [
    "BASE_KEY",
    "QOS_REASON_PREFIX",
    "BaseRate",
    "SloReading",
    "parse_bases",
    "parse_key",
    "parse_limit_rate",
    "parse_slo",
]

# Operators' base rates (proposed for anvil_core.keys as qos_base_key()).
BASE_KEY = keys.qos_base_key()
# Reasons of the limits qos writes start with this; on restart qos resumes only those.
QOS_REASON_PREFIX = "qos:"


@dataclass(frozen=True)
class BaseRate:
    rate_rps: float  # token refill rate when healthy
    burst: int  # bucket size when healthy


@dataclass(frozen=True)
class SloReading:
    attainment: float  # fraction of the window's requests answered within their deadline
    p99_ms: float | None  # p99 latency over the window (None: not published, no headroom check)
    requests: int | None  # requests answered in the window (None: not published, trusted as enough)
    ts: float  # wall-clock s of the reading
    slo_ms: float | None = None  # the class's SLO, when the scheduler publishes it


def parse_key(key: str) -> tuple[str, int | None]:
    """'{tenant}:{priority}' -> (tenant, priority), priority None for '*'. Raises ValueError."""
    tenant, sep, prio = key.rpartition(":")
    if not sep or not tenant:
        raise ValueError(f"{key!r}: a limit field is '{{tenant}}:{{priority}}' (priority 1-3 or *)")
    if prio == "*":
        return tenant, None
    if prio not in {str(p) for p in PRIORITIES}:
        raise ValueError(f"{key!r}: priority must be 1, 2, 3 or *")
    return tenant, int(prio)


def _base(raw: Any) -> BaseRate:
    doc = json.loads(raw) if isinstance(raw, str | bytes) else raw
    rate, burst = float(doc["rate_rps"]), doc.get("burst", max(1, math.ceil(float(doc["rate_rps"]))))
    if not (rate > 0 and math.isfinite(rate)):
        raise ValueError(f"rate_rps must be a finite number > 0, got {rate}")
    if not isinstance(burst, int) or burst < 1:
        raise ValueError(f"burst must be an integer >= 1, got {burst!r}")
    return BaseRate(rate, burst)


def parse_bases(*layers: Mapping[str, Any]) -> tuple[dict[str, BaseRate], list[str]]:
    """Merge base-rate maps (later layers win per field); returns the valid ones and one error line
    per invalid field (skipped, never fatal: a typo must not stop throttling of the other tenants)."""
    bases: dict[str, BaseRate] = {}
    errors = []
    for layer in layers:
        for key, raw in layer.items():
            try:
                parse_key(key)
                bases[key] = _base(raw)
            except (ValueError, KeyError, TypeError, json.JSONDecodeError) as exc:
                errors.append(f"base rate {key!r} ignored: {exc}")
    return bases, errors


def parse_slo(raw: Mapping[str, str]) -> dict[int, SloReading]:
    """The scheduler's per-priority readings; malformed fields are skipped."""
    out = {}
    for field, value in raw.items():
        try:
            doc = json.loads(value)
            slo_ms, p99, requests = doc.get("slo_ms"), doc.get("p99_ms"), doc.get("requests")
            out[int(field)] = SloReading(
                attainment=float(doc["attainment"]),
                p99_ms=float(p99) if p99 is not None else None,
                requests=int(requests) if requests is not None else None,
                ts=float(doc["ts"]),
                slo_ms=float(slo_ms) if slo_ms else None,
            )
        except (ValueError, KeyError, TypeError):
            continue
    return out


def parse_limit_rate(raw: str) -> tuple[float, str] | None:
    """(rate_rps, reason) of one `anvil:qos:limits` value, None if malformed."""
    try:
        doc = json.loads(raw)
        return float(doc["rate_rps"]), str(doc.get("reason", ""))
    except (ValueError, KeyError, TypeError):
        return None
