"""mlp4x1024 on KServe's Python model server (kserve 0.21), v2 REST at /v2/models/mlp4x1024/infer.

KServe's own batcher is a Go sidecar of its Kubernetes agent, not part of the Python server, so the
model batches in process the same way the other peers do: up to MAX_BATCH requests or MAX_WAIT_S.
Usage: python kserve_mlp.py PORT
"""

from __future__ import annotations

import asyncio
import sys

import numpy as np
from kserve import InferOutput, InferRequest, InferResponse, Model, ModelServer
from weights import MAX_BATCH, MAX_WAIT_S, forward, layers


class Batcher:
    def __init__(self, fn) -> None:  # type: ignore[no-untyped-def]
        self.fn = fn
        self.queue: asyncio.Queue[tuple[np.ndarray, asyncio.Future[np.ndarray]]] | None = None

    async def submit(self, x: np.ndarray) -> np.ndarray:
        if self.queue is None:
            self.queue = asyncio.Queue()
            asyncio.get_running_loop().create_task(self._loop())
        fut: asyncio.Future[np.ndarray] = asyncio.get_running_loop().create_future()
        await self.queue.put((x, fut))
        return await fut

    async def _loop(self) -> None:
        assert self.queue is not None
        loop = asyncio.get_running_loop()
        while True:
            items = [await self.queue.get()]
            deadline = loop.time() + MAX_WAIT_S
            while len(items) < MAX_BATCH:
                left = deadline - loop.time()
                if left <= 0:
                    break
                try:
                    items.append(await asyncio.wait_for(self.queue.get(), left))
                except TimeoutError:
                    break
            xs = [x for x, _ in items]
            y = await loop.run_in_executor(None, self.fn, np.concatenate(xs))
            row = 0
            for x, fut in items:
                fut.set_result(y[row : row + x.shape[0]])
                row += x.shape[0]


class Mlp(Model):
    def __init__(self) -> None:
        super().__init__("mlp4x1024")
        w = layers()
        self.batcher = Batcher(lambda x: forward(w, x))
        self.ready = True

    async def predict(self, payload: InferRequest, headers=None, response_headers=None) -> InferResponse:  # type: ignore[no-untyped-def, override]
        x = payload.inputs[0].as_numpy().astype(np.float32, copy=False)
        y = await self.batcher.submit(x)
        out = InferOutput(name="OUTPUT0", shape=list(y.shape), datatype="FP32")
        out.set_data_from_numpy(y, binary_data=False)
        return InferResponse(response_id=payload.id, model_name=self.name, infer_outputs=[out])


if __name__ == "__main__":
    ModelServer(http_port=int(sys.argv[1]), enable_grpc=False, enable_latency_logging=False).start([Mlp()])
