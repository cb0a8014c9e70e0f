"""Warm-up before READY (warmup.py): every batch-size bucket runs before a model is advertised;
a deployed model whose first calls are slow is not in the registry (nor READY) until its warm-up
ended, and then its first real request is fast; the time is a metric and a log line."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_client import REGISTRY

from anvil_core import codec, keys
from anvil_core.codec import pb
from anvil_core.model_spec import ModelSpec, TensorSpec
from anvil_core.tensors import HostTensor
from anvil_executor.batch_runner import run_batch
from anvil_executor.models import Model, RequestInputs, RequestOutputs, load_builtin
from anvil_executor.warmup import SHORT_SEQ, batch_sizes, sample_request, warm_up

COLD_S = 0.3  # what a never-seen batch size costs SlowFirstModel (a JIT compile, say)


class SlowFirstModel(Model):
    """INPUT0 (B, -1) FP32 -> OUTPUT0 = 2 x INPUT0. The first call of each batch size is cold
    (sleeps COLD_S); the very first call also waits for ``gate`` (a warm-up that takes as long
    as the test wants)."""

    def __init__(self, max_batch: int, max_seq: int = 0) -> None:
        self.spec = ModelSpec(
            name="slow",
            max_batch=max_batch,
            inputs=(TensorSpec("INPUT0", "FP32", (-1,)),),
            outputs=(TensorSpec("OUTPUT0", "FP32", (-1,)),),
        )
        self.max_seq = max_seq
        self.calls: list[tuple[int, int]] = []  # (requests, seq) per call
        self.cold: list[int] = []  # batch sizes that were cold, in call order
        self.entered, self.gate = threading.Event(), threading.Event()
        self.gate.set()

    def run(self, batch: list[RequestInputs]) -> list[RequestOutputs]:
        if not self.calls:
            self.entered.set()
            assert self.gate.wait(30), "the test never opened the gate"
        n = len(batch)
        if n not in {c for c, _ in self.calls}:
            self.cold.append(n)
            time.sleep(COLD_S)
        self.calls.append((n, int(batch[0]["INPUT0"].shape[1])))
        return [{"OUTPUT0": 2 * r["INPUT0"]} for r in batch]


def _metric(model: str) -> float | None:
    return REGISTRY.get_sample_value("anvil_executor_warmup_seconds", {"model": model})


def test_batch_size_buckets() -> None:
    assert batch_sizes(1) == [1]
    assert batch_sizes(8) == list(range(1, 9))
    assert batch_sizes(64) == [*range(1, 17), 32, 64]
    assert batch_sizes(40) == [*range(1, 17), 32, 40]
    assert batch_sizes(0) == [1]


@pytest.mark.parametrize("name", ["identity", "mlp", "busy", "mlp4x1024"])
def test_sample_requests_fit_the_builtin_specs(name: str) -> None:
    model = load_builtin(name, 8)
    req = sample_request(model.spec)
    model.spec.validate([HostTensor.from_array(t.name, t.datatype, req[t.name]) for t in model.spec.inputs])
    assert len(model.run([req, req])) == 2


def test_sample_request_of_token_and_text_inputs() -> None:
    spec = ModelSpec(
        name="enc",
        max_batch=4,
        inputs=(
            TensorSpec("input_ids", "INT64", (-1,)),
            TensorSpec("attention_mask", "INT64", (-1,)),
            TensorSpec("TEXT", "BYTES", ()),
        ),
        outputs=(TensorSpec("y", "FP32", (4,)),),
    )
    req = sample_request(spec, seq=5)
    assert req["input_ids"].shape == (1, 5) and req["input_ids"].dtype == np.int64
    assert (req["attention_mask"] == 1).all()  # every token valid
    assert req["TEXT"].shape == (1,) and isinstance(req["TEXT"][0], bytes)
    assert len(sample_request(spec, seq=64)["TEXT"][0].split()) >= 64  # past a 64-token limit


class TextRecorder(Model):
    """TEXT (BYTES) -> EMBEDDING; records the words per call, like a tokenizer's input."""

    def __init__(self) -> None:
        self.spec = ModelSpec(
            name="text",
            max_batch=4,
            inputs=(TensorSpec("TEXT", "BYTES", ()),),
            outputs=(TensorSpec("EMBEDDING", "FP32", (2,)),),
        )
        self.buckets = [16, 32, 48]  # token lengths it pads to (TextEmbeddingModel's)
        self.calls: list[tuple[int, int]] = []  # (requests, words of the first text)

    def run(self, batch: list[RequestInputs]) -> list[RequestOutputs]:
        self.calls.append((len(batch), len(batch[0]["TEXT"][0].split())))
        return [{"EMBEDDING": np.zeros((1, 2), np.float32)} for _ in batch]


def test_text_models_warm_up_short_sentences_then_their_longest() -> None:
    model = TextRecorder()
    warm_up(model, executor_max_batch=64)
    short = model.calls[0][1]
    assert model.calls[:-1] == [(n, short) for n in (1, 2, 3, 4)] and short < 48
    assert model.calls[-1][0] == 4 and model.calls[-1][1] >= 48  # the longest bucket's worth


def test_warm_up_runs_every_bucket_the_scheduler_can_send(caplog: pytest.LogCaptureFixture) -> None:
    model = SlowFirstModel(max_batch=20, max_seq=64)
    with caplog.at_level(logging.INFO, logger="anvil.executor.warmup"):
        report = warm_up(model, executor_max_batch=64)  # the model's 20 caps the scheduler's batches
    sizes = [*range(1, 17), 20]
    assert report.batch_sizes == tuple(sizes)
    assert model.calls == [(n, SHORT_SEQ) for n in sizes] + [(20, 64)]  # then the longest sequence
    assert model.cold == sizes and report.runs == len(sizes) + 1
    assert report.seconds >= len(sizes) * COLD_S and report.first_run_s >= COLD_S
    assert _metric("slow") == pytest.approx(report.seconds)
    (rec,) = [r for r in caplog.records if r.getMessage() == "model warmed up"]
    assert rec.__dict__["model"] == "slow" and rec.__dict__["warmup_s"] == round(report.seconds, 4)
    assert rec.__dict__["batch_sizes"] == sizes
    model.cold.clear()
    model.run([sample_request(model.spec)] * 7)  # any size the scheduler sends is warm now
    assert model.cold == []


# ---- the executor: READY only after warm-up ---------------------------------------------------


def _request_batch(model: str, x: np.ndarray) -> tuple[pb.BatchT, list[object]]:
    payloads: list[object] = []
    inputs = codec.tensor_frames([HostTensor.from_array("INPUT0", "FP32", x)], payloads)
    env = codec.build_request(
        request_id="r0",
        trace_id="t",
        model=model,
        version="1",
        priority=2,
        deadline_unix_ns=time.time_ns() + 10**10,
        tenant="default",
        inputs=inputs,
    )
    batch = pb.BatchT()
    batch.batchId, batch.model, batch.frameCounts = "b1", model, [1 + len(payloads)]
    return batch, [env, *payloads]


def _wait(pred: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


@pytest.fixture()
def executor(redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, Any]]:
    """An executor (built-in identity) with a fast beat, whose next deployed artifact loads as a
    SlowFirstModel with a closed gate."""
    from anvil_executor import artifact
    from anvil_executor.service import Executor
    from anvil_executor.settings import ExecutorSettings

    slow = SlowFirstModel(max_batch=4)
    slow.gate.clear()
    monkeypatch.setattr(artifact, "load_artifact", lambda *args: (slow, slow))
    settings = ExecutorSettings(
        redis_url=redis_url,
        service_id="ex-warm",
        models="identity",
        artifact_dir=str(tmp_path),
        metrics_port=0,  # an ephemeral port
        heartbeat_interval_ms=100,
        shm_inputs=False,
        zmq_curve=False,  # no scheduler here: nothing to authenticate
    )
    ex = Executor(settings)
    stop = threading.Event()
    loop = threading.Thread(target=ex.run, args=(stop,), daemon=True)
    loop.start()
    try:
        yield ex, slow
    finally:
        slow.gate.set()
        stop.set()
        loop.join(10)


def test_deployed_model_is_ready_only_after_warm_up(executor: tuple[Any, Any], redis_url: str) -> None:
    import redis

    ex, slow = executor
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    record = keys.svc_key("executor", "ex-warm")

    def advertised() -> list[str]:
        return list(json.loads(r.hget(record, "models") or "[]"))

    _wait(lambda: advertised() == ["identity"], "the executor's first beat")
    r.hset(keys.model_key("slow"), mapping={"artifact": "a1a1a1a1", "status": "COMPILED", "spec": "{}"})
    assert slow.entered.wait(20), "the deployed model was never run"
    # warm-up is under way (its first run blocked): beats go on without the model
    beat = r.hget(record, "beat_at")
    _wait(lambda: r.hget(record, "beat_at") != beat, "a beat during warm-up")
    beat = r.hget(record, "beat_at")
    _wait(lambda: r.hget(record, "beat_at") != beat, "a second beat during warm-up")
    assert "slow" not in advertised() and "slow" not in ex.models
    assert r.hget(keys.served_key("ex-warm"), "slow") is None  # not advertised as served
    assert _metric("slow") is None or not slow.calls  # no warm-up figure before it ran

    t_open = time.perf_counter()
    slow.gate.set()
    _wait(lambda: "slow" in advertised() and r.hget(keys.served_key("ex-warm"), "slow"), "READY")
    # every bucket the scheduler can send (1..4) had run when the model was advertised
    assert {n for n, _ in slow.calls} == {1, 2, 3, 4} and slow.cold == [1, 2, 3, 4]
    warm_s = _metric("slow")
    assert warm_s is not None and warm_s >= 4 * COLD_S and time.perf_counter() - t_open >= 4 * COLD_S

    x = np.arange(6, dtype=np.float32).reshape(1, 6)
    batch, frames = _request_batch("slow", x)
    t0 = time.perf_counter()
    result, out = run_batch(ex.models, batch, frames, "ex-warm", "cpu")
    first_s = time.perf_counter() - t0
    assert result.error is None and slow.cold == [1, 2, 3, 4]  # the first request found it warm
    assert first_s < COLD_S / 3, first_s
    resp = codec.read_response(out[0])
    np.testing.assert_array_equal(codec.request_tensor(resp.outputs[0], out[1:]).data, 2 * x)
