"""The executor's prep stage (service.py): a model that `prepares` (a text model: tokenization) has
its next batch prepared on the prep thread while the compute thread runs the batch before it; other
models, and a batch that finds the executor idle, go straight to compute. Checked with events, not
timings: the first batch's compute waits until the second batch's `prepare` has run, which can only
happen if the two overlap."""

from __future__ import annotations

import concurrent.futures
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from anvil_core import codec
from anvil_core.codec import pb
from anvil_core.model_spec import ModelSpec, TensorSpec
from anvil_executor.batch_runner import finish_batch, prepare_batch, run_batch
from anvil_executor.models import Model, RequestInputs, RequestOutputs, load_builtin
from anvil_executor.service import Executor

sys.path.insert(0, str(Path(__file__).parent))
from wire_helpers import batch_frames, executor_settings


class Prepper(Model):
    """INPUT0 + 1 as OUTPUT0; `prepare` adds the 1 and records its thread and batch. ``overlap``: the
    first batch's compute waits (up to 20 s) until a second batch has been prepared, and records
    whether it was (the overlap test; a test that sends one batch would wait the 20 s out)."""

    prepares = True

    def __init__(self, overlap: bool = False) -> None:
        self.overlap = overlap
        self.spec = ModelSpec(
            name="prepper",
            max_batch=8,
            inputs=(TensorSpec("INPUT0", "FP32", (-1,)),),
            outputs=(TensorSpec("OUTPUT0", "FP32", (-1,)),),
        )
        self.prepared_on: list[str] = []
        self.computed_on: list[str] = []
        self.second_prepared = threading.Event()
        self.overlapped: list[bool] = []

    def prepare(self, batch: list[RequestInputs]) -> Any:
        self.prepared_on.append(threading.current_thread().name)
        if len(self.prepared_on) == 2:
            self.second_prepared.set()
        return [np.asarray(req["INPUT0"]) + 1 for req in batch]

    def run_prepared(self, prepared: Any) -> list[RequestOutputs]:
        self.computed_on.append(threading.current_thread().name)
        if self.overlap and len(self.computed_on) == 1:  # the first computes once the second is prepared
            self.overlapped.append(self.second_prepared.wait(20))
        return [{"OUTPUT0": x} for x in prepared]

    def run(self, batch: list[RequestInputs]) -> list[RequestOutputs]:
        return self.run_prepared(self.prepare(batch))


def _outputs(result: Any, frames: list[Any]) -> list[np.ndarray]:
    groups = codec.split_groups(frames, result.frameCounts)
    return [codec.request_tensor(codec.read_response(g[0]).outputs[0], g[1:]).data for g in groups]


def test_prepared_on_one_thread_finished_on_another_equals_run_batch() -> None:
    models: dict[str, Model] = {"prepper": Prepper(), "identity": load_builtin("identity", 8)}
    for name in models:
        batch, frames = codec.unpack(batch_frames("7", ["a", "b"], model=name))
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="other") as pool:
            pending = pool.submit(prepare_batch, models, batch, frames, "ex", "cpu", prepare=True).result()
        got = finish_batch(pending)
        want = run_batch(models, *codec.unpack(batch_frames("7", ["a", "b"], model=name)), "ex", "cpu")
        assert got[0].error is None and got[0].frameCounts == want[0].frameCounts == [2, 2]
        for x, y in zip(_outputs(*got), _outputs(*want), strict=True):
            assert np.array_equal(x, y)
    assert models["prepper"].prepared_on[0] != threading.current_thread().name  # type: ignore[attr-defined]


def test_next_batch_is_prepared_while_the_previous_computes(redis_url: str, tmp_path: Path) -> None:
    settings = executor_settings(redis_url, tmp_path, "ex-prep")
    ex = Executor(settings)
    prepper = Prepper(overlap=True)
    ex.models["prepper"] = prepper
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    ex._follow(f"tcp://127.0.0.1:{port}")
    stop = threading.Event()
    loop = threading.Thread(target=ex.run, args=(stop,), daemon=True)
    loop.start()
    try:
        assert router.poll(30_000), "the executor did not register"
        ident, *_ = router.recv_multipart()
        router.send_multipart([ident, *batch_frames("1", ["a"], model="prepper")])
        router.send_multipart([ident, *batch_frames("2", ["b"], model="prepper")])
        router.send_multipart([ident, *batch_frames("3", ["c"], model="identity")])
        results = {}  # batch 3 goes straight to compute: it may finish before batch 1
        while len(results) < 3:
            _, *parts = router.recv_multipart() if router.poll(30_000) else (None, None)
            assert parts[0] is not None, f"results so far: {sorted(results)}"
            body, frames = codec.unpack(parts)
            if isinstance(body, pb.BatchResultT):
                results[body.batchId] = (body, frames)
        for bid, want in (("1", 1.0), ("2", 1.0), ("3", 0.0)):  # batch_frames fills request i with i
            result, frames = results[bid]
            assert result.error is None
            assert np.array_equal(_outputs(result, frames)[0], np.full((1, 4), want, np.float32))
        assert prepper.overlapped == [True]  # batch 2 was prepared while batch 1 computed
        # batch 1 found the executor idle: prepared inline on the compute thread (no hop to overlap)
        assert sorted(prepper.prepared_on) == ["compute-0", "prep-0"]
        assert prepper.computed_on == ["compute-0", "compute-0"]
        assert ex.inflight == 0
    finally:
        stop.set()
        loop.join(10)
        router.close()
        ctx.term()


class _Clock:
    """A perf_counter_ns that only the model moves: prepare takes 5 ms, the run 1 ms."""

    def __init__(self) -> None:
        self.ns = 10**9

    def __call__(self) -> int:
        return self.ns


def test_a_lone_batch_prepared_where_it_runs_counts_prepare_as_input_not_infer(monkeypatch: Any) -> None:
    """A lone batch is decoded without `prepare` (service.py: inline, or straight to compute); its
    prepare (a text model's tokenization) then runs in finish_batch and is the batch's input time,
    as it is for a batch prepared on the prep thread, not part of the model's infer time."""
    from anvil_executor import batch_runner

    clock = _Clock()
    monkeypatch.setattr(batch_runner.time, "perf_counter_ns", clock)
    model = Prepper()
    prepare, run_prepared = model.prepare, model.run_prepared

    def slow_prepare(batch: list[RequestInputs]) -> Any:
        clock.ns += 5_000_000
        return prepare(batch)

    def slow_run(prepared: Any) -> list[RequestOutputs]:
        clock.ns += 1_000_000
        return run_prepared(prepared)

    model.prepare, model.run_prepared = slow_prepare, slow_run  # type: ignore[method-assign]
    batch, frames = codec.unpack(batch_frames("9", ["a"], model="prepper"))
    pending = prepare_batch({"prepper": model}, batch, frames, "ex", "cpu")  # lone: not prepared
    result, frames_out = finish_batch(pending)
    assert result.error is None and model.prepared_on == ["MainThread"]
    answer = codec.read_response(frames_out[0])
    assert (answer.computeInputUs, answer.computeInferUs) == (5000, 1000)
