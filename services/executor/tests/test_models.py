"""Built-in models and the batch runner (the executor's compute path, no sockets)."""

from __future__ import annotations

import numpy as np
import pytest
from anvil_core import wire
from anvil_core.tensors import HostTensor
from anvil_core.wire import pb
from anvil_executor.batch_runner import run_batch
from anvil_executor.models import Model, RequestInputs, RequestOutputs, load_builtin
from anvil_executor.models.builtin import mlp_reference


def _batch(
    model: str, rows: list[np.ndarray], name: str = "INPUT0", dtype: str = "FP32"
) -> tuple[pb.BatchT, list[object]]:
    frames: list[object] = []
    batch = pb.BatchT()
    batch.batchId = "b1"
    batch.model = model
    batch.requests = []
    for i, x in enumerate(rows):
        req = pb.InferRequestT()
        req.requestId = f"r{i}"
        req.model = model
        req.inputs = [wire.encode_tensor(HostTensor.from_array(name, dtype, x), frames)]
        batch.requests.append(req)
    return batch, frames


def test_mlp_batches_rows_of_several_requests_and_matches_numpy() -> None:
    rng = np.random.default_rng(1)
    rows = [rng.standard_normal((n, 16)).astype(np.float32) for n in (1, 3, 2)]
    batch, frames = _batch("mlp", rows)
    models = {"mlp": load_builtin("mlp", 64)}
    result, out = run_batch(models, batch, frames, "ex", "cpu")
    assert result.error is None
    for x, resp in zip(rows, result.responses, strict=True):
        got = wire.decode_tensor(resp.outputs[0], out).data
        np.testing.assert_allclose(got, mlp_reference(x), rtol=1e-6, atol=1e-6)


def test_identity_returns_its_input() -> None:
    x = np.arange(7, dtype=np.float32).reshape(1, 7)
    batch, frames = _batch("identity", [x])
    result, out = run_batch({"identity": load_builtin("identity", 8)}, batch, frames, "ex", "cpu")
    np.testing.assert_array_equal(wire.decode_tensor(result.responses[0].outputs[0], out).data, x)


def test_a_bad_request_fails_alone_and_the_rest_of_the_batch_runs() -> None:
    good = np.zeros((1, 16), np.float32)
    batch, frames = _batch("mlp", [good, np.zeros((1, 3), np.float32)])
    result, _ = run_batch({"mlp": load_builtin("mlp", 8)}, batch, frames, "ex", "cpu")
    assert result.responses[0].error is None
    assert result.responses[1].error.code == pb.ErrorCode.BAD_REQUEST
    assert "does not match" in wire.text(result.responses[1].error.reason)


class _Broken(Model):
    def __init__(self) -> None:
        self.spec = load_builtin("identity", 8).spec

    def run(self, batch: list[RequestInputs]) -> list[RequestOutputs]:
        raise RuntimeError("kaboom")


def test_a_model_failure_fails_the_whole_batch_with_the_reason() -> None:
    batch, frames = _batch("identity", [np.zeros((1, 2), np.float32)] * 3)
    result, _ = run_batch({"identity": _Broken()}, batch, frames, "ex", "cpu")
    assert result.error.code == pb.ErrorCode.INTERNAL
    assert "kaboom" in wire.text(result.error.reason)


def test_unknown_model_is_not_found() -> None:
    batch, frames = _batch("nope", [np.zeros((1, 2), np.float32)])
    result, _ = run_batch({}, batch, frames, "ex", "cpu")
    assert result.error.code == pb.ErrorCode.NOT_FOUND


def test_unknown_builtin_names_the_builtins() -> None:
    with pytest.raises(ValueError, match="identity"):
        load_builtin("resnet", 8)
