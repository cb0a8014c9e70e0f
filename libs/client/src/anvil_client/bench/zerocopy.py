"""The bench engine's ZeroCopy transport: each request through `AsyncZeroCopyClient` instead of HTTP.

One client (one shared-memory region of `slots` slots, one ZeroMQ connection) per tenant key, or
one without a key. A request's input is the workload's array, written into a free slot; the
answer's status is mapped to the HTTP code of the same meaning, so reports count both transports
alike (200 answered, 429 overload, 504 deadline, ...). The gateway's ZeroCopy endpoint is found in
the registry (the gateway's record in Redis), as clients do.
"""

from __future__ import annotations

from typing import Any

from anvil_client.bench.workload import Workload
from anvil_core.codec import HTTP_STATUS

__all__ = ["ZeroCopySender", "discover_endpoint"]


def discover_endpoint(redis_url: str) -> str | None:
    """The ZeroCopy endpoint a running gateway registered, or None."""
    import redis

    from anvil_client.stack_redis import open_redis
    from anvil_core import keys

    r = open_redis(redis_url, decode_responses=True, socket_timeout=2)
    try:
        for key in r.scan_iter(keys.svc_pattern("gateway")):
            endpoint = r.hget(key, "zerocopy_endpoint")
            if endpoint:
                return str(endpoint)
    except redis.RedisError:
        return None  # the caller says that no endpoint was found
    finally:
        r.close()
    return None


class ZeroCopySender:
    """Sends the workload's requests over ZeroCopy; `open` before the run, `close` after."""

    def __init__(self, endpoint: str, workload: Workload, slots: int, timeout_s: float) -> None:
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        self.endpoint = endpoint
        self.wl = workload
        self.slots = slots
        self.timeout_s = timeout_s
        self.x = workload.array()  # (rows, width) f32, the same values the HTTP bodies carry
        # input + output of one request, the metadata block, and room for alignment
        self.slot_bytes = 2 * self.x.nbytes + 4096
        self._clients: list[Any] = []

    async def open(self) -> None:
        from anvil_client.zerocopy_client import AsyncZeroCopyClient

        for key in self.wl.tenant_keys or [""]:
            self._clients.append(
                await AsyncZeroCopyClient.connect(
                    self.endpoint, self.slots, self.slot_bytes, self.timeout_s, api_key=key
                )
            )

    async def send(self, priority: int, tenant: int) -> tuple[int, str | None]:
        """One request: (HTTP-equivalent status, reason or None)."""
        from anvil_client.zerocopy_client import ZeroCopyError

        client = self._clients[tenant % len(self._clients)]
        try:
            await client.infer(
                self.wl.model,
                {self.wl.input_name: self.x},
                priority=priority if self.wl.send_priority else 0,
                timeout_us=self.wl.timeout_us or 0,
                copy=False,
            )
        except ZeroCopyError as exc:
            # Status 1..8 are ErrorCodes; 32 and up are refusals of the frame itself: the client's fault
            code = int(exc.status)
            return HTTP_STATUS.get(code, 400 if code >= 32 else 500), f"zerocopy {exc.status.name}: {exc}"
        return 200, None

    async def close(self) -> None:
        for client in self._clients:
            await client.close()
        self._clients.clear()
