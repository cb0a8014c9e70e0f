"""tritonclient.grpc drives the gateway's KServe v2 gRPC endpoint unmodified: health and metadata,
infer with raw (tritonclient's) and typed contents, system shared memory, a 100-request stream, and
the HTTP suite's bad inputs answered with Triton's gRPC codes while the gateway keeps serving."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest

from anvil_executor.models.builtin import mlp_reference

tgrpc = pytest.importorskip("tritonclient.grpc")
shm_utils = pytest.importorskip("tritonclient.utils.shared_memory")
from tritonclient.grpc import service_pb2, service_pb2_grpc  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

pytestmark = pytest.mark.integration


def _target(stack: Any) -> str:
    target = getattr(stack, "grpc_target", None)
    if target is None:
        pytest.fail("the stack publishes no gRPC port (ANVIL_GRPC_PORT=0?)")
    return str(target)


@pytest.fixture
def client(stack: Any) -> Iterator[Any]:
    c = tgrpc.InferenceServerClient(_target(stack))
    yield c
    c.close()


def _x(rows: int, cols: int = 16, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32)


def _input(x: np.ndarray, datatype: str = "FP32", name: str = "INPUT0") -> Any:
    inp = tgrpc.InferInput(name, list(x.shape), datatype)
    inp.set_data_from_numpy(x)
    return inp


def _code(exc: InferenceServerException) -> str:
    return str(exc.status()).removeprefix("StatusCode.")


def test_health_metadata_and_config(client: Any) -> None:
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("mlp") and client.is_model_ready("identity")
    meta = client.get_server_metadata()
    assert meta.name == "anvil" and {"system_shared_memory", "statistics"} <= set(meta.extensions)
    model = client.get_model_metadata("mlp")
    assert model.name == "mlp" and model.versions == ["1"]
    assert [(t.name, t.datatype, list(t.shape)) for t in model.inputs] == [("INPUT0", "FP32", [-1, 16])]
    config = client.get_model_config("mlp").config
    assert config.max_batch_size > 0 and list(config.input[0].dims) == [16]
    assert config.input[0].data_type == tgrpc.model_config_pb2.TYPE_FP32
    assert config.dynamic_batching.priority_levels == 3
    with pytest.raises(InferenceServerException) as exc:
        client.get_model_metadata("no-such-model")
    assert _code(exc.value) == "NOT_FOUND"


@pytest.mark.parametrize("model", ["identity", "mlp"])
def test_infer_raw_contents(client: Any, model: str) -> None:
    x = _x(3, seed=1)
    out = tgrpc.InferRequestedOutput("OUTPUT0")
    result = client.infer(model, [_input(x)], outputs=[out], request_id="abc", priority=1, timeout=2_000_000)
    want = x if model == "identity" else mlp_reference(x)
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), want, rtol=1e-5, atol=1e-6)
    resp = result.get_response()
    assert resp.id == "abc" and resp.model_name == model and resp.model_version == "1"


@pytest.mark.parametrize("model", ["identity", "mlp"])
def test_infer_typed_contents(stack: Any, model: str) -> None:
    """KServe's typed `contents` (tritonclient always sends raw, so the message is built by hand)."""
    x = _x(2, seed=2)
    req = service_pb2.ModelInferRequest(model_name=model, id="typed")
    t = req.inputs.add(name="INPUT0", datatype="FP32", shape=list(x.shape))
    t.contents.fp32_contents.extend(x.reshape(-1).tolist())
    req.parameters["priority"].int64_param = 2
    with grpc.insecure_channel(_target(stack)) as channel:
        resp = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(req, timeout=10)
    got = tgrpc.InferResult(resp).as_numpy("OUTPUT0")
    np.testing.assert_allclose(got, x if model == "identity" else mlp_reference(x), rtol=1e-5, atol=1e-6)


def test_statistics_count_grpc_requests(client: Any) -> None:
    def successes() -> int:
        stats = client.get_inference_statistics("mlp").model_stats
        return int(stats[0].inference_stats.success.count)

    before = successes()
    client.infer("mlp", [_input(_x(1))], priority=3)
    assert successes() == before + 1


@pytest.mark.skipif(
    os.environ.get("ANVIL_STACK", "local") == "docker",
    reason="regions made by this process's uid; against containers, test_compose's system shm test "
    "makes them as the gateway's uid (over HTTP and gRPC)",
)
def test_system_shared_memory(client: Any) -> None:
    x = _x(4, seed=3)
    tag = uuid.uuid4().hex[:8]
    in_key, out_key = f"/anvil-grpc-in-{tag}", f"/anvil-grpc-out-{tag}"
    out_bytes = 4 * 4 * 4
    handle = shm_utils.create_shared_memory_region(f"in-{tag}", in_key, x.nbytes)  # created 0600
    out_handle = shm_utils.create_shared_memory_region(f"out-{tag}", out_key, out_bytes)
    try:
        shm_utils.set_shared_memory_region(handle, [x])
        client.register_system_shared_memory(f"in-{tag}", in_key, x.nbytes)
        client.register_system_shared_memory(f"out-{tag}", out_key, out_bytes)
        status = client.get_system_shared_memory_status().regions
        assert status[f"in-{tag}"].byte_size == x.nbytes and status[f"out-{tag}"].key == out_key
        with pytest.raises(InferenceServerException) as again:
            client.register_system_shared_memory(f"in-{tag}", in_key, x.nbytes)
        assert _code(again.value) == "ALREADY_EXISTS"
        inp = tgrpc.InferInput("INPUT0", list(x.shape), "FP32")
        inp.set_shared_memory(f"in-{tag}", x.nbytes)
        out = tgrpc.InferRequestedOutput("OUTPUT0")
        out.set_shared_memory(f"out-{tag}", out_bytes)
        result = client.infer("mlp", [inp], outputs=[out], priority=3)
        assert list(result.get_output("OUTPUT0").shape) == [4, 4]
        got = shm_utils.get_contents_as_numpy(out_handle, np.float32, [4, 4])
        np.testing.assert_allclose(got, mlp_reference(x), rtol=1e-5, atol=1e-6)
        bad = tgrpc.InferInput("INPUT0", [1, 16], "FP32")
        bad.set_shared_memory(f"in-{tag}", 64, offset=x.nbytes - 32)
        with pytest.raises(InferenceServerException) as exc:
            client.infer("mlp", [bad])
        assert _code(exc.value) == "INVALID_ARGUMENT" and "exceeds region" in exc.value.message()
        assert in_key not in exc.value.message()  # the shm key is never echoed
    finally:
        client.unregister_system_shared_memory(f"in-{tag}")
        client.unregister_system_shared_memory(f"out-{tag}")
        shm_utils.destroy_shared_memory_region(handle)
        shm_utils.destroy_shared_memory_region(out_handle)
    assert not any(name.endswith(tag) for name in client.get_system_shared_memory_status().regions)
    with pytest.raises(InferenceServerException) as cuda:
        client.register_cuda_shared_memory("c", b"\x00" * 64, 0, 64)
    assert _code(cuda.value) == "UNIMPLEMENTED" and "system shared memory" in cuda.value.message()


def test_stream_of_100_requests_all_answered_errors_inline(client: Any) -> None:
    """100 good requests and 2 bad ones interleaved on one stream: every good one answered with its
    own rows, each bad one an error message on the stream, which stays open."""
    n, bad_at = 100, {30, 70}
    results: dict[str, np.ndarray] = {}
    errors: list[str] = []
    done = threading.Condition()

    def callback(result: Any, error: Any) -> None:
        with done:
            if error is not None:
                errors.append(error.message())
            else:
                results[result.get_response().id] = result.as_numpy("OUTPUT0")
            done.notify_all()

    xs = {str(i): _x(1 + i % 4, seed=i) for i in range(n)}
    client.start_stream(callback=callback)
    try:
        for i in range(n):
            if i in bad_at:
                # priority 3 as the good ones: a more important request within the last second is
                # what lets an overloaded gateway shed priority 3 (conftest.is_shed)
                client.async_stream_infer("mlp", [_input(_x(1, cols=15))], request_id=f"bad{i}", priority=3)
            client.async_stream_infer("mlp", [_input(xs[str(i)])], request_id=str(i), priority=3)
        with done:
            assert done.wait_for(lambda: len(results) + len(errors) >= n + len(bad_at), timeout=30), (
                len(results),
                errors,
            )
    finally:
        client.stop_stream()
    assert len(errors) == len(bad_at) and all("does not match [-1, 16]" in e for e in errors)
    assert sorted(results) == sorted(xs)
    for rid, got in results.items():
        np.testing.assert_allclose(got, mlp_reference(xs[rid]), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("model", "build", "code", "says"),
    [
        ("nope", lambda: [_input(_x(1))], "NOT_FOUND", "unknown model 'nope'"),
        ("mlp", lambda: [_input(_x(1).astype(np.float64), "FP64")], "INVALID_ARGUMENT", "datatype FP64"),
        ("mlp", lambda: [_input(_x(1, cols=15))], "INVALID_ARGUMENT", "does not match [-1, 16]"),
        ("mlp", lambda: [_input(_x(65))], "INVALID_ARGUMENT", "batch dimension 65 outside 1..64"),
        ("mlp", lambda: [_input(_x(1), name="X")], "INVALID_ARGUMENT", "missing inputs ['INPUT0']"),
        ("mlp", lambda: [_input(_x(1, cols=2_000_000))], "RESOURCE_EXHAUSTED", "model 'mlp': max_batch 64"),
    ],
)
def test_bad_inputs_get_tritons_codes(client: Any, model: str, build: Any, code: str, says: str) -> None:
    with pytest.raises(InferenceServerException) as exc:
        client.infer(model, build())
    assert _code(exc.value) == code and says in exc.value.message(), exc.value
    assert client.infer("mlp", [_input(_x(1))]).as_numpy("OUTPUT0").shape == (1, 4)  # still serving


@pytest.mark.parametrize(("priority", "timeout"), [(7, None), (2, -5)])
def test_bad_priority_and_timeout(stack: Any, priority: int, timeout: int | None) -> None:
    req = service_pb2.ModelInferRequest(model_name="mlp")
    t = req.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 16])
    t.contents.fp32_contents.extend([0.5] * 16)
    req.parameters["priority"].int64_param = priority
    if timeout is not None:
        req.parameters["timeout"].int64_param = timeout
    with grpc.insecure_channel(_target(stack)) as channel, pytest.raises(grpc.RpcError) as exc:
        service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(req, timeout=10)
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = exc.value.details()
    assert "priority must be 1" in details or "timeout must be a positive integer" in details


def test_api_key_and_repository_over_grpc(strict_stack: Any, waiter: Any) -> None:
    """Without a known key every call that acts for a tenant is UNAUTHENTICATED; with one, the
    repository's index, unload and load (the HTTP routes' deploy/undeploy) work over gRPC."""
    c = tgrpc.InferenceServerClient(_target(strict_stack))
    try:
        for headers, says in ((None, "an API key is required"), ({"x-api-key": "nope"}, "unknown API key")):
            with pytest.raises(InferenceServerException) as exc:
                c.infer("identity", [_input(_x(1, cols=4))], headers=headers)
            assert _code(exc.value) == "UNAUTHENTICATED" and says in exc.value.message()
        with pytest.raises(InferenceServerException) as exc:
            c.get_model_repository_index()
        assert _code(exc.value) == "UNAUTHENTICATED"
        out = subprocess.run(
            [sys.executable, "-m", "anvil_client.cli", "tenant", "add", f"grpc-{uuid.uuid4().hex[:6]}"],
            env=strict_stack.env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        key = out.stdout.strip().splitlines()[-1]
        x = _x(1, cols=4)

        def accepted() -> bool:  # the key reaches the gateway on its next registry refresh
            try:
                c.infer("identity", [_input(x)], headers={"authorization": f"Bearer {key}"})
            except InferenceServerException as e:
                assert _code(e) == "UNAUTHENTICATED", e
                return False
            return True

        waiter(accepted, 10, "the new tenant's key to be accepted over gRPC")
        auth = {"x-api-key": key}
        index = c.get_model_repository_index(headers=auth).models
        assert {(m.name, m.state) for m in index} >= {("identity", "READY"), ("mlp", "READY")}
        c.unload_model("identity", headers=auth)
        with pytest.raises(InferenceServerException) as gone:
            c.infer("identity", [_input(x)], headers=auth)
        assert _code(gone.value) == "NOT_FOUND"
        states = {m.name: m.state for m in c.get_model_repository_index(headers=auth).models}
        assert states["identity"] == "UNAVAILABLE"
        c.load_model("identity", headers=auth)  # answers once it serves, as Triton's does
        assert c.is_model_ready("identity")
        np.testing.assert_array_equal(c.infer("identity", [_input(x)], headers=auth).as_numpy("OUTPUT0"), x)
        with pytest.raises(InferenceServerException) as unknown:
            c.load_model("no-such-model", headers=auth)
        assert _code(unknown.value) == "NOT_FOUND"
    finally:
        c.close()
