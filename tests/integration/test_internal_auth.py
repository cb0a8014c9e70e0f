"""Issue #18 on the real stack (`anvil up`, auth on by default): a ZeroMQ peer without the stack's
keys gets nothing from the scheduler's ports and cannot register as an executor; Redis refuses a
client without a password, and each service's Redis user can do only what that service needs; the
compiler API refuses a request without its key; no secret shows in a log, `anvil status` output or
error."""

from __future__ import annotations

import json
import os
import re
import stat
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

from anvil_core import codec, keys, redis_acl
from anvil_core.codec import pb
from anvil_core.curve import CurveClient
from anvil_core.redis_conn import RedisAuth, load_redis_auth, sync_redis
from anvil_core.settings import COMPILER_API_KEY_FILE
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
    names = sorted(p.name for p in links.iterdir())
    answers = [n for n in names if n.startswith("answers-gw-")]  # each gateway's answer socket
    assert len(answers) >= 1, names  # (direct answers, docs/scheduler.md)
    direct = [n for n in names if n.startswith("direct-")]  # each executor's direct socket
    assert len(direct) >= 1, names  # (direct requests, docs/scheduler.md)
    assert sorted(set(names) - set(answers) - set(direct)) == [
        "executor.sock",
        "executor.usock",
        "gateway.sock",
        "gateway.usock",
    ]
    for name in ("executor.usock", "gateway.usock", *answers, *direct):  # Unix stream links: 0600 sockets
        assert stat.S_ISSOCK((links / name).stat().st_mode)
        assert (links / name).stat().st_mode & 0o777 == 0o600
    # ANVIL_LINK_TRANSPORT=unix (the default): the gateway and the executor use them, not ZeroMQ
    port = env["ANVIL_METRICS_PORT"]
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    peers = dict(re.findall(r'^anvil_scheduler_unix_link_peers\{link="(\w+)"\} (\S+)$', text, re.M))
    assert float(peers["gateway"]) >= 1 and float(peers["executor"]) >= 1, peers
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
    names = ["scheduler.key_secret", "gateway.key_secret", "executor.key_secret", COMPILER_API_KEY_FILE]
    names += [redis_acl.password_file(role) for role in redis_acl.ROLES]
    assert {p.name: p.stat().st_mode & 0o777 for p in secrets_dir.iterdir()} == dict.fromkeys(names, 0o600)
    run_dir = Path(local.state["run_dir"])
    assert (run_dir / "redis.acl").stat().st_mode & 0o777 == 0o600  # the passwords' SHA-256
    secrets = [(secrets_dir / name).read_text().strip() for name in names if not name.endswith("key_secret")]
    assert password in secrets and len(set(secrets)) == len(secrets)
    state_file = Path(local.env["ANVIL_RUN_ROOT"]) / "current.json"
    assert not any(secret in state_file.read_text() for secret in secrets)
    assert not any(secret in (run_dir / "redis.acl").read_text() for secret in secrets)
    cli = [sys.executable, "-m", "anvil_client.cli", "status"]
    ok = subprocess.run(cli, env=local.env, cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert ok.returncode == 0 and "scheduler" in ok.stdout, ok.stderr
    wrong = "wrong-" + os.urandom(8).hex()
    bad_env = dict(local.env, ANVIL_REDIS_PASSWORD=wrong)
    bad = subprocess.run(cli, env=bad_env, cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert bad.returncode == 1 and "registry unreachable" in bad.stderr
    for text in (ok.stdout, ok.stderr, bad.stdout, bad.stderr, "".join(local.output)):
        assert wrong not in text and not any(secret in text for secret in secrets)
    for log in run_dir.glob("*.log"):
        text = log.read_text(errors="replace")
        assert not any(secret in text for secret in secrets), log.name
        assert "NOPERM" not in text and "No permissions" not in text, f"{log.name}: a Redis command refused"


def _as(local: Any, role: str) -> redis.Redis:
    """A client of the stack's Redis as `role`'s user (its password from the secrets dir)."""
    auth = load_redis_auth(secrets_dir=local.secrets_dir, role=role)
    assert auth.username == redis_acl.user_of(role) or role == redis_acl.ADMIN
    return sync_redis(local.state["redis_url"], auth, socket_timeout=5, decode_responses=True)


# (role, what it must not do): writes outside its keys, reads of others' secrets, server administration
FORBIDDEN: list[tuple[str, str, tuple[Any, ...]]] = [
    ("gateway", "add an API key", ("HSET", keys.tenants_key(), "f" * 64, "mallory")),
    ("gateway", "deploy a version", ("HSET", keys.model_versions_key("identity"), "9", "{}")),
    ("gateway", "lift a rate limit", ("HDEL", keys.qos_limits_key(), "*:3")),
    ("gateway", "rewrite the SLO readings", ("HSET", keys.slo_key(), "1", "{}")),
    (
        "gateway",
        "impersonate the scheduler",
        ("HSET", keys.svc_key("scheduler", "x"), "endpoint", "tcp://evil"),
    ),
    (
        "gateway",
        "point a model at another artifact",
        ("HSET", keys.model_key("identity"), "artifact", "evil"),
    ),
    ("gateway", "advertise a model as an executor", ("HSET", keys.served_key("x"), "identity", "{}")),
    ("gateway", "flush Redis", ("FLUSHALL",)),
    ("gateway", "reconfigure Redis", ("CONFIG", "SET", "dir", "/tmp")),
    ("executor", "add an API key", ("HSET", keys.tenants_key(), "f" * 64, "mallory")),
    ("executor", "read the API keys", ("HGETALL", keys.tenants_key())),
    ("executor", "deploy a version", ("HSET", keys.model_versions_key("identity"), "9", "{}")),
    ("executor", "announce a ZeroCopy region", ("HSET", keys.shm_key("zc-x-1"), "name", "/etc")),
    (
        "executor",
        "point a model at another artifact",
        ("HSET", keys.model_key("identity"), "artifact", "evil"),
    ),
    ("executor", "unload a model", ("HSET", keys.model_unloaded_key("identity"), "reason", "x")),
    ("scheduler", "add an API key", ("HSET", keys.tenants_key(), "f" * 64, "mallory")),
    ("scheduler", "publish a model", ("HSET", keys.model_key("identity"), "status", "READY")),
    ("scheduler", "lift a rate limit", ("HDEL", keys.qos_limits_key(), "*:3")),
    ("compiler", "add an API key", ("HSET", keys.tenants_key(), "f" * 64, "mallory")),
    ("compiler", "publish a model", ("HSET", keys.model_key("identity"), "status", "READY")),
    ("qos", "add an API key", ("HSET", keys.tenants_key(), "f" * 64, "mallory")),
    ("qos", "set its own base rates", ("HSET", keys.qos_base_key(), "*:3", "{}")),
    ("qos", "publish a model", ("HSET", keys.model_key("identity"), "status", "READY")),
    ("admin", "flush Redis", ("FLUSHALL",)),
    ("admin", "read the ACL", ("ACL", "LIST")),
    ("admin", "write outside Anvil's keys", ("SET", "not-anvil", "1")),
]


def test_each_services_redis_user_cannot_do_what_it_must_not(local: Any) -> None:
    """One Redis user per service (anvil_core.redis_acl): a compromised or confused service cannot
    add API keys, deploy, lift limits or administer the server. Everything is refused by Redis
    itself (NOPERM), and nothing changed."""
    admin = _as(local, redis_acl.ADMIN)
    before = {k: admin.hgetall(k) for k in (keys.tenants_key(), keys.qos_limits_key(), keys.qos_base_key())}
    done = []
    for role, what, command in FORBIDDEN:
        client = _as(local, role)
        try:
            client.execute_command(*command)
            done.append(f"{role} could {what}")
        except redis.exceptions.NoPermissionError:
            pass
        finally:
            client.close()
    assert done == []
    assert {k: admin.hgetall(k) for k in before} == before
    assert admin.hlen(keys.model_versions_key("identity")) == 0 and not admin.exists(keys.shm_key("zc-x-1"))
    assert not admin.exists(
        keys.model_key("identity"), keys.model_unloaded_key("identity"), keys.served_key("x")
    )


def test_each_services_redis_user_can_do_what_its_service_needs(local: Any) -> None:
    """The other half: the reads and writes each service makes are allowed (the whole integration
    suite runs the services on these users; this names them)."""
    admin = _as(local, redis_acl.ADMIN)
    users = {
        admin.hget(k, "kind"): admin.hget(k, "redis_user") for k in admin.scan_iter(keys.svc_pattern("*"))
    }
    assert users == {role: role for role in redis_acl.SERVICE_ROLES}  # each service as its own user
    gateway, executor, qos = _as(local, "gateway"), _as(local, "executor"), _as(local, "qos")
    assert isinstance(gateway.hgetall(keys.tenants_key()), dict)  # API keys, read
    advertised = [gateway.hgetall(k) for k in gateway.scan_iter(keys.served_key("*"))]  # executors'
    assert any("identity" in a for a in advertised)
    assert next(iter(gateway.scan_iter(keys.svc_pattern("scheduler"))))
    gateway.hset(keys.shm_key("zc-acl-test"), "name", "x")  # ZeroCopy regions
    assert executor.hgetall(keys.shm_key("zc-acl-test")) == {"name": "x"}
    gateway.delete(keys.shm_key("zc-acl-test"))
    assert isinstance(qos.hgetall(keys.slo_key()), dict)
    assert RedisAuth(None, local.redis_password) == load_redis_auth(secrets_dir=local.secrets_dir)


def test_the_compiler_api_refuses_requests_without_the_runs_key(local: Any) -> None:
    """On by default under `anvil up`: a key per run in the secrets dir, read by the compiler (and
    by `anvil deploy`: test_user_journey deploys with no key given)."""
    env = local.service("compiler")["env"]
    url = f"http://127.0.0.1:{env['ANVIL_HTTP_PORT']}"
    key = (local.secrets_dir / COMPILER_API_KEY_FILE).read_text().strip()
    with httpx.Client(base_url=url, timeout=10) as http:
        assert http.get("/v1/health").status_code == 200  # liveness stays open
        assert http.get("/v1/jobs/nope").status_code == 401
        assert http.get("/v1/jobs/nope", headers={"authorization": "Bearer wrong"}).status_code == 401
        files = {"file": ("m.onnx", b"not a model")}
        assert http.post("/v1/compile", files=files, data={"name": "m", "format": "onnx"}).status_code == 401
        assert http.get("/v1/jobs/nope", headers={"authorization": f"Bearer {key}"}).status_code == 404


def test_anvil_bench_drives_the_stack_over_http_with_auth_on(local: Any, tmp_path: Path) -> None:
    """`anvil bench` as a user types it (no URL, key or password given): it finds the running
    stack from its state file and every request is answered, with every internal link, Redis user
    and the compiler key in force."""
    argv = [sys.executable, "-m", "anvil_client.cli", "bench", "--model", "identity", "--width", "64"]
    argv += ["--rate", "50", "--duration", "2", "--quiet", "--out", str(tmp_path), "--name", "auth"]
    run = subprocess.run(argv, env=local.env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    summary = json.loads((tmp_path / "auth.json").read_text())["summary"]
    # every request answered; on a loaded 2-core CI machine a few may miss the 200 ms class's
    # deadline (504) or be shed (429), but none is refused for want of a credential
    assert summary["sent"] > 0 and summary["ok"] >= 0.9 * summary["sent"], summary
    assert all(reason.startswith(("429", "504")) for reason in summary["errors"]), summary["errors"]
