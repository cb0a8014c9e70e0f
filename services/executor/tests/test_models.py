"""Built-in models and the batch runner (the executor's compute path, no sockets)."""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest

from anvil_core import codec
from anvil_core.codec import pb
from anvil_core.tensors import HostTensor
from anvil_executor.batch_runner import run_batch
from anvil_executor.models import Model, RequestInputs, RequestOutputs, load_builtin
from anvil_executor.models.builtin import mlp_reference


def _batch(
    model: str, rows: list[np.ndarray], deadline_ns: int | None = None
) -> tuple[pb.BatchT, list[object]]:
    frames: list[object] = []
    batch = pb.BatchT()
    batch.batchId = "b1"
    batch.model = model
    batch.frameCounts = []
    for i, x in enumerate(rows):
        payloads: list[object] = []
        inputs = codec.tensor_frames([HostTensor.from_array("INPUT0", "FP32", x)], payloads)
        env = codec.build_request(
            request_id=f"r{i}",
            trace_id="t",
            model=model,
            version="1",
            priority=2,
            deadline_unix_ns=deadline_ns if deadline_ns is not None else time.time_ns() + 10**10,
            tenant="default",
            inputs=inputs,
        )
        frames += [env, *payloads]
        batch.frameCounts.append(1 + len(payloads))
    return batch, frames


def _answers(frames: list[object], counts: list[int]) -> list[tuple[pb.InferResponseT, list[object]]]:
    return [(codec.read_response(g[0]), g[1:]) for g in codec.split_groups(frames, counts)]


def test_mlp_batches_rows_of_several_requests_and_matches_numpy() -> None:
    rng = np.random.default_rng(1)
    rows = [rng.standard_normal((n, 16)).astype(np.float32) for n in (1, 3, 2)]
    batch, frames = _batch("mlp", rows)
    result, out = run_batch({"mlp": load_builtin("mlp", 64)}, batch, frames, "ex", "cpu")
    assert result.error is None
    answers = _answers(out, result.frameCounts)
    assert [a.requestId for a, _ in answers] == ["r0", "r1", "r2"]
    for x, (resp, payloads) in zip(rows, answers, strict=True):
        got = codec.request_tensor(resp.outputs[0], payloads).data
        np.testing.assert_allclose(got, mlp_reference(x), rtol=1e-6, atol=1e-6)


def test_identity_returns_its_input() -> None:
    x = np.arange(7, dtype=np.float32).reshape(1, 7)
    batch, frames = _batch("identity", [x])
    result, out = run_batch({"identity": load_builtin("identity", 8)}, batch, frames, "ex", "cpu")
    resp, payloads = _answers(out, result.frameCounts)[0]
    np.testing.assert_array_equal(codec.request_tensor(resp.outputs[0], payloads).data, x)


def test_a_bad_request_fails_alone_and_the_rest_of_the_batch_runs() -> None:
    good = np.zeros((1, 16), np.float32)
    batch, frames = _batch("mlp", [good, np.zeros((1, 3), np.float32)])
    result, out = run_batch({"mlp": load_builtin("mlp", 8)}, batch, frames, "ex", "cpu")
    (ok, _), (bad, _) = _answers(out, result.frameCounts)
    assert ok.error is None and len(ok.outputs) == 1
    assert bad.error.code == pb.ErrorCode.BAD_REQUEST
    assert "does not match" in bad.error.reason


def test_an_expired_request_is_not_executed() -> None:
    batch, frames = _batch("mlp", [np.zeros((1, 16), np.float32)], deadline_ns=time.time_ns() - 1)
    result, out = run_batch({"mlp": load_builtin("mlp", 8)}, batch, frames, "ex", "cpu")
    resp, _ = _answers(out, result.frameCounts)[0]
    assert resp.error.code == pb.ErrorCode.DEADLINE


class _Broken(Model):
    def __init__(self) -> None:
        self.spec = load_builtin("identity", 8).spec

    def run(self, batch: list[RequestInputs]) -> list[RequestOutputs]:
        raise RuntimeError("kaboom")


def test_a_model_failure_fails_the_whole_batch_with_the_reason() -> None:
    batch, frames = _batch("identity", [np.zeros((1, 2), np.float32)] * 3)
    result, out = run_batch({"identity": _Broken()}, batch, frames, "ex", "cpu")
    assert result.error.code == pb.ErrorCode.INTERNAL and out == []
    assert "kaboom" in str(result.error.reason)


def test_unknown_model_is_not_found() -> None:
    batch, frames = _batch("nope", [np.zeros((1, 2), np.float32)])
    result, _ = run_batch({}, batch, frames, "ex", "cpu")
    assert result.error.code == pb.ErrorCode.NOT_FOUND


def test_frame_counts_that_do_not_add_up_are_a_protocol_error() -> None:
    batch, frames = _batch("identity", [np.zeros((1, 2), np.float32)])
    batch.frameCounts = [5]
    result, _ = run_batch({"identity": load_builtin("identity", 8)}, batch, frames, "ex", "cpu")
    assert result.error.code == pb.ErrorCode.PROTOCOL


def test_unknown_builtin_names_the_builtins() -> None:
    with pytest.raises(ValueError, match="identity"):
        load_builtin("resnet", 8)


class _LimitedIdentity(Model):
    """identity with a limit the spec cannot state: rows of at most 4 values."""

    def __init__(self) -> None:
        self.spec = load_builtin("identity", 8).spec
        self.calls: list[int] = []

    def check_request(self, inputs: RequestInputs) -> None:
        from anvil_core.model_spec import SpecError

        if inputs["INPUT0"].shape[1] > 4:
            raise SpecError(f"rows of {inputs['INPUT0'].shape[1]} values exceed this model's limit of 4")

    def run(self, batch: list[RequestInputs]) -> list[RequestOutputs]:
        self.calls.append(len(batch))
        return [{"OUTPUT0": np.array(r["INPUT0"])} for r in batch]


def test_a_request_past_a_model_limit_is_refused_alone_with_the_limit() -> None:
    model = _LimitedIdentity()
    batch, frames = _batch("identity", [np.ones((1, 4), np.float32), np.ones((1, 9), np.float32)])
    result, out = run_batch({"identity": model}, batch, frames, "ex", "cpu")
    (ok, _), (bad, _) = _answers(out, result.frameCounts)
    assert ok.error is None and model.calls == [1]  # the model ran only the request within the limit
    assert bad.error.code == pb.ErrorCode.BAD_REQUEST
    assert "limit of 4" in bad.error.reason


def test_a_plan_refuses_sequences_past_its_max_seq() -> None:
    from anvil_core.model_spec import SpecError
    from anvil_executor.plan_runtime.io import PlanIO

    class _Plan(PlanIO):
        def _run_chunk(self, reqs: list[RequestInputs], lens: list[int], t: int) -> dict[str, np.ndarray]:
            raise AssertionError("not run")

    plan = _Plan.__new__(_Plan)
    plan.seq_inputs, plan.max_seq = ["input_ids"], 128
    plan.check_request({"input_ids": np.zeros((1, 128), np.int64)})
    with pytest.raises(SpecError, match="sequence of 129 exceeds the model's limit of 128"):
        plan.check_request({"input_ids": np.zeros((1, 129), np.int64)})


def test_every_answer_carries_its_batchs_measurements_and_its_place_in_it() -> None:
    """Statistics (InferResponse.batch_size ...): rows of the requests that ran, the batch's own
    copy-in / run / copy-out times on each answer, and indices among the answers that ran, so
    exactly one answer (index 0) counts the batch; a refused request is in neither."""
    rows = [np.ones((n, 16), np.float32) for n in (2, 1)]
    batch, frames = _batch("mlp", [rows[0], np.zeros((1, 3), np.float32), rows[1]])
    batch.queueUs = [40, 41, 42]
    batch.sentUnixNs = 1_764_700_000_000_000_000  # the scheduler's dispatch stamp, echoed
    t0 = time.time_ns()
    result, out = run_batch({"mlp": load_builtin("mlp", 8)}, batch, frames, "ex", "cpu", queued_us=9)
    t1 = time.time_ns()
    first, bad, last = (a for a, _ in _answers(out, result.frameCounts))
    # per-hop stamps (issue #19): dispatch echoed; received and outputs-done in order, within the call
    for a in (first, last):
        assert a.dispatchedUnixNs == batch.sentUnixNs
        assert t0 <= a.executorInUnixNs <= a.executorDoneUnixNs <= t1
    assert bad.executorInUnixNs == 0  # a refused request did not run: no stamps
    assert bad.error is not None and bad.batchSize == 0
    assert (first.batchSize, first.batchIndex, last.batchSize, last.batchIndex) == (3, 0, 3, 1)
    assert (first.queueUs, last.queueUs, first.execQueueUs, last.execQueueUs) == (40, 42, 9, 9)
    times = [(a.computeInputUs, a.computeInferUs, a.computeOutputUs) for a in (first, last)]
    assert times[0] == times[1]  # the batch's, on each
    assert first.computeInputUs + first.computeInferUs + first.computeOutputUs <= first.computeUs
    assert first.computeUs <= result.computeUs


def test_a_model_without_a_batch_dimension_counts_one_inference_per_request() -> None:
    model = load_builtin("identity", 8)
    model.spec = dataclasses.replace(model.spec, max_batch=0)
    batch, frames = _batch("identity", [np.zeros(4, np.float32), np.zeros(2, np.float32)])
    result, out = run_batch({"identity": model}, batch, frames, "ex", "cpu")
    assert [a.batchSize for a, _ in _answers(out, result.frameCounts)] == [2, 2]
