"""Helpers of the executor tests that talk to a real `Executor` through a stand-in scheduler's
ROUTER: wire batches of FP32 (1, 4) requests, and reading one batch's result."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from anvil_core import codec
from anvil_core.codec import pb
from anvil_core.tensors import HostTensor
from anvil_executor.settings import ExecutorSettings


def executor_settings(redis_url: str, tmp_path: Path, service_id: str, **extra: Any) -> ExecutorSettings:
    """An executor's settings for a test that plays its scheduler: the identity model, a free metrics
    port, no shared-memory inputs, and plain ZeroMQ (the stand-in scheduler does no CURVE)."""
    fields: dict[str, Any] = {
        "models": "identity",
        "redis_url": redis_url,
        "metrics_port": free_port(),
        "service_id": service_id,
        "artifact_dir": str(tmp_path),
        "shm_inputs": False,
        "max_batch": 8,
        "zmq_curve": False,
    }
    return ExecutorSettings(**{**fields, **extra})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def batch_frames(batch_id: str, rids: list[str], model: str = "identity") -> list[bytes]:
    frames: list[Any] = []
    counts = []
    for i, rid in enumerate(rids):
        x = HostTensor.from_array("INPUT0", "FP32", np.full((1, 4), i, np.float32))
        payloads: list[Any] = []
        env = codec.build_request(
            request_id=rid,
            trace_id="t",
            model=model,
            version="1",
            priority=2,
            deadline_unix_ns=2**62,
            tenant="",
            inputs=codec.tensor_frames([x], payloads),
        )
        frames += [env, *(bytes(p) for p in payloads)]
        counts.append(1 + len(payloads))
    return [
        bytes(f) for f in codec.pack(pb.BatchT(batchId=batch_id, model=model, frameCounts=counts), frames)
    ]


def result_of(router: zmq.Socket[bytes], batch_id: str, timeout_s: float = 30) -> tuple[Any, list[Any]]:
    """The BatchResult with `batch_id`, skipping heartbeats and the results of fuzzed batches."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not router.poll(100):
            continue
        _, *parts = router.recv_multipart()
        body, frames = codec.unpack(parts)  # what the executor sends must always verify
        if isinstance(body, pb.BatchResultT) and body.batchId == batch_id:
            return body, frames
    raise AssertionError(f"no result for batch {batch_id} within {timeout_s} s")
