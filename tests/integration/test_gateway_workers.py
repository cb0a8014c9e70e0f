"""ANVIL_HTTP_WORKERS=2: two gateway processes share the HTTP port, and the gRPC port, (SO_REUSEPORT)
under one supervisor; connections land on both, each answers like a lone gateway, and each exports
its own metrics (metrics port + 100 x worker)."""

from __future__ import annotations

from typing import Any

import httpx
import numpy as np
import pytest

from anvil_client.launcher import PORT_STRIDE

tritonclient_grpc = pytest.importorskip("tritonclient.grpc")

pytestmark = pytest.mark.integration


def _served(port: int) -> float:
    """Successful inferences this worker counted (its /metrics)."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith("anvil_inference_request_success_total{"):
            total += float(line.rpartition(" ")[2])
    return total


def test_two_workers_share_the_port_and_both_serve(new_local_stack: Any) -> None:
    stack = new_local_stack(env={"ANVIL_HTTP_WORKERS": "2"})
    metrics = int(stack.service("gateway")["env"]["ANVIL_METRICS_PORT"])
    x = np.arange(8, dtype=np.float32)
    body = {"inputs": [{"name": "INPUT0", "shape": [1, 8], "datatype": "FP32", "data": x.tolist()}]}
    for _ in range(60):  # a new connection each time: the kernel spreads them over the two listeners
        with httpx.Client(base_url=stack.url, timeout=10) as c:
            r = c.post("/v2/models/identity/infer", json=body)
        assert r.status_code == 200, r.text
        assert r.json()["outputs"][0]["data"] == x.tolist()
    per_worker = [_served(metrics), _served(metrics + PORT_STRIDE)]
    assert sum(per_worker) >= 60 and min(per_worker) > 0, per_worker
    for _ in range(30):  # a new channel (connection) each time: gRPC is spread per connection too
        client = tritonclient_grpc.InferenceServerClient(stack.grpc_target)
        inp = tritonclient_grpc.InferInput("INPUT0", [1, 8], "FP32")
        inp.set_data_from_numpy(x.reshape(1, 8))
        np.testing.assert_array_equal(client.infer("identity", [inp]).as_numpy("OUTPUT0"), x.reshape(1, 8))
        client.close()
    grpc_per_worker = [_served(metrics) - per_worker[0], _served(metrics + PORT_STRIDE) - per_worker[1]]
    assert sum(grpc_per_worker) == 30 and min(grpc_per_worker) > 0, grpc_per_worker
