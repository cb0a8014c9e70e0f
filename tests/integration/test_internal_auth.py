"""Issue #18 on the real stack (`anvil up`, auth on by default): a ZeroMQ peer without the stack's
keys gets nothing from the scheduler's ports and cannot register as an executor; Redis refuses a
client without the password; the password shows in no log, no `anvil status` output, no error."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import redis
import zmq
from redis.backoff import NoBackoff
from redis.retry import Retry

from anvil_core import codec, keys
from anvil_core.codec import pb
from anvil_core.curve import CurveClient
from anvil_core.tensors import HostTensor
from anvil_core.zmq_sockets import make_socket

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def local(stack: Any) -> Any:
    if not hasattr(stack, "service"):
        pytest.skip("drives the local stack's ports and files")
    return stack


@pytest.fixture
def ctx() -> Iterator[zmq.Context[zmq.Socket[bytes]]]:
    c: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    yield c
    c.destroy(linger=0)


def _impostors(stack: Any, role: str) -> dict[str, CurveClient | None]:
    """Peers that lack `role`'s keys: no CURVE, an unknown key, the other role's key, and the right
    client key aimed at a server key that is not the scheduler's."""
    trusted = stack.curve(role)
    other = stack.curve("executor" if role == "gateway" else "gateway")
    stranger_pub, stranger_sec = zmq.curve_keypair()
    return {
        "no key": None,
        "unknown key": CurveClient(stranger_sec, trusted.server_key),
        "other role's key": other,
        "wrong server key": CurveClient(trusted.secret_key, stranger_pub),
    }


def _refused(stack: Any, link: str) -> float:
    port = stack.service("scheduler")["env"]["ANVIL_METRICS_PORT"]
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    pattern = rf'^anvil_zmq_refused_total\{{[^}}]*link="{link}"[^}}]*\}} (\S+)$'
    return sum(float(v) for v in re.findall(pattern, text, re.M))


def _request(rid: str) -> list[Any]:
    frames: list[Any] = []
    x = HostTensor.from_array("INPUT0", "FP32", np.arange(4, dtype=np.float32).reshape(1, 4))
    env = codec.build_request(
        request_id=rid, trace_id=rid, model="identity", version="1", priority=3,
        deadline_unix_ns=time.time_ns() + 10**10, tenant="", inputs=codec.tensor_frames([x], frames),
    )  # fmt: skip
    return [env, *frames]


def _connect(ctx: Any, stack: Any, port_env: str, curve: CurveClient | None, ident: str) -> zmq.Socket[bytes]:
    port = stack.service("scheduler")["env"][port_env]
    return make_socket(ctx, zmq.DEALER, identity=ident, connect=f"tcp://127.0.0.1:{port}", curve=curve)  # type: ignore[no-any-return]


def test_impostors_get_nothing_from_the_schedulers_gateway_port(
    local: Any, ctx: Any, waiter: Callable[..., float]
) -> None:
    before = _refused(local, "gateway")
    rogues = {
        name: _connect(ctx, local, "ANVIL_GATEWAY_PORT", curve, f"rogue-gw-{i}")
        for i, (name, curve) in enumerate(_impostors(local, "gateway").items())
    }
    for name, sock in rogues.items():
        sock.send_multipart(_request(f"rogue-{name}"))  # queued: it would leave on a handshake
    waiter(lambda: _refused(local, "gateway") >= before + len(rogues), 15, "every impostor refused")
    # the same request from a peer with the gateway key is answered...
    trusted = _connect(ctx, local, "ANVIL_GATEWAY_PORT", local.curve("gateway"), "trusted-gw")
    trusted.send_multipart(_request("trusted"))
    assert trusted.poll(10_000), "the trusted peer got no answer"
    resp, _group = codec.unbundle(trusted.recv_multipart())[0]
    assert resp.requestId == "trusted" and resp.error is None
    # ...while no impostor's request ever reached the scheduler, so none is answered
    assert {name: sock.poll(0) for name, sock in rogues.items()} == dict.fromkeys(rogues, 0)


def test_impostors_cannot_register_as_executors(local: Any, ctx: Any, waiter: Callable[..., float]) -> None:
    r = local.redis(decode_responses=True)
    scheduler = next(iter(r.scan_iter(keys.svc_pattern("scheduler"))))
    executors = int(r.hget(scheduler, "executors") or 0)
    before = _refused(local, "executor")
    rogues = []
    for i, curve in enumerate(_impostors(local, "executor").values()):
        sock = _connect(ctx, local, "ANVIL_EXECUTOR_PORT", curve, f"rogue-ex-{i}")
        reg = pb.RegisterT()
        reg.kind, reg.serviceId, reg.device, reg.maxBatch, reg.credits = (
            pb.ServiceKind.EXECUTOR, f"rogue-ex-{i}", "cpu", 64, 64,
        )  # fmt: skip
        spec = pb.ModelSpecT()
        spec.name, spec.version, spec.maxBatch = "identity", "1", 64
        reg.models = [spec]
        sock.send_multipart(codec.pack(reg))
        rogues.append(sock)
    waiter(lambda: _refused(local, "executor") >= before + len(rogues), 15, "every impostor refused")
    # requests keep being served, by the real executors only; no rogue receives a batch
    with httpx.Client(base_url=local.url, timeout=10) as http:
        body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}
        for _ in range(10):
            assert http.post("/v2/models/identity/infer", json=body).status_code == 200
    assert int(r.hget(scheduler, "executors") or 0) == executors
    assert [sock.poll(0) for sock in rogues] == [0] * len(rogues)


def test_redis_refuses_clients_without_the_password(local: Any) -> None:
    assert local.redis().ping()
    for password in (None, "not-the-password"):
        # no retries: an AuthenticationError is a ConnectionError, which redis-py retries with backoff
        client = redis.Redis(
            port=local.redis_port, password=password, socket_timeout=5, retry=Retry(NoBackoff(), 0)
        )
        with pytest.raises(redis.AuthenticationError):
            client.ping()
        with pytest.raises(redis.AuthenticationError):
            client.hgetall("anvil:qos:limits")
        client.close()


def test_the_scheduler_listens_on_loopback_and_a_private_ipc_dir_only(local: Any) -> None:
    env = local.service("scheduler")["env"]
    links = Path(env["ANVIL_LINK_IPC_DIR"])  # where the gateway and the executors connect
    assert links.stat().st_mode & 0o777 == 0o700
    assert sorted(p.name for p in links.iterdir()) == ["executor.sock", "gateway.sock"]
    ports = {int(env["ANVIL_GATEWAY_PORT"]), int(env["ANVIL_EXECUTOR_PORT"])}
    listening = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local_addr, state = line.split()[1], line.split()[3]
            addr, port = local_addr.rsplit(":", 1)
            if state == "0A" and int(port, 16) in ports:  # 0A: LISTEN
                listening[int(port, 16)] = addr
    assert listening == dict.fromkeys(ports, "0100007F")  # 127.0.0.1, little-endian hex


def test_the_links_over_tcp_with_curve_serve_end_to_end(tcp_stack: Any) -> None:
    """The compose (and multi-host) path: no ipc, every link tcp with CURVE."""
    tcp = tcp_stack
    assert tcp.service("gateway")["env"]["ANVIL_LINK_IPC_DIR"] == ""
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}
    r = httpx.post(f"{tcp.url}/v2/models/identity/infer", json=body, timeout=10)
    assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [1, 2, 3, 4]
    assert _refused(tcp, "gateway") == 0 and _refused(tcp, "executor") == 0  # nobody refused


def test_secrets_are_private_and_the_password_is_shown_nowhere(local: Any) -> None:
    password = local.redis_password
    assert password and len(password) >= 32
    secrets_dir = local.secrets_dir
    assert secrets_dir.stat().st_mode & 0o777 == 0o700
    names = ("redis_password", "scheduler.key_secret", "gateway.key_secret", "executor.key_secret")
    assert {p.name: p.stat().st_mode & 0o777 for p in secrets_dir.iterdir()} == dict.fromkeys(names, 0o600)
    run_dir = Path(local.state["run_dir"])
    assert (run_dir / "redis.acl").stat().st_mode & 0o777 == 0o600  # the password's SHA-256
    state_file = Path(local.env["ANVIL_RUN_ROOT"]) / "current.json"
    assert password not in state_file.read_text()
    cli = [sys.executable, "-m", "anvil_client.cli", "status"]
    ok = subprocess.run(cli, env=local.env, cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert ok.returncode == 0 and "scheduler" in ok.stdout, ok.stderr
    wrong = "wrong-" + os.urandom(8).hex()
    bad_env = dict(local.env, ANVIL_REDIS_PASSWORD=wrong)
    bad = subprocess.run(cli, env=bad_env, cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert bad.returncode == 1 and "registry unreachable" in bad.stderr
    for text in (ok.stdout, ok.stderr, bad.stdout, bad.stderr, "".join(local.output)):
        assert password not in text and wrong not in text
    for log in run_dir.glob("*.log"):
        assert password not in log.read_text(errors="replace"), log.name
