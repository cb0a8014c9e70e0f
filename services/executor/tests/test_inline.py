"""The lone-batch fast path (service.py `_inline`, issue #19): a batch that finds the executor idle,
of a model whose last batch was fast, runs on the I/O loop instead of the compute thread; a batch
that finds work in flight, of a model never measured or a slow one, goes to the compute thread as
before. Checked by the thread each batch ran on, with events, not timings."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zmq

from anvil_core import codec
from anvil_core.model_spec import ModelSpec, TensorSpec
from anvil_executor.models import Model, RequestInputs, RequestOutputs
from anvil_executor.service import Executor

sys.path.insert(0, str(Path(__file__).parent))
from wire_helpers import batch_frames, executor_settings, result_of


class Recorder(Model):
    """INPUT0 as OUTPUT0; records the thread of each run, and blocks a run while `hold` is clear."""

    def __init__(self, name: str) -> None:
        self.spec = ModelSpec(
            name=name,
            max_batch=8,
            inputs=(TensorSpec("INPUT0", "FP32", (-1,)),),
            outputs=(TensorSpec("OUTPUT0", "FP32", (-1,)),),
        )
        self.ran_on: list[str] = []
        self.running = threading.Event()
        self.release = threading.Event()
        self.release.set()

    def run(self, batch: list[RequestInputs]) -> list[RequestOutputs]:
        self.ran_on.append(threading.current_thread().name)
        self.running.set()
        assert self.release.wait(20), "never released"
        return [{"OUTPUT0": np.asarray(req["INPUT0"])} for req in batch]


@dataclass
class Running:
    """An Executor on its own I/O-loop thread, registered with a stand-in scheduler's ROUTER."""

    ex: Executor
    stop: threading.Event
    loop: threading.Thread
    ctx: zmq.Context[Any]
    router: Any
    ident: bytes
    exited: list[BaseException]  # what ended the loop's thread (SystemExit(3) after a device fault)

    def send(self, batch_id: str, rids: list[str], model: str) -> None:
        self.router.send_multipart([self.ident, *batch_frames(batch_id, rids, model=model)])


@contextmanager
def _running(redis_url: str, tmp_path: Path, models: dict[str, Model], **extra: Any) -> Iterator[Running]:
    settings = executor_settings(redis_url, tmp_path, "ex-inline", **extra)
    ex = Executor(settings)
    ex.models.update(models)
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    ex._follow(f"tcp://127.0.0.1:{port}")
    stop = threading.Event()
    exited: list[BaseException] = []

    def serve() -> None:
        try:
            ex.run(stop)
        except BaseException as exc:  # SystemExit is what the fault test checks
            exited.append(exc)

    loop = threading.Thread(target=serve, name="io-loop", daemon=True)
    loop.start()
    try:
        assert router.poll(30_000), "the executor did not register"
        ident, *_ = router.recv_multipart()
        yield Running(ex, stop, loop, ctx, router, ident, exited)
    finally:
        stop.set()
        loop.join(10)
        router.close()
        ctx.term()


def _ok(result: Any, frames: list[Any], want: float) -> None:
    assert result.error is None
    (group,) = codec.split_groups(frames, result.frameCounts)
    out = codec.request_tensor(codec.read_response(group[0]).outputs[0], group[1:]).data
    assert np.array_equal(out, np.full((1, 4), want, np.float32))


def test_a_lone_batch_of_a_fast_model_runs_on_the_io_loop_and_only_when_idle(
    redis_url: str, tmp_path: Path
) -> None:
    fast, slow = Recorder("fast"), Recorder("slow")
    with _running(redis_url, tmp_path, {"fast": fast, "slow": slow}) as r:
        ex, router = r.ex, r.router
        r.send("1", ["a"], "fast")
        _ok(*result_of(router, "1"), 0.0)
        assert fast.ran_on == ["compute-0"]  # never measured: the compute thread measures it

        slow.release.clear()  # batch 2 holds the compute thread: batch 3 finds work in flight
        r.send("2", ["a"], "slow")
        assert slow.running.wait(20)
        queued = threading.Event()  # batch 3 reached the compute queue (behind batch 2)
        put = ex.work.put
        ex.work.put = lambda *a, **k: (put(*a, **k), queued.set())  # type: ignore[method-assign]
        r.send("3", ["a", "b"], "fast")
        assert queued.wait(20)
        slow.release.set()
        _ok(*result_of(router, "2"), 0.0)
        result, _ = result_of(router, "3")
        assert result.error is None and list(result.frameCounts) == [2, 2]
        assert fast.ran_on == ["compute-0", "compute-0"] and ex.inline_batches == 0

        r.send("4", ["a"], "fast")  # idle now, and fast
        _ok(*result_of(router, "4"), 0.0)
        assert fast.ran_on[-1] == "io-loop" and ex.inline_batches == 1
        assert ex.inflight == 0


@pytest.mark.parametrize("inline_max_us", [0, 2000])
def test_inline_off_or_a_slow_model_stays_on_the_compute_thread(
    redis_url: str, tmp_path: Path, inline_max_us: int
) -> None:
    fast = Recorder("fast")
    with _running(redis_url, tmp_path, {"fast": fast}, inline_max_us=inline_max_us) as r:
        for bid in ("1", "2", "3"):
            if inline_max_us and bid != "1":  # its last batch "took" 500 ms: too slow to hold the loop
                r.ex._compute_s["fast"] = 0.5
            r.send(bid, ["a"], "fast")
            _ok(*result_of(r.router, bid), 0.0)
        assert fast.ran_on == ["compute-0"] * 3 and r.ex.inline_batches == 0


class Preparer(Recorder):
    """A model that `prepare`s (as a text model tokenizes): records where prepare and run ran."""

    prepares = True

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.prepared_on: list[str] = []

    def prepare(self, batch: list[RequestInputs]) -> Any:
        self.prepared_on.append(threading.current_thread().name)
        return batch


def test_a_lone_batch_of_a_model_that_prepares_runs_prepare_and_run_on_the_io_loop(
    redis_url: str, tmp_path: Path
) -> None:
    model = Preparer("prep")
    with _running(redis_url, tmp_path, {"prep": model}) as r:
        r.send("1", ["a"], "prep")
        _ok(*result_of(r.router, "1"), 0.0)
        assert model.ran_on == ["compute-0"]  # never measured yet
        r.send("2", ["a"], "prep")
        _ok(*result_of(r.router, "2"), 0.0)
        # idle and measured fast: run (which prepares itself when nothing was prepared) on the loop
        assert model.ran_on[-1] == "io-loop" and r.ex.inline_batches == 1
        assert r.ex.inflight == 0


class CUDARuntimeError(RuntimeError):
    """Named as CuPy's: `device.is_device_fault` knows a device fault by this class name."""


class Faulty(Recorder):
    """Fails its `fail_at`-th run with a device fault (an illegal address, say)."""

    def __init__(self, name: str, fail_at: int) -> None:
        super().__init__(name)
        self.fail_at = fail_at

    def run(self, batch: list[RequestInputs]) -> list[RequestOutputs]:
        out = super().run(batch)
        if len(self.ran_on) == self.fail_at:
            raise CUDARuntimeError("cudaErrorIllegalAddress: an illegal memory access was encountered")
        return out


@pytest.mark.parametrize("fail_at", [1, 2], ids=["on the compute thread", "inline"])
def test_a_device_fault_answers_the_batch_with_an_error_then_the_executor_exits(
    redis_url: str, tmp_path: Path, fail_at: int
) -> None:
    model = Faulty("gpu", fail_at)
    with _running(redis_url, tmp_path, {"gpu": model}) as r:
        for bid in [str(i) for i in range(1, fail_at)]:  # runs that measure it fast: the next is inline
            r.send(bid, ["a"], "gpu")
            _ok(*result_of(r.router, bid), 0.0)
        r.send("bad", ["a", "b"], "gpu")
        result, _ = result_of(r.router, "bad")
        assert result.error is not None and "illegal memory access" in (result.error.reason or "")
        assert model.ran_on[-1] == ("io-loop" if fail_at == 2 else "compute-0")
        r.loop.join(30)  # the stop event is never set: only the fault ends the loop
        assert not r.loop.is_alive(), "the executor kept serving on a faulted device"
        assert len(r.exited) == 1 and isinstance(r.exited[0], SystemExit) and r.exited[0].code == 3
