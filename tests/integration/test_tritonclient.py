"""tritonclient[http] drives the gateway unmodified: binary (its default), JSON, system shared memory."""

from __future__ import annotations

import json
import os
import uuid
from typing import Any

import httpx
import numpy as np
import pytest

from anvil_executor.models.builtin import mlp_reference

tritonclient_http = pytest.importorskip("tritonclient.http")
shm_utils = pytest.importorskip("tritonclient.utils.shared_memory")
from tritonclient.utils import InferenceServerException  # noqa: E402

pytestmark = pytest.mark.integration


@pytest.fixture
def client(stack: Any) -> Any:
    url = (stack.url if hasattr(stack, "url") else stack.gateway_url).removeprefix("http://")
    c = tritonclient_http.InferenceServerClient(url=url, connection_timeout=10, network_timeout=10)
    yield c
    c.close()


def _x(rows: int = 2) -> np.ndarray:
    return np.random.default_rng(rows).standard_normal((rows, 16)).astype(np.float32)


def test_server_and_model_metadata(client: Any) -> None:
    assert client.is_server_live() and client.is_server_ready()
    meta = client.get_server_metadata()
    assert {"binary_tensor_data", "system_shared_memory", "statistics"} <= set(meta["extensions"])
    assert client.is_model_ready("mlp")
    config = client.get_model_config("mlp")
    assert config["max_batch_size"] > 0 and config["input"][0]["dims"] == [16]
    stats = client.get_inference_statistics("mlp")
    assert stats["model_stats"][0]["name"] == "mlp"


@pytest.mark.parametrize("binary", [True, False])
def test_infer_binary_and_json(client: Any, binary: bool) -> None:
    x = _x(3)
    inp = tritonclient_http.InferInput("INPUT0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=binary)
    out = tritonclient_http.InferRequestedOutput("OUTPUT0", binary_data=binary)
    result = client.infer("mlp", [inp], outputs=[out], priority=3)
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), mlp_reference(x), rtol=1e-5, atol=1e-6)


def test_infer_with_default_outputs_is_binary(client: Any) -> None:
    x = _x(1)
    inp = tritonclient_http.InferInput("INPUT0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    result = client.infer("mlp", [inp], priority=3)
    assert result.get_output("OUTPUT0")["parameters"]["binary_data_size"] == 16
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), mlp_reference(x), rtol=1e-5, atol=1e-6)


def test_statistics_count_successes(client: Any) -> None:
    before = client.get_inference_statistics("mlp")["model_stats"][0]["inference_stats"]["success"]["count"]
    x = _x(1)
    inp = tritonclient_http.InferInput("INPUT0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    client.infer("mlp", [inp], priority=3)
    after = client.get_inference_statistics("mlp")["model_stats"][0]["inference_stats"]["success"]["count"]
    assert after == before + 1


# The regions below are made by this process; a gateway container (uid 10001) opens only its own
# uid's regions, so against containers these run in test_compose (regions made as uid 10001).
_HOST_SHM_ON_CONTAINERS = pytest.mark.skipif(
    os.environ.get("ANVIL_STACK", "local") == "docker",
    reason="regions made by this process's uid; against containers, test_compose's system shm test "
    "makes them as the gateway's uid",
)


@_HOST_SHM_ON_CONTAINERS
def test_system_shared_memory_inputs_and_outputs(client: Any) -> None:
    x = _x(4)
    in_bytes, out_bytes = x.nbytes, 4 * 4 * 4
    tag = uuid.uuid4().hex[:8]
    handle = shm_utils.create_shared_memory_region(f"in-{tag}", f"/anvil-it-in-{tag}", in_bytes)
    out_handle = shm_utils.create_shared_memory_region(f"out-{tag}", f"/anvil-it-out-{tag}", out_bytes)
    try:
        shm_utils.set_shared_memory_region(handle, [x])
        client.register_system_shared_memory(f"in-{tag}", f"/anvil-it-in-{tag}", in_bytes)
        client.register_system_shared_memory(f"out-{tag}", f"/anvil-it-out-{tag}", out_bytes)
        status = client.get_system_shared_memory_status()
        assert {r["name"] for r in status} >= {f"in-{tag}", f"out-{tag}"}
        inp = tritonclient_http.InferInput("INPUT0", list(x.shape), "FP32")
        inp.set_shared_memory(f"in-{tag}", in_bytes)
        out = tritonclient_http.InferRequestedOutput("OUTPUT0")
        out.set_shared_memory(f"out-{tag}", out_bytes)
        result = client.infer("mlp", [inp], outputs=[out], priority=3)
        assert result.get_output("OUTPUT0")["shape"] == [4, 4]
        got = shm_utils.get_contents_as_numpy(out_handle, np.float32, [4, 4])
        np.testing.assert_allclose(got, mlp_reference(x), rtol=1e-5, atol=1e-6)
    finally:
        client.unregister_system_shared_memory(f"in-{tag}")
        client.unregister_system_shared_memory(f"out-{tag}")
        shm_utils.destroy_shared_memory_region(handle)
        shm_utils.destroy_shared_memory_region(out_handle)
    assert not any(r["name"].endswith(tag) for r in client.get_system_shared_memory_status())


@_HOST_SHM_ON_CONTAINERS
def test_shared_memory_misuse_is_a_clear_4xx(client: Any, stack: Any) -> None:
    tag = uuid.uuid4().hex[:8]
    key = f"/anvil-it-bad-{tag}"
    handle = shm_utils.create_shared_memory_region(f"bad-{tag}", key, 64)
    url = stack.url if hasattr(stack, "url") else stack.gateway_url

    def post(params: dict[str, object]) -> httpx.Response:
        doc = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "parameters": params}]}
        return httpx.post(f"{url}/v2/models/mlp/infer", content=json.dumps(doc).encode(), timeout=10)

    try:
        r = post({"shared_memory_region": f"bad-{tag}", "shared_memory_byte_size": 64})
        assert r.status_code == 400 and "not registered" in r.json()["error"]
        client.register_system_shared_memory(f"bad-{tag}", key, 64)
        r = post(
            {"shared_memory_region": f"bad-{tag}", "shared_memory_byte_size": 64, "shared_memory_offset": 8}
        )
        assert r.status_code == 400 and "exceeds region" in r.json()["error"]
        r = post({"shared_memory_region": f"bad-{tag}", "shared_memory_byte_size": 32})
        assert r.status_code == 400 and "needs 64" in r.json()["error"]
        with pytest.raises(InferenceServerException):
            client.register_system_shared_memory(f"big-{tag}", key, 1 << 20)
        for resp in (r,):
            assert key not in resp.text and key.strip("/") not in resp.text
    finally:
        client.unregister_system_shared_memory(f"bad-{tag}")
        shm_utils.destroy_shared_memory_region(handle)


@pytest.mark.parametrize(
    ("header", "tail", "says"),
    [("12abc", b"", "Inference-Header-Content-Length"), (None, b"\x00" * 8, "binary section holds")],
)
def test_binary_protocol_errors(stack: Any, header: str | None, tail: bytes, says: str) -> None:
    url = stack.url if hasattr(stack, "url") else stack.gateway_url
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "datatype": "FP32",
                    "shape": [1, 16],
                    "parameters": {"binary_data_size": 64},
                }
            ]
        }
    ).encode()
    hdrs = {"Inference-Header-Content-Length": header if header is not None else str(len(head))}
    r = httpx.post(f"{url}/v2/models/mlp/infer", content=head + b"\x00" * 64 + tail, headers=hdrs, timeout=10)
    assert r.status_code == 400 and says in r.json()["error"]
