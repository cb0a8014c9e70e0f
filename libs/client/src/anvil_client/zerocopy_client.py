"""ZeroCopy clients (docs/protocol.md): tensors go through a shared-memory slot, not a socket.

    with ZeroCopyClient(endpoint, slots=4, slot_bytes=8 << 20) as zc:
        out = zc.infer("identity", {"INPUT0": x})            # dict name -> np.ndarray

    async with await AsyncZeroCopyClient.connect(endpoint, slots=8) as zc:
        outs = await asyncio.gather(*(zc.infer("mlp", {"INPUT0": x}) for x in xs))

The client creates its region (/dev/shm/anvil-<random>, mode 0600), registers it with the gateway,
writes each request into a free slot (header, metadata block, tensor bytes) and rings the gateway
with the 16-byte header; the gateway writes the results into the same slot and rings back. A slot is
reused only after the gateway's one answer for its request: a request that times out is CANCELled
first. `close()` unregisters (the gateway waits for in-flight requests) and unlinks the region.
The endpoint is the gateway's `zerocopy_endpoint` (its registry entry; `ipc://.../anvil-zc.sock`).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import zmq
import zmq.asyncio

from anvil_core.tensors import encode_bytes_elements, kserve_datatype
from anvil_core.zerocopy import Flag, Header, Op, Region, Status, ZeroCopyError
from anvil_core.zerocopy import header as zh
from anvil_core.zerocopy import meta as zm
from anvil_core.zerocopy import slots as slot_io
from anvil_core.zmq_sockets import make_socket

__all__ = ["AsyncZeroCopyClient", "ZeroCopyClient", "ZeroCopyError"]

_CANCEL_GRACE_S = 2.0  # after a CANCEL, how long the gateway gets to send the request's one answer
Layout = tuple[bytes, tuple[zm.TensorDesc, ...], int]


class _Slots:
    """What both clients share: the region, request layouts, writing requests, reading replies."""

    def __init__(self, slots: int, slot_bytes: int) -> None:
        self.region = Region.create(slot_bytes, slots)
        self.region_id = 0
        self._ids = itertools.count(1)
        self._layouts: dict[tuple[Any, ...], Layout] = {}

    def next_id(self) -> int:
        rid = next(self._ids) & 0xFFFF_FFFF
        return rid or self.next_id()

    def register_frame(self, rid: int, api_key: str) -> bytes:
        r = self.region
        payload = slot_io.encode_register(r.slot_bytes, r.slot_count, r.name, api_key)
        return zh.encode(rid, Op.REGISTER, len(payload), Flag.INLINE) + payload

    def registered(self, head: Header, inline: bytes) -> None:
        self.check(head, inline, slot=None)
        self.region_id = head.region

    def write(
        self, slot: int, rid: int, model: str, inputs: Mapping[str, Any], options: dict[str, Any]
    ) -> bytes:
        """Lay the request out in `slot` and return the doorbell header (also the slot's first 16 B)."""
        datatypes: Mapping[str, str] = options.pop("datatypes", None) or {}
        payloads, descs = [], []
        for name, value in inputs.items():
            arr = np.asarray(value)
            datatype = datatypes.get(name) or kserve_datatype(arr.dtype)
            if datatype is None:
                raise ZeroCopyError(Status.BAD_REQUEST, f"input {name!r}: no datatype for {arr.dtype}")
            data: Any = encode_bytes_elements(arr) if datatype == "BYTES" else np.ascontiguousarray(arr)
            payloads.append(data)
            descs.append((name, datatype, tuple(arr.shape), len(data) if datatype == "BYTES" else arr.nbytes))
        key = (model, tuple(descs), tuple(sorted(options.items())))
        layout = self._layouts.get(key)
        if layout is None:
            outputs = tuple(options.pop("outputs", ()))
            layout = zm.plan(lambda d: zm.encode_infer(zm.InferMeta(model, d, outputs, **options)), descs)
            self._layouts[key] = layout
        return slot_io.write_request(self.region, slot, rid, self.region_id, layout, payloads)

    def check(self, head: Header, inline: bytes, slot: int | None) -> None:
        """Raise the ZeroCopyError an ERROR reply carries (text inline or in the slot)."""
        if head.op != Op.ERROR:
            return
        try:
            status = Status(head.status)
        except ValueError:
            status = Status.INTERNAL
        text = slot_io.error_text(self.region, slot, head, inline)
        raise ZeroCopyError(status, text, head.request_id)

    def read(self, slot: int, head: Header, inline: bytes, copy: bool) -> dict[str, np.ndarray]:
        """Outputs of an INFER_OK in `slot` (copies unless `copy=False`: then valid until reuse)."""
        self.check(head, inline, slot)
        if head.op != Op.INFER_OK:
            raise ZeroCopyError(Status.PROTOCOL, f"unexpected reply {head.op:#06x} to INFER")
        return slot_io.read_outputs(self.region, slot, head, copy)[1]

    def unregister_frame(self, rid: int) -> bytes:
        return zh.encode(rid, Op.UNREGISTER, reserved=zh.pack_reserved(self.region_id, 0))


def _budget_s(timeout_us: int, default_s: float) -> float:
    """How long to wait for an answer: past the gateway's own deadline (timeout + 50 ms), so its
    DEADLINE answer normally arrives before this side has to CANCEL."""
    return timeout_us / 1e6 + 0.25 if timeout_us else default_s


def _options(outputs: Sequence[str], priority: int, timeout_us: int, **extra: Any) -> dict[str, Any]:
    opts: dict[str, Any] = {"outputs": tuple(outputs), "priority": priority, "timeout_us": timeout_us}
    opts.update({k: v for k, v in extra.items() if v})
    return opts


class ZeroCopyClient:
    """Synchronous client: one request in flight at a time (use AsyncZeroCopyClient for more)."""

    def __init__(
        self,
        endpoint: str,
        slots: int = 2,
        slot_bytes: int = 8 << 20,
        timeout_s: float = 10.0,
        api_key: str = "",
    ) -> None:
        self.timeout_s = timeout_s
        self._slots = _Slots(slots, slot_bytes)
        self._ctx = zmq.Context()
        self._sock = make_socket(self._ctx, zmq.DEALER)
        self._free = list(range(slots))
        self._closed = False
        try:
            self._sock.connect(endpoint)
            rid = self._slots.next_id()
            self._sock.send(self._slots.register_frame(rid, api_key))
            try:
                head, inline = self._wait({rid}, timeout_s)
            except TimeoutError:
                raise ZeroCopyError(Status.UNAVAILABLE, f"no gateway answered at {endpoint}") from None
            self._slots.registered(head, inline)
        except BaseException:
            self._teardown()
            raise

    @property
    def region(self) -> Region:
        return self._slots.region

    def infer(
        self,
        model: str,
        inputs: Mapping[str, Any],
        *,
        outputs: Sequence[str] = (),
        priority: int = 0,
        timeout_us: int = 0,
        datatypes: Mapping[str, str] | None = None,
        copy: bool = True,
    ) -> dict[str, np.ndarray]:
        """Run `model` on `inputs`; raises ZeroCopyError (with `.status`) on any failure."""
        if not self._free:
            raise ZeroCopyError(Status.UNAVAILABLE, "no usable slot left (the gateway stopped answering)")
        slot = self._free.pop()
        reusable = True
        try:
            rid = self._slots.next_id()
            opts = _options(outputs, priority, timeout_us, datatypes=datatypes)
            self._sock.send(self._slots.write(slot, rid, model, inputs, opts))
            budget = _budget_s(timeout_us, self.timeout_s)
            try:
                head, inline = self._wait({rid}, budget)
            except TimeoutError:
                reusable = self._cancel(rid)
                raise ZeroCopyError(Status.DEADLINE, f"no answer within {budget:.3f} s", rid) from None
            return self._slots.read(slot, head, inline, copy)
        finally:
            if reusable:
                self._free.append(slot)

    def ping(self) -> float:
        """Round trip to the gateway, seconds."""
        t0 = time.perf_counter()
        rid = self._slots.next_id()
        self._sock.send(zh.encode(rid, Op.PING))
        self._wait({rid}, self.timeout_s)
        return time.perf_counter() - t0

    def _cancel(self, rid: int) -> bool:
        """CANCEL `rid` and wait for its one answer; False if none came (the slot stays retired)."""
        self._sock.send(zh.encode(self._slots.next_id(), Op.CANCEL, reserved=rid))
        try:
            self._wait({rid}, _CANCEL_GRACE_S)
            return True
        except TimeoutError:
            return False

    def _wait(self, rids: set[int], timeout_s: float) -> tuple[Header, bytes]:
        """The next reply for one of `rids`; replies for others (late, cancelled) are dropped."""
        deadline = time.monotonic() + timeout_s
        while True:
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0 or not self._sock.poll(left_ms):
                raise TimeoutError
            head, inline = zh.decode_reply(self._sock.recv())
            if head.request_id in rids:
                return head, inline

    def close(self) -> None:
        """Unregister (the gateway answers once the region's requests are done) and unlink."""
        if self._closed:
            return
        try:
            if self._slots.region_id:
                rid = self._slots.next_id()
                self._sock.send(self._slots.unregister_frame(rid))
                self._wait({rid}, _CANCEL_GRACE_S)
        except (TimeoutError, zmq.ZMQError):
            pass
        finally:
            self._teardown()

    def _teardown(self) -> None:
        self._closed = True
        self._sock.close()
        self._ctx.term()
        self._slots.region.destroy()

    def __enter__(self) -> ZeroCopyClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncZeroCopyClient:
    """asyncio client: up to `slots` requests in flight; further calls wait for a free slot."""

    def __init__(self, endpoint: str, slots: int, slot_bytes: int, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._slots = _Slots(slots, slot_bytes)
        self._ctx = zmq.asyncio.Context()
        self._sock = make_socket(self._ctx, zmq.DEALER, connect=endpoint)
        self._free: asyncio.Queue[int] = asyncio.Queue()
        for slot in range(slots):
            self._free.put_nowait(slot)
        self._pending: dict[int, asyncio.Future[tuple[Header, bytes]]] = {}
        self._rx = asyncio.get_running_loop().create_task(self._rx_loop())
        self._closed = False

    @classmethod
    async def connect(
        cls,
        endpoint: str,
        slots: int = 8,
        slot_bytes: int = 8 << 20,
        timeout_s: float = 10.0,
        api_key: str = "",
    ) -> AsyncZeroCopyClient:
        """Create the region and register it (the API key, if any, sets the tenant)."""
        client = cls(endpoint, slots, slot_bytes, timeout_s)
        try:
            rid = client._slots.next_id()
            frame = client._slots.register_frame(rid, api_key)
            try:
                head, inline = await client._call(rid, frame, timeout_s)
            except TimeoutError:
                raise ZeroCopyError(Status.UNAVAILABLE, f"no gateway answered at {endpoint}") from None
            client._slots.registered(head, inline)
        except BaseException:
            await client._teardown()
            raise
        return client

    @property
    def region(self) -> Region:
        return self._slots.region

    async def infer(
        self,
        model: str,
        inputs: Mapping[str, Any],
        *,
        outputs: Sequence[str] = (),
        priority: int = 0,
        timeout_us: int = 0,
        datatypes: Mapping[str, str] | None = None,
        copy: bool = True,
    ) -> dict[str, np.ndarray]:
        slot = await self._free.get()
        reusable = True
        try:
            rid = self._slots.next_id()
            opts = _options(outputs, priority, timeout_us, datatypes=datatypes)
            frame = self._slots.write(slot, rid, model, inputs, opts)
            budget = _budget_s(timeout_us, self.timeout_s)
            try:
                head, inline = await self._call(rid, frame, budget)
            except TimeoutError:
                reusable = await self._cancel(rid)
                raise ZeroCopyError(Status.DEADLINE, f"no answer within {budget:.3f} s", rid) from None
            return self._slots.read(slot, head, inline, copy)
        finally:
            if reusable:
                self._free.put_nowait(slot)

    async def ping(self) -> float:
        t0 = time.perf_counter()
        rid = self._slots.next_id()
        await self._call(rid, zh.encode(rid, Op.PING), self.timeout_s)
        return time.perf_counter() - t0

    async def _call(self, rid: int, frame: bytes, timeout_s: float) -> tuple[Header, bytes]:
        fut = self._expect(rid)
        await self._sock.send(frame)
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout_s)
        finally:
            if fut.done():
                self._pending.pop(rid, None)

    def _expect(self, rid: int) -> asyncio.Future[tuple[Header, bytes]]:
        fut: asyncio.Future[tuple[Header, bytes]] = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        return fut

    async def _cancel(self, rid: int) -> bool:
        fut = self._pending.get(rid) or self._expect(rid)
        await self._sock.send(zh.encode(self._slots.next_id(), Op.CANCEL, reserved=rid))
        try:
            await asyncio.wait_for(fut, _CANCEL_GRACE_S)
            return True
        except TimeoutError:
            return False
        finally:
            self._pending.pop(rid, None)

    async def _rx_loop(self) -> None:
        while True:
            frame = await self._sock.recv()
            try:
                head, inline = zh.decode_reply(frame)
            except ZeroCopyError:
                continue
            fut = self._pending.pop(head.request_id, None)
            if fut is not None and not fut.done():
                fut.set_result((head, inline))

    async def close(self) -> None:
        if self._closed:
            return
        try:
            if self._slots.region_id:
                rid = self._slots.next_id()
                await self._call(rid, self._slots.unregister_frame(rid), _CANCEL_GRACE_S)
        except (TimeoutError, zmq.ZMQError):
            pass
        finally:
            await self._teardown()

    async def _teardown(self) -> None:
        self._closed = True
        self._rx.cancel()
        await asyncio.gather(self._rx, return_exceptions=True)
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(ZeroCopyError(Status.UNAVAILABLE, "client closed"))
        self._sock.close()
        self._ctx.term()
        self._slots.region.destroy()

    async def __aenter__(self) -> AsyncZeroCopyClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
