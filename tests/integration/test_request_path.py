"""One request, for real: HTTP -> gateway -> scheduler -> executor -> back, and bad input."""

from __future__ import annotations

import time
import uuid
from typing import Any

import httpx
import numpy as np
import pytest
import zmq

from anvil_core import codec
from anvil_core.tensors import HostTensor
from anvil_core.zmq_sockets import make_socket
from anvil_executor.models.builtin import mlp_reference

pytestmark = pytest.mark.integration


def _mlp_body(x: np.ndarray, **params: object) -> dict[str, object]:
    doc: dict[str, object] = {
        "id": "req-1",
        "inputs": [
            {"name": "INPUT0", "datatype": "FP32", "shape": list(x.shape), "data": x.reshape(-1).tolist()}
        ],
    }
    if params:
        doc["parameters"] = params
    return doc


def test_health_and_metadata(http: httpx.Client) -> None:
    assert http.get("/v2/health/live").status_code == 200
    assert http.get("/v2/health/ready").status_code == 200
    meta = http.get("/v2/models/mlp").json()
    assert meta["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 16]}]
    assert http.get("/v2/models/mlp/ready").status_code == 200
    assert http.get("/v2/models/mlp/versions/1").status_code == 200


def test_mlp_returns_the_numpy_result(http: httpx.Client) -> None:
    x = np.random.default_rng(7).standard_normal((3, 16)).astype(np.float32)
    r = http.post("/v2/models/mlp/infer", json=_mlp_body(x, priority=3))
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["id"] == "req-1" and doc["model_name"] == "mlp"
    out = doc["outputs"][0]
    assert out["shape"] == [3, 4] and out["datatype"] == "FP32"
    np.testing.assert_allclose(
        np.array(out["data"], np.float32).reshape(3, 4), mlp_reference(x), rtol=1e-5, atol=1e-6
    )
    assert len(r.headers["x-anvil-trace-id"]) >= 16


def test_identity_round_trips_many_concurrent_requests(
    http: httpx.Client, stack: object, through_shedding: Any
) -> None:
    import concurrent.futures as cf

    def one(i: int) -> bool:
        data = [float(i), float(i) + 0.5]
        body = {
            "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2], "data": data}],
            "parameters": {"priority": 3},
        }
        r = through_shedding.call(lambda: http.post("/v2/models/identity/infer", json=body))
        ok = r.status_code == 200 and r.json()["outputs"][0]["data"] == data
        assert ok, (r.status_code, r.text)
        return ok

    with cf.ThreadPoolExecutor(16) as pool:
        assert all(pool.map(one, range(200)))


@pytest.mark.parametrize(
    ("path", "body", "status", "says"),
    [
        ("/v2/models/mlp/infer", b"{not json", 400, "not valid JSON"),
        ("/v2/models/nope/infer", b"{}", 404, "unknown model 'nope'"),
        ("/v2/models/mlp/versions/7/infer", b"{}", 404, "no version '7'"),
        (
            "/v2/models/mlp/infer",
            b'{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1,3],"data":[1,2,3]}]}',
            400,
            "does not match",
        ),
        (
            "/v2/models/mlp/infer",
            b'{"inputs":[{"name":"INPUT0","datatype":"INT32","shape":[1,16],"data":[' + b"1," * 15 + b"1]}]}",
            400,
            "datatype INT32 given",
        ),
        (
            "/v2/models/mlp/infer",
            b'{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1,16],"data":[1]}]}',
            400,
            "1 values given",
        ),
        (
            "/v2/models/mlp/infer",
            b'{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1,16],"data":[' + b"1," * 15 + b"1]}],"
            b'"parameters":{"priority":9}}',
            400,
            "priority must be",
        ),
        ("/v2/nothing-here", b"", 404, "Not Found"),
    ],
)
def test_bad_input_is_a_clear_4xx_and_the_gateway_keeps_serving(
    http: httpx.Client, path: str, body: bytes, status: int, says: str
) -> None:
    r = http.post(path, content=body, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    assert says in r.json()["error"]
    assert http.get("/v2/health/ready").status_code == 200


def test_body_over_the_limit_is_413(http: httpx.Client) -> None:
    big = b"x" * (64 * 1024 * 1024 + 1)
    r = http.post("/v2/models/mlp/infer", content=big)
    assert r.status_code == 413
    assert "exceeds the limit" in r.json()["error"]


def test_every_service_serves_prometheus_metrics(stack: object) -> None:
    if not hasattr(stack, "service"):
        pytest.skip("metrics ports are per-process in local mode only")
    for name in ("gateway", "scheduler", "executor", "compiler", "qos"):
        port = stack.service(name)["env"]["ANVIL_METRICS_PORT"]  # type: ignore[attr-defined]
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        assert "anvil_service_up" in text, name


def test_scheduler_answers_each_request_of_a_bundle_and_skips_a_bad_one(stack: Any) -> None:
    """A gateway bundles the requests of one loop turn; a malformed one spoils none of the others."""
    if not hasattr(stack, "env"):
        pytest.skip("needs the local stack's scheduler port")
    ctx = zmq.Context()
    endpoint = f"tcp://127.0.0.1:{stack.env['ANVIL_SCHEDULER_GATEWAY_PORT']}"
    sock = make_socket(ctx, zmq.DEALER, connect=endpoint, curve=stack.curve("gateway"))
    try:
        xs = {f"bundle-{i}": np.full((1, 2), i, np.float32) for i in range(3)}
        groups: list[list[Any]] = [[b"\x00not an envelope"]]
        for rid, x in xs.items():
            frames: list[Any] = []
            inputs = codec.tensor_frames([HostTensor.from_array("INPUT0", "FP32", x)], frames)
            env = codec.build_request(
                request_id=rid, trace_id=rid, model="identity", version="1", priority=3,
                deadline_unix_ns=time.time_ns() + 10**10, tenant="", inputs=inputs,
            )  # fmt: skip
            groups.append([env, *frames])
        sock.send_multipart(codec.bundle(groups, responses=False))
        answers: dict[str, np.ndarray] = {}
        while len(answers) < len(xs):
            assert sock.poll(10_000), f"only {sorted(answers)} answered"
            for resp, group in codec.unbundle(sock.recv_multipart()):
                assert resp.error is None or resp.error.code == 0
                answers[resp.requestId] = codec.request_tensor(resp.outputs[0], group[1:]).data
        for rid, x in xs.items():
            np.testing.assert_array_equal(answers[rid], x)
    finally:
        sock.close()
        ctx.term()


def test_random_model_versions_add_no_metrics_series(stack: Any, http: httpx.Client) -> None:
    """A client's made-up versions are 404s, not new label values: memory stays bounded (issue #18)."""
    if not hasattr(stack, "service"):
        pytest.skip("metrics ports are per-process in local mode only")
    port = stack.service("gateway")["env"]["ANVIL_METRICS_PORT"]

    def lines() -> int:
        return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text.count("\n")

    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": [0.5] * 16}]}
    http.post("/v2/models/mlp/versions/no-such-version/infer", json=body)  # the _unknown series exists
    before = lines()
    for i in range(200):
        r = http.post(f"/v2/models/mlp/versions/{uuid.uuid4()}/infer", json=body)
        assert r.status_code == 404, (i, r.text)
    after = lines()
    assert after - before < 20, f"/metrics grew from {before} to {after} lines"


def _answers_by_path(stack: Any) -> dict[str, float]:
    port = stack.service("executor")["env"]["ANVIL_METRICS_PORT"]
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    out = {"direct": 0.0, "scheduler": 0.0}
    for line in text.splitlines():
        if line.startswith("anvil_executor_answers_total{"):
            path = line.split('path="', 1)[1].split('"', 1)[0]
            out[path] = float(line.rpartition(" ")[2])
    return out


def _identity_calls(url: str, n: int) -> list[str]:
    """n identity requests (each its own values) checked for their result; their hop headers."""
    hops = []
    with httpx.Client(base_url=url, timeout=10) as c:
        for i in range(n):
            x = [float(i), 1.0, 2.0, 3.0]
            body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": x}]}
            r = c.post("/v2/models/identity/infer", json=body)
            assert r.status_code == 200, r.text
            assert r.json()["outputs"][0]["data"] == x
            hops.append(r.headers["x-anvil-hops-us"])
    return hops


def test_answers_go_straight_to_the_gateway_and_through_the_scheduler_when_told(
    new_local_stack: Any,
) -> None:
    """Direct answers (docs/scheduler.md): on a local stack the executor writes every answer to the
    gateway's answer socket; with ANVIL_DIRECT_ANSWERS=0 every one goes through the scheduler. The
    caller sees the same results and the same per-hop header either way. (Direct requests off: with
    them, lone requests skip the scheduler altogether; the next test.)"""
    for direct in ("1", "0"):
        stack = new_local_stack(env={"ANVIL_DIRECT_ANSWERS": direct, "ANVIL_DIRECT_REQUESTS": "0"})
        before = _answers_by_path(stack)
        hops = _identity_calls(stack.url, 40)
        after = _answers_by_path(stack)
        sent = {path: after[path] - before[path] for path in after}
        if direct == "1":
            assert sent == {"direct": 40.0, "scheduler": 0.0}, sent
        else:
            assert sent == {"direct": 0.0, "scheduler": 0.0}, sent  # batches name no gateway
        assert all(",back=" in h for h in hops), hops[:3]  # stamped and split either way
        stack.stop()


def _samples(stack: Any, service: str, name: str) -> dict[str, float]:
    """A counter's samples on `service`'s metrics port, by their labels' text."""
    port = stack.service(service)["env"]["ANVIL_METRICS_PORT"]
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            out[line[len(name) + 1 : line.index("}")]] = float(line.rpartition(" ")[2])
    return out


def test_lone_requests_skip_the_scheduler_and_not_with_direct_requests_off(
    new_local_stack: Any, waiter: Any
) -> None:
    """Direct requests (docs/scheduler.md): one client calling one at a time, each request once the
    gateway has learnt the executor goes from the gateway to the executor's direct socket and back;
    the scheduler answers only those handed back; results and the per-hop header are as through
    the scheduler. With ANVIL_DIRECT_REQUESTS=0 every request goes through the scheduler."""

    def scheduled(stack: Any) -> float:
        return sum(_samples(stack, "scheduler", "anvil_scheduler_requests_total").values())

    for direct in ("1", "0"):
        stack = new_local_stack(env={"ANVIL_DIRECT_REQUESTS": direct})
        start = scheduled(stack)
        _identity_calls(stack.url, 10)  # the executor is learnt and connected meanwhile
        gw0 = _samples(stack, "gateway", "anvil_gateway_direct_requests_total")
        hops = _identity_calls(stack.url, 40)
        gw = _samples(stack, "gateway", "anvil_gateway_direct_requests_total")
        ex = _samples(stack, "executor", "anvil_executor_direct_requests_total")
        sent = gw.get('outcome="sent"', 0.0)
        back = gw.get('outcome="busy"', 0.0) + gw.get('outcome="lost"', 0.0)
        ran = ex.get('outcome="ran"', 0.0)
        if direct == "1":
            sent_now = sent - gw0.get('outcome="sent"', 0.0)
            handed_back = back - gw0.get('outcome="busy"', 0.0) - gw0.get('outcome="lost"', 0.0)
            if handed_back == 0:
                assert sent_now == 40, (gw0, gw)  # every lone one, once learnt
            else:
                # An executor that is not idle, or whose last compute of the model took longer than
                # its inline bound (a slow VM's jitter), hands a direct request back (BUSY); that
                # model's requests then go through the scheduler for the gateway's busy back-off
                # (50 ms): seen in a fresh-clone CI on a 2-vCPU AMD VM, 1 hand-back and 7 requests
                # through the scheduler. Most still go direct, and each is answered once (below).
                assert sent_now >= 20, (gw0, gw)
            assert ran == sent - back, (gw, ex)
        else:
            assert sent == ran == 0, (gw, ex)
        # the scheduler answers (and counts) everything that did not run directly; its count of a
        # directly answered batch arrives just after the answer: awaited
        want = start + 50 - ran
        waiter(lambda s=stack, n=want: scheduled(s) == n, 10, "the scheduler's count")
        assert all(",back=" in h for h in hops), hops[:3]
        stack.stop()
