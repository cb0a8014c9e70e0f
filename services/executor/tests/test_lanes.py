"""Compute lanes (ANVIL_LANES, plan_runtime/lanes.py): N compute threads in one executor, each running
its own instance of every compiled plan. Checked with events (a barrier both lanes must reach at
once), not timings: with one compute thread the barrier breaks and the batches fail."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from anvil_core import codec
from anvil_core.codec import pb
from anvil_core.model_spec import ModelSpec, TensorSpec
from anvil_executor.artifact import load_artifact
from anvil_executor.device import parse_device
from anvil_executor.models import Model, RequestInputs, RequestOutputs
from anvil_executor.models.text_embedding import TextEmbeddingModel
from anvil_executor.plan_runtime import PlanModel
from anvil_executor.plan_runtime.lanes import LanedPlan, current_lane, set_lane, use_lane
from anvil_executor.settings import ExecutorSettings

sys.path.insert(0, str(Path(__file__).parent))
from test_artifact import _compile
from test_inline import _running


class Rendezvous(Model):
    """INPUT0 as OUTPUT0, once `parties` runs are inside `run` at the same time (else it fails)."""

    def __init__(self, parties: int, timeout_s: float = 20) -> None:
        self.spec = ModelSpec(
            name="meet",
            max_batch=8,
            inputs=(TensorSpec("INPUT0", "FP32", (-1,)),),
            outputs=(TensorSpec("OUTPUT0", "FP32", (-1,)),),
        )
        self.barrier = threading.Barrier(parties, timeout=timeout_s)
        self.ran_on: list[str] = []

    def run(self, batch: list[RequestInputs]) -> list[RequestOutputs]:
        self.ran_on.append(threading.current_thread().name)
        self.barrier.wait()  # BrokenBarrierError when alone past the timeout: the batch's error
        return [{"OUTPUT0": np.asarray(req["INPUT0"])} for req in batch]


def test_two_lanes_run_two_batches_at_once_and_advertise_credits_per_lane(
    redis_url: str, tmp_path: Path
) -> None:
    model = Rendezvous(2)
    with _running(redis_url, tmp_path, {"meet": model}, lanes=2, credits=2) as r:
        r.send("1", ["a"], "meet")
        r.send("2", ["b"], "meet")
        results: dict[str, Any] = {}  # in either order
        while len(results) < 2:
            assert r.router.poll(30_000), f"results so far: {sorted(results)}"
            _, *parts = r.router.recv_multipart()
            body, _ = codec.unpack(parts)
            if isinstance(body, pb.BatchResultT):
                results[body.batchId] = body
        for result in results.values():
            assert result.error is None, result.error.message
        assert sorted(model.ran_on) == ["compute-0", "compute-1"]
        r.ex._register()  # what the scheduler is told: 2 credits on each of 2 lanes
        while True:
            _, *parts = r.router.recv_multipart()
            body, _ = codec.unpack(parts)
            if isinstance(body, pb.RegisterT):
                assert body.credits == 4 and body.lanes == 2
                break


def test_with_one_lane_the_second_batch_waits_for_the_first(redis_url: str, tmp_path: Path) -> None:
    """The rendezvous above needs two lanes: one compute thread runs the batches one after the other."""
    model = Rendezvous(2, timeout_s=1)
    with _running(redis_url, tmp_path, {"meet": model}) as r:
        r.send("1", ["a"], "meet")
        r.send("2", ["b"], "meet")
        errors = []
        while len(errors) < 2:
            assert r.router.poll(30_000)
            _, *parts = r.router.recv_multipart()
            body, _ = codec.unpack(parts)
            if isinstance(body, pb.BatchResultT):
                errors.append(body.error is not None)
        assert errors == [True, True] and model.ran_on == ["compute-0", "compute-0"]


def test_lanes_are_bounded() -> None:
    with pytest.raises(ValueError, match="lanes"):
        ExecutorSettings(lanes=0)
    with pytest.raises(ValueError, match="lanes"):
        ExecutorSettings(lanes=17)


def test_a_thread_runs_its_own_lane_and_a_block_can_borrow_another() -> None:
    seen: dict[str, int] = {}

    def worker(i: int) -> None:
        set_lane(i)
        seen[f"t{i}"] = current_lane()

    threads = [threading.Thread(target=worker, args=(i,)) for i in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == {"t1": 1, "t2": 2} and current_lane() == 0  # other threads' lanes are their own
    with use_lane(3):
        assert current_lane() == 3
    assert current_lane() == 0
    with pytest.raises(ValueError):
        set_lane(-1)


def test_a_laned_artifact_runs_each_call_on_the_callers_own_plan_instance(tmp_path: Path) -> None:
    art = _compile(tmp_path, with_tokenizer=False)
    single, _ = load_artifact(art, parse_device("cpu"), "tiny")
    laned, plan = load_artifact(art, parse_device("cpu"), "tiny", lanes=2)
    assert laned is plan and isinstance(plan, LanedPlan) and len(plan.lanes) == 2
    assert all(isinstance(lane, PlanModel) for lane in plan.lanes) and plan.lanes[0] is not plan.lanes[1]
    assert plan.spec == single.spec and plan.max_batch == single.max_batch  # type: ignore[attr-defined]
    calls: list[tuple[int, str]] = []
    for i, lane in enumerate(plan.lanes):
        inner = lane._run_chunk

        def spy(reqs: Any, lens: Any, t: int, i: int = i, inner: Any = inner) -> Any:
            calls.append((i, threading.current_thread().name))
            return inner(reqs, lens, t)

        lane._run_chunk = spy  # type: ignore[method-assign]
    ids = np.array([[1, 7, 8, 9, 2]], np.int64)  # the tiny vocabulary has 19 ids
    req = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    want = single.run([req])[0]["sentence_embedding"]
    got: dict[int, np.ndarray] = {}

    def on_lane(i: int) -> None:
        set_lane(i)
        got[i] = plan.run([req])[0]["sentence_embedding"]

    threads = [threading.Thread(target=on_lane, args=(i,), name=f"lane{i}") for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(calls) == [(0, "lane0"), (1, "lane1")]
    for i in (0, 1):
        np.testing.assert_array_equal(got[i], want)


def test_a_laned_text_encoder_packs_on_the_callers_lane(tmp_path: Path) -> None:
    art = _compile(tmp_path, with_tokenizer=True)
    model, plan = load_artifact(art, parse_device("cpu"), "tiny", lanes=2)
    assert isinstance(model, TextEmbeddingModel) and isinstance(plan, LanedPlan)
    assert model.packed is not None  # the CPU plan runs packed, per lane
    used: list[int] = []
    for i, lane in enumerate(plan.lanes):
        runner = lane.packed  # type: ignore[attr-defined]
        inner = runner.run
        runner.run = lambda ids, cu, i=i, inner=inner: (used.append(i), inner(ids, cu))[1]
    reqs = [{"TEXT": np.array([b"the cat sat on the mat"], dtype=object)}]
    with use_lane(1):
        one = model.run(reqs)[0]["EMBEDDING"]
    zero = model.run(reqs)[0]["EMBEDDING"]
    assert used == [1, 0]
    np.testing.assert_array_equal(one, zero)
