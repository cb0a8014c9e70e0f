"""mlp4x1024 on Ray Serve (2.60) with @serve.batch, answering the same KServe v2 JSON as the others
at /v2/models/mlp4x1024/infer. Usage: python rayserve_mlp.py PORT"""

from __future__ import annotations

import sys
import threading

import numpy as np
import ray
from ray import serve
from starlette.requests import Request
from weights import MAX_BATCH, MAX_WAIT_S, forward, layers


@serve.deployment(max_ongoing_requests=256)
class Mlp:
    def __init__(self) -> None:
        self.weights = layers()

    @serve.batch(max_batch_size=MAX_BATCH, batch_wait_timeout_s=MAX_WAIT_S)
    async def run(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        y = forward(self.weights, np.concatenate(xs))
        out, row = [], 0
        for x in xs:
            out.append(y[row : row + x.shape[0]])
            row += x.shape[0]
        return out

    async def __call__(self, request: Request) -> dict[str, object]:
        doc = await request.json()
        t = doc["inputs"][0]
        y = await self.run(np.asarray(t["data"], np.float32).reshape(t["shape"]))
        outputs = [
            {"name": "OUTPUT0", "datatype": "FP32", "shape": list(y.shape), "data": y.reshape(-1).tolist()}
        ]
        return {"model_name": "mlp4x1024", "id": doc.get("id", ""), "outputs": outputs}


if __name__ == "__main__":
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": int(sys.argv[1])})
    app = Mlp.bind()  # type: ignore[attr-defined]
    serve.run(app, name="mlp", route_prefix="/v2/models/mlp4x1024/infer")
    print("ready", flush=True)
    threading.Event().wait()
