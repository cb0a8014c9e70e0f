"""Issue #22 on the real stack: one slow batch must not lock a priority class of a model out.

A stand-in executor (a thread here, speaking the executor protocol to the real scheduler) serves a
model `slowfirst` whose first batch takes 3 s (a new model's compilation / first touch) and every
later one ~0 ms. SLOs run 10x slower than production (500 ms / 2 s / 5 s) so the 2-core machine's own
CPU is not what decides. The first request is answered 504 by the gateway at its deadline; then
sequential requests at every priority must all succeed, and the scheduler must hold nothing after.
Before the fix the slow batch made the batch-of-one prediction rise with each fast batch until every
priority-2 request was shed as overload (429) and priority 1 as hopeless, for good.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import zmq

from anvil_core import codec, keys
from anvil_core.codec import pb
from anvil_core.curve import CurveClient
from anvil_core.model_spec import ModelSpec, TensorSpec
from anvil_core.tensors import HostTensor
from anvil_core.zmq_sockets import make_socket

pytestmark = pytest.mark.integration

MODEL = "slowfirst"
FIRST_BATCH_S = 3.0  # > the 2 s budget of priority 2 here: the gateway answers 504 first


class SlowFirstExecutor(threading.Thread):
    """Registers `slowfirst` (INPUT0 -> OUTPUT0, echo); its first batch takes FIRST_BATCH_S, standing
    in for a model whose first run compiles. Heartbeats every 300 ms like the stack's executors."""

    def __init__(self, endpoint: str, curve: CurveClient) -> None:
        super().__init__(daemon=True, name="slowfirst-executor")
        self.ctx = zmq.Context()
        self.sock = make_socket(self.ctx, zmq.DEALER, identity="slowfirst-ex", connect=endpoint, curve=curve)
        self.stop = threading.Event()
        self.first_done = threading.Event()
        self.batches = 0
        self.held: list[tuple[float, float, pb.BatchT, list[Any]]] = []  # (due, t0, batch, frames)

    def _register(self) -> None:
        reg = pb.RegisterT()
        reg.kind, reg.serviceId, reg.device, reg.maxBatch, reg.credits = (
            pb.ServiceKind.EXECUTOR, "slowfirst-ex", "cpu", 8, 2,
        )  # fmt: skip
        spec = pb.ModelSpecT()
        spec.name, spec.version, spec.maxBatch = MODEL, "1", 8
        reg.models = [spec]
        self.sock.send_multipart(codec.pack(reg))

    def run(self) -> None:
        """The I/O loop keeps heartbeating while the first batch 'runs' (like the real executor,
        whose compute thread is not its I/O loop): the batch is held until it is due."""
        self._register()
        next_beat = time.monotonic() + 0.3
        while not self.stop.is_set():
            if self.sock.poll(20):
                body, frames = codec.unpack(self.sock.recv_multipart(copy=False))
                if isinstance(body, pb.ErrorT):
                    self._register()
                elif isinstance(body, pb.BatchT):
                    now = time.monotonic()
                    due = now + (FIRST_BATCH_S if self.batches == 0 and not self.held else 0.0)
                    self.held.append((due, now, body, frames))
            while self.held and self.held[0][0] <= time.monotonic():
                _, t0, batch, frames = self.held.pop(0)
                self._answer(batch, frames, t0)
            if time.monotonic() >= next_beat:
                hb = pb.HeartbeatT()
                hb.kind, hb.serviceId = pb.ServiceKind.EXECUTOR, "slowfirst-ex"
                self.sock.send_multipart(codec.pack(hb))
                next_beat = time.monotonic() + 0.3
        self.sock.close()
        self.ctx.term()

    def _answer(self, batch: pb.BatchT, frames: list[Any], t0: float) -> None:
        out: list[Any] = []
        counts: list[int] = []
        for group in codec.split_groups(frames, batch.frameCounts or ()):
            req = codec.read_request(group[0])
            x = codec.request_tensor(req.inputs[0], group[1:])
            payloads: list[Any] = []
            outputs = codec.tensor_frames([HostTensor.from_array("OUTPUT0", "FP32", x.data)], payloads)
            env = codec.build_response(
                request_id=req.requestId, trace_id=req.traceId, model=MODEL, outputs=outputs
            )
            out += [env, *payloads]
            counts.append(1 + len(payloads))
        res = pb.BatchResultT()
        res.batchId, res.executorId, res.frameCounts = batch.batchId, "slowfirst-ex", counts
        res.computeUs = int((time.monotonic() - t0) * 1e6)  # the device's time, compilation included
        self.sock.send_multipart(codec.pack(res, out))
        self.batches += 1
        self.first_done.set()


@pytest.fixture(scope="module")
def slow_stack(stack_factory: Any) -> Iterator[tuple[Any, SlowFirstExecutor]]:
    stack = stack_factory(
        env={"ANVIL_SLO_P1_MS": "500", "ANVIL_SLO_P2_MS": "2000", "ANVIL_SLO_P3_MS": "5000"}
    )
    spec = ModelSpec(
        name=MODEL,
        max_batch=8,
        inputs=(TensorSpec("INPUT0", "FP32", (-1,)),),
        outputs=(TensorSpec("OUTPUT0", "FP32", (-1,)),),
    )
    r = stack.redis()
    # its advertisement (READY with the spec it serves), as an executor's beat writes it
    r.hset(
        keys.served_key("slowfirst-ex"),
        MODEL,
        json.dumps({"artifact": "", "version": "1", "spec": spec.to_json()}),
    )
    # its registry record, as an executor's beat writes it (no TTL: the module's stack ends with it)
    r.hset(keys.svc_key("executor", "slowfirst-ex"), mapping={"device": "cpu", "models": f'["{MODEL}"]'})
    r.close()
    port = stack.service("scheduler")["env"]["ANVIL_EXECUTOR_PORT"]
    ex = SlowFirstExecutor(f"tcp://127.0.0.1:{port}", stack.curve("executor"))
    ex.start()
    yield stack, ex
    ex.stop.set()
    ex.join(5)


def _infer(client: httpx.Client, priority: int) -> httpx.Response:
    body = {
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}],
        "parameters": {"priority": priority},
    }
    return client.post(f"/v2/models/{MODEL}/infer", json=body)


def test_one_slow_first_batch_locks_no_priority_out(
    slow_stack: tuple[Any, SlowFirstExecutor], waiter: Any, idle_means_zero: Any
) -> None:
    stack, ex = slow_stack
    with httpx.Client(base_url=stack.url, timeout=30) as client:
        waiter(lambda: client.get(f"/v2/models/{MODEL}/ready").status_code == 200, 30, f"{MODEL} ready")
        first = _infer(client, 2)
        assert first.status_code == 504, first.text  # the gateway's deadline, while the batch runs on
        assert ex.first_done.wait(FIRST_BATCH_S + 10)
        got: dict[int, list[tuple[int, str]]] = {}
        for priority in (2, 1, 3, 2):  # priority 2 again last: after the others, still served
            got.setdefault(priority, [])
            for _ in range(30):
                r = _infer(client, priority)
                got[priority].append((r.status_code, r.text[:80]))
        for priority, answers in got.items():
            failed = [a for a in answers if a[0] != 200]
            assert not failed, (priority, failed)
    idle_means_zero(stack)
