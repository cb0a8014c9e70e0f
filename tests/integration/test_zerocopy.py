"""ZeroCopy through the real stack: client shm region -> gateway -> scheduler -> executor -> slot.

The no-copy claim is checked from outside the processes, three ways:
- the bytes on the wire: the kernel's per-socket counters (TCP_INFO via `ss`) of the scheduler's
  gateway-facing and executor-facing connections. For ZeroCopy, gateway -> scheduler and
  scheduler -> executor carry only envelopes (under 4 KiB per 1 MiB request); the same requests over
  HTTP (binary tensors) carry the megabyte on both links: that run is the control that shows the
  measure sees payloads;
- the executor's own counters: inputs read in place from shared memory, 0 bytes copied (each view's
  address is checked against the executor's mapping of the client's region);
- results equal the inputs bit for bit (the bytes the executor read were the client's).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import time
from typing import Any, cast

import httpx
import numpy as np
import pytest
import redis

from anvil_client import AsyncZeroCopyClient, ZeroCopyClient, ZeroCopyError
from anvil_core.zerocopy import Status
from anvil_executor.models.builtin import mlp_reference

pytestmark = pytest.mark.integration

MiB = 1 << 20
ROWS = MiB // 4  # one FP32 row of 1 MiB


def _endpoint(stack: Any) -> str:
    if not hasattr(stack, "service"):
        pytest.skip("ZeroCopy needs the client, gateway and executor on one host (local stack)")
    return str(stack.zerocopy_endpoint())


def _link_bytes(port: int) -> tuple[int, int]:
    """(received, sent) by the listening side over every established TCP connection to `port`."""
    out = subprocess.run(
        ["ss", "-tinH", "state", "established", f"( sport = :{port} )"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    received = sum(int(v) for v in re.findall(r"bytes_received:(\d+)", out))
    sent = sum(int(v) for v in re.findall(r"bytes_sent:(\d+)", out))
    return received, sent


def _wire(stack: Any) -> dict[str, int]:
    """Bytes so far on the two scheduler links, in the direction requests travel."""
    env = stack.service("scheduler")["env"]
    to_scheduler, _ = _link_bytes(int(env["ANVIL_GATEWAY_PORT"]))
    _, to_executor = _link_bytes(int(env["ANVIL_EXECUTOR_PORT"]))
    return {"gateway->scheduler": to_scheduler, "scheduler->executor": to_executor}


def _metric(stack: Any, name: str) -> float:
    port = stack.service("executor")["env"]["ANVIL_METRICS_PORT"]
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def _http_binary(http: httpx.Client, x: np.ndarray) -> np.ndarray:
    """KServe v2 binary tensor extension: JSON header, then the raw input bytes."""
    doc = {
        "inputs": [
            {
                "name": "INPUT0",
                "datatype": "FP32",
                "shape": list(x.shape),
                "parameters": {"binary_data_size": x.nbytes},
            }
        ],
        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
    }
    head = json.dumps(doc).encode()
    r = http.post(
        "/v2/models/identity/infer",
        content=head + x.tobytes(),
        headers={
            "Inference-Header-Content-Length": str(len(head)),
            "content-type": "application/octet-stream",
        },
    )
    assert r.status_code == 200, r.text[:300]
    n = int(r.headers["Inference-Header-Content-Length"])
    return np.frombuffer(r.content[n:], np.float32).reshape(x.shape)


def test_one_mebibyte_inputs_reach_the_executor_without_crossing_a_socket(tcp_stack: Any) -> None:
    """Payloads stay in the client's memory until the executor reads them, with one pread copy each
    (a mapped read would let a client that shrinks its region SIGBUS the executor). On the stack
    whose links are tcp: the kernel counts a tcp socket's bytes, not an ipc one's."""
    stack = tcp_stack
    with httpx.Client(base_url=stack.url, timeout=10) as http:
        endpoint = _endpoint(stack)
        if shutil.which("ss") is None:
            pytest.skip("`ss` (iproute2) is needed to read the kernel's per-socket byte counters")
        x = np.random.default_rng(1).standard_normal((1, ROWS)).astype(np.float32)
        n = 8
        counters = ("inputs", "input_bytes", "bytes_copied")
        with ZeroCopyClient(endpoint, slots=2, slot_bytes=2 * MiB) as zc:
            for _ in range(3):  # warm: the executor maps the region, caches fill
                assert np.array_equal(zc.infer("identity", {"INPUT0": x})["OUTPUT0"], x)
            before = {k: _metric(stack, f"anvil_executor_shm_{k}_total") for k in counters}
            wire0 = _wire(stack)
            for i in range(n):
                xi = x + i
                assert np.array_equal(zc.infer("identity", {"INPUT0": xi})["OUTPUT0"], xi)
            zc_wire = {k: v - wire0[k] for k, v in _wire(stack).items()}
            after = {k: _metric(stack, f"anvil_executor_shm_{k}_total") for k in counters}
        assert after["inputs"] - before["inputs"] == n
        assert after["input_bytes"] - before["input_bytes"] == n * MiB
        assert after["bytes_copied"] - before["bytes_copied"] == n * MiB  # exactly one copy, in the executor

        wire0 = _wire(stack)
        for _ in range(n):
            assert np.array_equal(_http_binary(http, x), x)
        http_wire = {k: v - wire0[k] for k, v in _wire(stack).items()}

        print(f"\nrequest-direction bytes for {n} x 1 MiB: ZeroCopy {zc_wire}, HTTP binary {http_wire}")
        for link in ("gateway->scheduler", "scheduler->executor"):
            assert http_wire[link] >= n * MiB  # the control: payloads are visible to this measure
            assert zc_wire[link] < n * 4096  # ZeroCopy: envelopes only


def test_async_client_keeps_many_requests_in_flight(stack: Any) -> None:
    endpoint = _endpoint(stack)
    xs = [np.random.default_rng(i).standard_normal((1 + i % 4, 16)).astype(np.float32) for i in range(64)]

    # Priority 3 (a 2 s budget): under test are the in-flight window and the answers. At priority 1
    # (50 ms) one CI run saw a request shed as hopeless while the 2-core machine ran the suite. A
    # priority-3 request the gateway sheds while overloaded (OVERLOAD "shed: ...") is sent again
    # after the second it advises, as a client would (conftest.is_shed: the HTTP twin).
    async def one(zc: AsyncZeroCopyClient, x: np.ndarray) -> dict[str, np.ndarray]:
        for _ in range(4):
            try:
                return await zc.infer("mlp", {"INPUT0": x}, priority=3)
            except ZeroCopyError as exc:
                if exc.status != Status.OVERLOAD or "shed:" not in str(exc):
                    raise
            await asyncio.sleep(1.0)
        return await zc.infer("mlp", {"INPUT0": x}, priority=3)

    async def main() -> list[dict[str, np.ndarray]]:
        async with await AsyncZeroCopyClient.connect(endpoint, slots=8, slot_bytes=64 << 10) as zc:
            return await asyncio.gather(*(one(zc, x) for x in xs))

    for x, out in zip(xs, asyncio.run(main()), strict=True):
        np.testing.assert_allclose(out["OUTPUT0"], mlp_reference(x), rtol=1e-5, atol=1e-6)


def test_bad_requests_are_answered_with_the_constraint(stack: Any, http: httpx.Client) -> None:
    endpoint = _endpoint(stack)
    with ZeroCopyClient(endpoint, slots=1, slot_bytes=64 << 10) as zc:
        cases = [
            ("mlp", np.ones((1, 3), np.float32), Status.BAD_REQUEST, "does not match"),
            ("mlp", np.ones((1, 16), np.int32), Status.BAD_REQUEST, "datatype INT32 given"),
            ("nope", np.ones((1, 16), np.float32), Status.NOT_FOUND, "unknown model 'nope'"),
        ]
        for model, x, status, says in cases:
            with pytest.raises(ZeroCopyError) as info:
                zc.infer(model, {"INPUT0": x})
            assert info.value.status == status and says in info.value.message
        with pytest.raises(ZeroCopyError) as info:
            zc.infer("identity", {"INPUT0": np.ones((1, 20_000), np.float32)})  # 80 KB > the slot
        assert info.value.status == Status.BAD_LENGTH
        assert zc.ping() < 1.0
        x = np.ones((2, 16), np.float32)
        np.testing.assert_allclose(zc.infer("mlp", {"INPUT0": x})["OUTPUT0"], mlp_reference(x), rtol=1e-5)
    assert http.get("/v2/health/ready").status_code == 200


def test_latency_of_one_mebibyte_identity(stack: Any, http: httpx.Client) -> None:
    """Not a benchmark (bench/ has those): a printed comparison, and ZeroCopy must beat JSON."""
    endpoint = _endpoint(stack)
    x = np.random.default_rng(2).standard_normal((1, ROWS)).astype(np.float32)

    def p50(fn: Any, n: int) -> float:
        fn()
        ts = []
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        return float(np.median(ts) * 1e3)

    body = {
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, ROWS], "data": x.ravel().tolist()}]
    }
    with ZeroCopyClient(endpoint, slots=1, slot_bytes=2 * MiB) as zc:
        zc_ms = p50(lambda: zc.infer("identity", {"INPUT0": x}), 50)
    bin_ms = p50(lambda: _http_binary(http, x), 50)
    json_ms = p50(lambda: http.post("/v2/models/identity/infer", json=body).raise_for_status(), 5)
    print(
        f"\n1 MiB identity p50 (ms): ZeroCopy {zc_ms:.2f}, HTTP binary {bin_ms:.2f}, HTTP JSON {json_ms:.2f}"
    )
    assert zc_ms < json_ms


def test_executor_resolver_checks_the_registry_and_every_span(redis_url: str) -> None:
    """ShmInputs on its own (no stack): registry gate, bounds, zero-copy views, unmapping."""
    from anvil_core import codec
    from anvil_core.keys import shm_key
    from anvil_core.tensors import TensorError
    from anvil_core.zerocopy import Region
    from anvil_executor.shm_inputs import ShmInputs

    def tensor(key: str, offset: int, length: int, shape: tuple[int, ...], dt: str = "FP32") -> Any:
        span = codec.ShmSpan(key, offset, length)
        raw = codec.build_request(
            request_id="r", trace_id="t", model="m", version="1", priority=2, deadline_unix_ns=1,
            tenant="default", shm_inputs=[("INPUT0", dt, shape, span)],
        )  # fmt: skip
        return codec.read_request(raw).inputs[0]

    client = redis.Redis.from_url(redis_url, decode_responses=True)
    inputs = ShmInputs(redis_url, recheck_s=0.05)
    with Region.create(4096, 2) as region:
        base = region.slot_offset(1) + 64
        region.set(base, np.arange(8, dtype=np.float32))
        with pytest.raises(TensorError, match="not registered"):
            inputs.resolve(tensor("zc-test-1", base, 32, (1, 8)))
        record = {"name": region.name, "bytes": region.size, "slot_bytes": 4096, "slot_count": 2}
        client.hset(shm_key("zc-test-1"), mapping=cast(Any, record))
        got = inputs.resolve(tensor("zc-test-1", base, 32, (1, 8)))
        assert np.array_equal(got.data, np.arange(8, dtype=np.float32).reshape(1, 8))
        assert not inputs.mapped["zc-test-1"].contains(got.data)  # a copy (pread), not a view
        region.set(base, np.array([42.0], np.float32))
        assert (
            got.data[0, 0] == 0.0 and inputs.resolve(tensor("zc-test-1", base, 32, (1, 8))).data[0, 0] == 42.0
        )
        for offset, length, shape, says in [
            (region.slot_offset(1), 32, (1, 8), "leaves the payload"),  # the slot header
            (region.slot_offset(1) + 4090, 32, (1, 8), "leaves the payload"),  # into the next slot
            (region.size + 64, 32, (1, 8), "outside the region"),
            (base, 32, (1, 9), "needs 36"),
        ]:
            with pytest.raises(TensorError, match=says):
                inputs.resolve(tensor("zc-test-1", offset, length, shape))
        # The client shrinks its object under the executor: that request fails, nothing faults.
        fd = os.open(f"/dev/shm/{region.name}", os.O_RDWR)
        try:
            os.ftruncate(fd, region.slot_offset(1))
            with pytest.raises(TensorError, match="shrank"):
                inputs.resolve(tensor("zc-test-1", base, 32, (1, 8)))
            os.ftruncate(fd, region.size)  # grown back: served again
            assert inputs.resolve(tensor("zc-test-1", base, 32, (1, 8))).data.shape == (1, 8)
        finally:
            os.close(fd)
        client.delete(shm_key("zc-test-1"))
        deadline = time.monotonic() + 2
        while "zc-test-1" in inputs.mapped and time.monotonic() < deadline:
            time.sleep(0.02)
        assert "zc-test-1" not in inputs.mapped  # unregistered: unmapped by the sweeper
        assert got.data[0, 0] == 0.0  # an array handed out earlier is the executor's own copy
        with pytest.raises(TensorError, match="not registered"):
            inputs.resolve(tensor("zc-test-1", base, 32, (1, 8)))
    inputs.close()
    client.close()


def _bench(stack: Any, tmp_path: Any, *extra: str) -> subprocess.CompletedProcess[str]:
    argv = ["anvil_client.cli", "bench", "--protocol", "zerocopy", "--model", "identity", "--width", "256"]
    argv += ["--quiet", "--out", str(tmp_path), "--name", "zc", "--seed", "3", *extra]
    return subprocess.run(
        [sys.executable, "-m", *argv],
        env=getattr(stack, "env", None),  # a local stack's environment; containers: this process's
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_anvil_bench_drives_the_stack_over_zerocopy(stack: Any, tmp_path: Any) -> None:
    """`anvil bench --protocol zerocopy` finds the endpoint the gateway registered and every request
    it sends is answered over ZeroCopy (open loop, then closed loop)."""
    _endpoint(stack)  # skips where ZeroCopy cannot run (not a local stack)
    for mode in (["--rate", "60", "--duration", "2"], ["--concurrency", "4", "--duration", "1.5"]):
        run = _bench(stack, tmp_path, *mode)
        assert run.returncode == 0, run.stdout + run.stderr
        summary = json.loads((tmp_path / "zc.json").read_text())["summary"]
        assert summary["protocol"] == "zerocopy" and summary["zerocopy_endpoint"] == _endpoint(stack)
        assert summary["sent"] > 0 and summary["ok"] == summary["sent"], summary
        assert not summary["errors"]


def test_anvil_bench_zerocopy_refuses_a_dead_endpoint_clearly(stack: Any, tmp_path: Any) -> None:
    dead = f"ipc://{tmp_path}/nobody.ipc"
    run = _bench(stack, tmp_path, "--zerocopy-endpoint", dead, "--duration", "1", "--request-timeout", "1")
    assert run.returncode == 2
    assert "no gateway answered" in run.stderr and "Traceback" not in run.stderr
