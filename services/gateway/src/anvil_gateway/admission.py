"""Admission control: API keys per tenant, token buckets per (tenant, priority), bounded in-flight,
and shedding of lower priorities while the gateway's event loop is overloaded (overload.py).

Rates live in Redis (`anvil:qos:limits`, written by the qos service or `anvil qos set`); tenants
and their hashed API keys in `anvil:tenants` (sha256 hex of the key -> tenant). Both are loaded by
the discovery loop, so the request path never waits on Redis.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from anvil_core import keys
from anvil_core.priorities import PRIORITIES
from anvil_gateway.overload import LoopDelay

__all__ = ["Admission", "Rejected", "TokenBucket", "hash_key"]

_PRIORITY_FIELDS = frozenset({*map(str, PRIORITIES), "*"})  # "tenant:priority" fields of limits
_PROTECT_S = 1.0  # a lower priority is shed for the loop's delay only within this of a higher one


def hash_key(api_key: str) -> str:
    return hashlib.sha256(api_key.encode()).hexdigest()


class Rejected(Exception):
    """Not admitted: `status` (401/429), and `retry_after_s` for 429."""

    def __init__(self, status: int, message: str, retry_after_s: float = 0.0, reason: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.retry_after_s = retry_after_s
        self.reason = reason


@dataclass
class TokenBucket:
    rate_rps: float  # tokens added per second
    burst: float  # capacity
    tokens: float
    at_s: float  # monotonic time of the last refill

    def take(self, now_s: float) -> float:
        """Take one token; returns 0.0 on success, else the seconds until one is available."""
        self.tokens = min(self.burst, self.tokens + (now_s - self.at_s) * self.rate_rps)
        self.at_s = now_s
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.rate_rps if self.rate_rps > 0 else 60.0


class Admission:
    """Owned by the gateway's event loop. `refresh` is called by discovery, `admit` per request."""

    def __init__(
        self,
        require_api_key: bool,
        max_inflight_per_model: int,
        shed_delay_ms: dict[int, float] | None = None,
    ) -> None:
        self.require_api_key = require_api_key
        self.max_inflight_per_model = max_inflight_per_model
        # priority -> event-loop delay (ms) beyond which its requests get 429 (absent or <= 0: never)
        self.shed_delay_ms = {p: ms for p, ms in (shed_delay_ms or {}).items() if ms > 0}
        self.loop_delay = LoopDelay()
        self._seen_s: dict[int, float] = {}  # priority -> last admission attempt (monotonic s)
        self.limits: dict[str, tuple[float, float]] = {}  # "tenant:priority" -> (rate, burst)
        self.tenants: dict[str, str] = {}  # sha256(api key) -> tenant
        self.buckets: dict[tuple[str, int], TokenBucket] = {}
        self.inflight: dict[str, int] = {}

    def load(self, limits: dict[str, str], tenants: dict[str, str]) -> None:
        parsed: dict[str, tuple[float, float]] = {}
        for key, raw in limits.items():
            tenant, _, prio = key.rpartition(":")
            if not (tenant == "*" or keys.TENANT_NAME.fullmatch(tenant)) or prio not in _PRIORITY_FIELDS:
                continue  # not "tenant:priority": ignored, like a malformed value
            try:
                doc: dict[str, Any] = json.loads(raw)
                rate = float(doc["rate_rps"])
                burst = float(doc.get("burst", max(1.0, rate)))
            except (ValueError, KeyError, TypeError):
                continue  # a malformed entry is ignored, not fatal
            parsed[key] = (max(0.0, rate), max(1.0, burst))
        self.limits = parsed
        # A name that is not a tenant name (e.g. "*", written by hand into Redis) would alias the
        # limits' wildcard: such entries are dropped, not served.
        self.tenants = {h: t for h, t in tenants.items() if keys.TENANT_NAME.fullmatch(t)}
        for (tenant, priority), bucket in list(self.buckets.items()):
            limit = self._limit(tenant, priority)
            if limit is None:
                del self.buckets[(tenant, priority)]
            else:
                bucket.rate_rps, bucket.burst = limit
                bucket.tokens = min(bucket.tokens, bucket.burst)

    def tenant(self, headers: Any) -> str:
        """The caller's tenant from `Authorization: Bearer <key>` or `x-api-key`. Without
        `require_api_key`, a missing or unknown key is the `default` tenant (OpenAI-style clients
        always send one); with it, both are Rejected(401)."""
        auth = headers.get("authorization", "")
        key = auth[7:].strip() if auth.lower().startswith("bearer ") else headers.get("x-api-key", "")
        tenant = self.tenants.get(hash_key(key)) if key else None
        if tenant is not None:
            return tenant
        if key and self.require_api_key:
            raise Rejected(401, "unknown API key", reason="auth")
        if self.require_api_key:
            raise Rejected(
                401, "an API key is required (Authorization: Bearer <key> or x-api-key)", reason="auth"
            )
        return "default"

    def _limit(self, tenant: str, priority: int) -> tuple[float, float] | None:
        for key in (f"{tenant}:{priority}", f"{tenant}:*", f"*:{priority}"):
            if key in self.limits:
                return self.limits[key]
        return None

    def admit(self, model: str, tenant: str, priority: int, now_s: float) -> None:
        """Take a token and an in-flight slot, or raise Rejected(429): while the event loop's delay is
        over the priority's threshold (reason "overload", no token taken), over a rate, or over the
        in-flight bound."""
        delay_s = self.loop_delay.delay_s(now_s)
        self.loop_delay.sample(now_s)
        self._seen_s[priority] = now_s
        shed_ms = self.shed_delay_ms.get(priority)
        if shed_ms is not None and delay_s * 1e3 > shed_ms and self._protects(priority, now_s):
            raise Rejected(
                429,
                f"shed: gateway overloaded: its event loop is {delay_s * 1e3:.0f} ms behind, over the "
                f"{shed_ms:g} ms allowed for priority {priority} (lower priorities are shed first)",
                retry_after_s=1.0,
                reason="overload",
            )
        limit = self._limit(tenant, priority)
        if limit is not None:
            bucket = self.buckets.get((tenant, priority))
            if bucket is None:
                bucket = self.buckets[(tenant, priority)] = TokenBucket(limit[0], limit[1], limit[1], now_s)
            wait_s = bucket.take(now_s)
            if wait_s > 0:
                raise Rejected(
                    429,
                    f"tenant {tenant!r} priority {priority} is over its rate of {limit[0]:g} req/s",
                    retry_after_s=wait_s,
                    reason="rate",
                )
        if self.inflight.get(model, 0) >= self.max_inflight_per_model:
            raise Rejected(
                429,
                f"model {model!r} has {self.max_inflight_per_model} requests in flight (the bound)",
                retry_after_s=1.0,
                reason="queue",
            )
        self.inflight[model] = self.inflight.get(model, 0) + 1

    def _protects(self, priority: int, now_s: float) -> bool:
        """Shedding ``priority`` helps only if more important requests came within the last second:
        with none, the shed request would free CPU for nobody (the scheduler's rule for a request
        alone on an idle executor, at the gateway)."""
        return any(p < priority and now_s - at <= _PROTECT_S for p, at in self._seen_s.items())

    def done(self, model: str) -> None:
        self.inflight[model] -= 1
