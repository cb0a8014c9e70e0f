"""Inputs that live in a client's shared memory (ZeroCopy): `Tensor.shm` → one copy into the executor.

The gateway registered the region and announced it in Redis (`anvil:shm:{region}`: name, bytes,
slot layout). Here a region is mapped read-only on first use, after checking that the key exists
and that the object passes the same checks the gateway made (name, owner, mode 0600, size, header).
Every reference is bounds-checked against one slot's payload, then read with `pread` (one copy, the
one any device needs anyway) rather than viewed through the mapping: a client that shrinks its object
while the executor reads would make a mapped read fault (SIGBUS, the whole executor and, after
re-dispatch, the next one); a `pread` comes back short and only that request fails (issue #18).
A background thread re-checks the keys every `recheck_s` and unmaps regions whose key is gone
(unregistered, or their gateway died and the TTL ran out).

Called on the compute thread through `ShmInputs.resolve` (batch_runner's ShmResolver).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from prometheus_client import Counter, Gauge
from redis.exceptions import RedisError

from anvil_core.codec import DTYPE_NAMES, pb
from anvil_core.keys import shm_key
from anvil_core.logs import get_logger
from anvil_core.redis_conn import RedisAuth, sync_redis
from anvil_core.tensors import HostTensor, TensorError
from anvil_core.zerocopy import Region, ZeroCopyError

__all__ = ["ShmInputs"]

log = get_logger("anvil.executor.shm")

shm_inputs = Counter("anvil_executor_shm_inputs_total", "Input tensors read from shared memory")
shm_bytes = Counter("anvil_executor_shm_input_bytes_total", "Input bytes read from shared memory")
shm_copied = Counter(
    "anvil_executor_shm_bytes_copied_total",
    "Shared-memory input bytes copied into the executor (pread: all of them; a shrunk region cannot fault)",
)
shm_regions = Gauge("anvil_executor_shm_regions_mapped", "Shared-memory regions mapped by this executor")


class ShmInputs:
    """Map cache + checks. `resolve` runs on the compute thread; the sweeper on its own thread."""

    def __init__(self, redis_url: str, recheck_s: float = 1.0, auth: RedisAuth | None = None) -> None:
        self._redis = sync_redis(
            redis_url, auth, decode_responses=True, socket_timeout=1.0, socket_connect_timeout=1.0
        )
        self._recheck_s = recheck_s
        self._regions: dict[str, Region] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._sweeper: threading.Thread | None = None

    def resolve(self, t: pb.TensorT) -> HostTensor:
        """A HostTensor of the referenced bytes of a verified tensor (codec); TensorError states any
        violated constraint."""
        name, ref = t.name or "", t.shm
        if ref is None:
            raise TensorError(f"tensor {name!r}: no frame and no shared-memory reference")
        datatype = DTYPE_NAMES[t.dtype]
        shape = tuple(t.shape or ())
        key, offset, length = ref.region or "", ref.offset, ref.length
        try:
            region = self._region(key)
            region.check_span(offset, length)
            data = region.read(offset, length)
        except ZeroCopyError as exc:
            raise TensorError(f"tensor {name!r}: shared-memory input refused: {exc.message}") from None
        tensor = HostTensor.from_buffer(name, datatype, shape, data)  # checks length vs shape
        shm_inputs.inc()
        shm_bytes.inc(length)
        shm_copied.inc(length)
        return tensor

    def _region(self, key: str) -> Region:
        with self._lock:
            region = self._regions.get(key)
        if region is not None:
            return region
        try:
            record: Mapping[str, Any] = self._redis.hgetall(shm_key(key))  # type: ignore[assignment]
        except (RedisError, OSError):
            raise TensorError(f"region {key!r} cannot be verified: registry unreachable") from None
        if not record:
            raise TensorError(f"region {key!r} is not registered")
        try:
            region = Region.attach(
                record["name"], int(record["slot_bytes"]), int(record["slot_count"]), writable=False
            )
        except (KeyError, ValueError):
            raise TensorError(f"region {key!r} has a malformed registry record") from None
        with self._lock:
            existing = self._regions.setdefault(key, region)
            shm_regions.set(len(self._regions))
        if existing is not region:
            region.close()  # another thread mapped it first
        self._start_sweeper()
        log.info("shm region mapped", extra={"region": key, "bytes": existing.size})
        return existing

    def _start_sweeper(self) -> None:
        if self._sweeper is None:
            self._sweeper = threading.Thread(target=self._sweep_loop, name="shm-sweeper", daemon=True)
            self._sweeper.start()

    def _sweep_loop(self) -> None:
        while not self._stop.wait(self._recheck_s):
            self.sweep()

    def sweep(self) -> None:
        """Unmap every region whose registry key is gone (kept as is while Redis is unreachable)."""
        with self._lock:
            keys = list(self._regions)
        if not keys:
            return
        try:
            pipe = self._redis.pipeline(transaction=False)
            for key in keys:
                pipe.exists(shm_key(key))
            alive = pipe.execute()
        except (RedisError, OSError):
            return
        for key, exists in zip(keys, alive, strict=True):
            if exists:
                continue
            with self._lock:
                region = self._regions.pop(key, None)
                shm_regions.set(len(self._regions))
            if region is not None:
                region.close()  # arrays of a running batch keep the pages until they go
                log.info("shm region unmapped", extra={"region": key})

    @property
    def mapped(self) -> dict[str, Region]:
        with self._lock:
            return dict(self._regions)

    def close(self) -> None:
        self._stop.set()
        if self._sweeper is not None:
            self._sweeper.join(timeout=2)
        with self._lock:
            regions, self._regions = list(self._regions.values()), {}
        for region in regions:
            region.close()
        shm_regions.set(0)
        self._redis.close()
