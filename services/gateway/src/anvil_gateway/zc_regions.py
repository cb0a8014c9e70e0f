"""The regions a server has mapped for its clients: ids, ownership, slots in use, and their
announcement in Redis (`anvil_core.keys.shm_key`), which is what lets an executor map them too.

Owned by the server's event loop (no locking). A region is identified three ways: its client's shm
name (never logged or echoed), its 16-bit `id` in headers (reused after it is dropped), and its
`key` (`zc-<server tag>-<serial>`, never reused: ShmRef.region and the Redis key suffix), so a
stale reference can never reach a different client's memory.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from anvil_core.keys import shm_key
from anvil_core.zerocopy.header import Status, ZeroCopyError
from anvil_core.zerocopy.region import Region

__all__ = ["ServedRegion", "ServedRegions"]


@dataclass(eq=False)
class ServedRegion:
    id: int
    peer: bytes  # the connection that registered it: only it may use the region
    key: str
    tenant: str  # bound at REGISTER (API key)
    mapping: Region
    busy: dict[int, Any] = field(default_factory=dict)  # slot -> the request in flight there
    closing: bool = False  # UNREGISTERed or gone: no new requests; dropped once `busy` is empty
    waiters: list[int] = field(default_factory=list)  # UNREGISTER request ids to answer


class ServedRegions:
    def __init__(self, tag: str, max_per_peer: int = 16, max_bytes: int = 64 << 30) -> None:
        self.tag = tag
        self.max_per_peer = max_per_peer  # regions one connection may hold
        self.max_bytes = max_bytes  # all regions of this server together
        self._by_id: dict[int, ServedRegion] = {}
        self._serial = 0

    def __iter__(self) -> Iterator[ServedRegion]:
        return iter(list(self._by_id.values()))

    def __len__(self) -> int:
        return len(self._by_id)

    def attach(
        self, peer: bytes, slot_bytes: int, slot_count: int, name: str, tenant: str, writable: bool = True
    ) -> ServedRegion:
        """Map a client's region after the server's limits and `Region.attach`'s checks."""
        regions = list(self._by_id.values())
        if sum(r.peer == peer for r in regions) >= self.max_per_peer:
            raise ZeroCopyError(Status.BAD_REGION, f"at most {self.max_per_peer} regions per connection")
        if any(r.mapping.name == name for r in regions):
            raise ZeroCopyError(Status.BAD_REGION, "this region is already registered")
        if sum(r.mapping.size for r in regions) + slot_bytes * slot_count > self.max_bytes:
            raise ZeroCopyError(Status.BAD_REGION, f"this server maps at most {self.max_bytes} bytes")
        free = next((i for i in range(1, 0x10000) if i not in self._by_id), 0)
        if not free:
            raise ZeroCopyError(Status.BAD_REGION, "no free region id")
        mapping = Region.attach(name, slot_bytes, slot_count, writable=writable)
        self._serial += 1
        region = ServedRegion(free, peer, f"zc-{self.tag}-{self._serial}", tenant, mapping)
        self._by_id[free] = region
        return region

    def owned(self, peer: bytes, region_id: int, request_id: int) -> ServedRegion:
        region = self._by_id.get(region_id)
        if region is None or region.peer != peer:
            raise ZeroCopyError(Status.BAD_REGION, f"region {region_id} is not registered here", request_id)
        return region

    def drop(self, region: ServedRegion) -> bool:
        """Unmap and forget a drained region; False if it was already dropped."""
        assert not region.busy, "a region is dropped only once its requests are done"
        if self._by_id.get(region.id) is not region:
            return False
        del self._by_id[region.id]
        region.mapping.close()
        return True

    def gone(self) -> list[ServedRegion]:
        """Regions not yet closing whose owner unlinked or shrank the shm object."""
        return [
            r
            for r in self._by_id.values()
            if not r.closing and not (r.mapping.linked() and r.mapping.intact())
        ]

    async def announce(self, redis: Any, regions: list[ServedRegion], ttl_ms: int, server_id: str) -> None:
        """(Re)write the regions' keys with a fresh TTL (after a Redis restart too)."""
        async with redis.pipeline(transaction=False) as pipe:
            for r in regions:
                mp = r.mapping
                record = {"name": mp.name, "bytes": mp.size, "slot_bytes": mp.slot_bytes}
                record |= {"slot_count": mp.slot_count, "gateway": server_id}
                pipe.hset(shm_key(r.key), mapping=record)
                pipe.pexpire(shm_key(r.key), ttl_ms)
            await pipe.execute()

    def close(self) -> list[str]:
        """Unmap everything (server stop); returns the Redis keys to delete."""
        keys = [shm_key(r.key) for r in self._by_id.values()]
        for r in self._by_id.values():
            r.mapping.close()
        self._by_id.clear()
        return keys
