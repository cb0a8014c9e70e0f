"""`identity` on a CUDA device: every request's bytes go to device memory and back.

The built-in ``identity`` measures the serving path; on a GPU executor that path includes the host
to device copy and back, so the GPU twin of the model makes that round trip: each batch's inputs are
packed into a page-locked slot, copied into the device arena's staging bank on the lane's stream,
copied back, and the stream waited on once per slot-full. A batch larger than a slot goes in slot-
sized pieces, so any size is served from the same pre-allocated memory: nothing is allocated on the
device per batch (the arena and the pinned bank are made at load; raw pointers, no CuPy arrays).

Lanes (``ANVIL_LANES``): one slot, one device region and one stream per lane, picked by the calling
thread's lane, so two compute threads never share one.
"""

from __future__ import annotations

import numpy as np

from anvil_core.model_spec import ModelSpec, TensorSpec
from anvil_executor.models.base import Model, RequestInputs, RequestOutputs
from anvil_executor.plan_runtime.cuda_arena import DeviceArena, PinnedBank, counter
from anvil_executor.plan_runtime.lanes import current_lane

__all__ = ["SLOT_BYTES", "GpuIdentityModel"]

SLOT_BYTES = 4 << 20  # per lane: pinned and device bytes of one round trip
H2D, D2H = 1, 2  # cudaMemcpyKind
_Piece = tuple[np.ndarray, int, int, int]  # (an output's bytes, at, offset in the lane's slot, bytes)


class GpuIdentityModel(Model):
    """INPUT0 -> OUTPUT0 (FP32, any length per row) through device memory, on ``device_id``."""

    platform = "anvil_cuda"

    def __init__(self, max_batch: int, device_id: int, lanes: int = 1, slot_bytes: int = SLOT_BYTES) -> None:
        import cupy as cp

        if lanes < 1 or slot_bytes < 4 or slot_bytes % 4:
            raise ValueError(f"lanes >= 1 and a slot of a multiple of 4 bytes, got {lanes}, {slot_bytes}")
        self.spec = ModelSpec(
            name="identity",
            platform=self.platform,
            max_batch=max_batch,
            inputs=(TensorSpec("INPUT0", "FP32", (-1,)),),
            outputs=(TensorSpec("OUTPUT0", "FP32", (-1,)),),
        )
        self._cp = cp
        self.device_id = device_id
        self.slot = slot_bytes
        counter.install()
        with cp.cuda.Device(device_id):
            self.arena = DeviceArena({"staging": lanes * slot_bytes}, device_id, what="model 'identity'")
            self.pinned = PinnedBank(lanes * slot_bytes)
            self._streams = [cp.cuda.Stream(non_blocking=True) for _ in range(lanes)]
        self._bytes = self.pinned.view(0, (lanes * slot_bytes,), np.uint8)
        self.graph_count = 0  # copies only: nothing worth a graph
        self.padding_waste = 0.0
        self.runs = 0  # round trips (a slot-full each)
        self.copied_bytes = 0

    def reset_padding(self) -> None:
        self.runs = self.copied_bytes = 0

    def run(self, batch: list[RequestInputs]) -> list[RequestOutputs]:
        lane = current_lane() % len(self._streams)
        base = lane * self.slot
        outs: list[RequestOutputs] = []
        pending: list[_Piece] = []
        used = 0
        for req in batch:
            x = np.ascontiguousarray(req["INPUT0"], dtype=np.float32)
            y = np.empty_like(x)
            outs.append({"OUTPUT0": y})
            src, dst = x.reshape(-1).view(np.uint8), y.reshape(-1).view(np.uint8)
            pos = 0
            while pos < src.size:
                n = min(src.size - pos, self.slot - used)
                self._bytes[base + used : base + used + n] = src[pos : pos + n]
                pending.append((dst, pos, used, n))
                used += n
                pos += n
                if used == self.slot:
                    self._round_trip(lane, base, used, pending)
                    used = 0
        if used:
            self._round_trip(lane, base, used, pending)
        return outs

    def _round_trip(self, lane: int, base: int, n: int, pending: list[_Piece]) -> None:
        """Slot bytes [0, n) of ``lane`` to the device and back, then into their outputs."""
        cp, stream = self._cp, self._streams[lane]
        host, dev = self.pinned.base + base, self.arena.ptr("staging", base)
        with cp.cuda.Device(self.device_id):
            cp.cuda.runtime.memcpyAsync(dev, host, n, H2D, stream.ptr)
            cp.cuda.runtime.memcpyAsync(host, dev, n, D2H, stream.ptr)  # in stream order: after the H2D
            stream.synchronize()
        for dst, at, off, k in pending:
            dst[at : at + k] = self._bytes[base + off : base + off + k]
        pending.clear()
        self.runs += 1
        self.copied_bytes += n
