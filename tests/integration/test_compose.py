"""The composed stack as containers: what `make test-compose` checks after `docker compose --profile
cpu up -d --wait` (ANVIL_STACK=docker, ANVIL_COMPOSE_PROJECT naming the project, its env file in
ANVIL_COMPOSE_ENV_FILE). The rest of tests/integration runs against the same containers where it
can (tritonclient HTTP/binary, the openai client, bad input, ...).

Clients on this host that share memory with the containers (tritonclient system shm, ZeroCopy) make
their regions as the services' uid, 10001: the gateway opens only regions its own uid owns (mode
0600). This process, when root, acts as that uid while it creates them; otherwise it must be it.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

pytestmark = pytest.mark.integration

SERVICE_UID = 10001
APP_SERVICES = ("gateway", "scheduler", "executor", "compiler")


def _shm_client(script: str, env: dict[str, str] | None = None, timeout_s: float = 120) -> str:
    """Run a Python client script on this host whose shared memory belongs to the services' uid;
    its stdout (fails with its output). The script creates its regions inside `with service_uid():`,
    which switches the effective uid/gid to 10001 for that while when this process is root (a
    client running as uid 10001 needs no switch); the interpreter may live where uid 10001 cannot
    read (e.g. under /root), so the process does not drop to it for good."""
    if os.geteuid() not in (0, SERVICE_UID):
        pytest.skip(f"the shm client must run as uid {SERVICE_UID} (or as root, to act as it)")
    prelude = textwrap.dedent(f"""
        import contextlib, os
        from multiprocessing import resource_tracker

        resource_tracker.ensure_running()  # a helper process: started now, as this process's user

        @contextlib.contextmanager
        def service_uid():
            if os.geteuid() != 0:
                yield
                return
            os.setegid({SERVICE_UID})
            os.seteuid({SERVICE_UID})
            try:
                yield
            finally:
                os.seteuid(0)
                os.setegid(0)
    """)
    proc = subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(script)],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    assert proc.returncode == 0, f"shm client failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def _metric(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def test_every_service_runs_healthy_and_serves_metrics(compose_stack: Any) -> None:
    stack = compose_stack
    for service in (*APP_SERVICES, "qos"):
        assert stack.state(service)["health"] == "healthy", (service, stack.state(service))
        assert "# TYPE" in stack.metrics(service), service


def test_services_run_as_their_user_and_qos_as_privileged_root(compose_stack: Any) -> None:
    stack = compose_stack
    for service in APP_SERVICES:
        code, out = stack.exec(service, ["id", "-u"])
        assert (code, out.strip()) == (0, str(SERVICE_UID)), service
    code, out = stack.exec("qos", ["id", "-u"])
    assert (code, out.strip()) == (0, "0")
    host = stack.container("qos").attrs["HostConfig"]
    assert host["Privileged"] is True and host["PidMode"] == "host"


def test_only_the_gateway_and_compiler_are_published(compose_stack: Any) -> None:
    stack = compose_stack
    for service in ("redis", "scheduler", "executor", "qos"):
        bindings = stack.container(service).attrs["HostConfig"].get("PortBindings") or {}
        assert not any(bindings.values()), (service, bindings)
    for service in ("gateway", "compiler"):
        assert stack.container(service).attrs["HostConfig"].get("PortBindings"), service


def test_each_service_has_its_secrets_0400_and_owned_by_its_user(compose_stack: Any) -> None:
    """compose.yaml's secrets as docs/security.md states them: /run/secrets/<name>, 0400, uid 10001,
    each service its own Redis user's password and CURVE key and nothing of the others'."""
    stack = compose_stack
    wanted = {
        "gateway": ["gateway.key_secret", "gateway.redis_password"],
        "scheduler": ["scheduler.key_secret", "scheduler.redis_password"],
        "executor": ["executor.key_secret", "executor.redis_password"],
        "compiler": ["compiler.redis_password", "compiler_api_key"],
    }
    for service, names in wanted.items():
        code, out = stack.exec(service, ["stat", "-c", "%n %a %u", *(f"/run/secrets/{n}" for n in names)])
        assert code == 0, (service, out)
        assert sorted(out.split("\n")[: len(names)]) == sorted(f"/run/secrets/{n} 400 10001" for n in names)
        code, out = stack.exec(service, ["ls", "/run/secrets"])
        assert code == 0 and sorted(out.split()) == sorted(names), (service, out)  # its own only


_REDIS_PROBE = """
import sys
import redis
url = "redis://redis:6379/0"
def attempt(what, **auth):
    try:
        redis.Redis.from_url(url, socket_timeout=5, **auth).ping()
        print(what, "open")
    except redis.exceptions.AuthenticationError as exc:
        print(what, "refused:", type(exc).__name__)
attempt("anonymous")
attempt("wrong", username="gateway", password="not-the-password")
password = open("/run/secrets/gateway.redis_password").read().strip()
own = redis.Redis.from_url(url, username="gateway", password=password)
print("own:", own.ping())
try:
    own.execute_command("FLUSHALL")
    print("flushall: allowed")
except redis.exceptions.NoPermissionError:
    print("flushall: refused")
"""


def test_redis_on_the_internal_network_wants_its_password(compose_stack: Any) -> None:
    """From inside the network (the gateway's container): no password or a wrong one, refused; the
    gateway's own user, PONG, but not the server's administration (FLUSHALL)."""
    stack = compose_stack
    code, out = stack.exec("gateway", ["python", "-c", _REDIS_PROBE])
    assert code == 0, out
    lines = out.splitlines()
    assert "anonymous refused: AuthenticationError" in lines, out
    assert "wrong refused: AuthenticationError" in lines, out
    assert "own: True" in lines and "flushall: refused" in lines, out


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_tritonclient_system_shm_from_the_host(compose_stack: Any, protocol: str) -> None:
    """tritonclient's system shm regions in the host's /dev/shm, read and written by the gateway
    container (ipc: host), over HTTP and over the published gRPC port; the client runs as the
    services' uid, so the regions are theirs."""
    stack = compose_stack
    url = stack.url.removeprefix("http://") if protocol == "http" else stack.grpc_target
    if url is None:
        pytest.fail("the project publishes no gRPC port (ANVIL_GRPC_PORT=0)")
    out = _shm_client(
        """
        import os, uuid
        import numpy as np
        import tritonclient.utils.shared_memory as shm
        from anvil_executor.models.builtin import mlp_reference

        if os.environ["PROTO"] == "http":
            import tritonclient.http as tc
            c = tc.InferenceServerClient(url=os.environ["URL"], connection_timeout=10, network_timeout=10)
        else:
            import tritonclient.grpc as tc
            c = tc.InferenceServerClient(url=os.environ["URL"])
        x = np.random.default_rng(4).standard_normal((4, 16)).astype(np.float32)
        tag = uuid.uuid4().hex[:8]
        with service_uid():  # the regions' owner: the gateway's uid
            h_in = shm.create_shared_memory_region(f"in-{tag}", f"/anvil-ct-in-{tag}", x.nbytes)
            h_out = shm.create_shared_memory_region(f"out-{tag}", f"/anvil-ct-out-{tag}", 64)
        assert os.stat(f"/dev/shm/anvil-ct-in-{tag}").st_uid == 10001
        try:
            shm.set_shared_memory_region(h_in, [x])
            c.register_system_shared_memory(f"in-{tag}", f"/anvil-ct-in-{tag}", x.nbytes)
            c.register_system_shared_memory(f"out-{tag}", f"/anvil-ct-out-{tag}", 64)
            inp = tc.InferInput("INPUT0", list(x.shape), "FP32")
            inp.set_shared_memory(f"in-{tag}", x.nbytes)
            out = tc.InferRequestedOutput("OUTPUT0")
            out.set_shared_memory(f"out-{tag}", 64)
            c.infer("mlp", [inp], outputs=[out], priority=3)
            got = shm.get_contents_as_numpy(h_out, np.float32, [4, 4])
            np.testing.assert_allclose(got, mlp_reference(x), rtol=1e-5, atol=1e-6)
            print("shm ok")
        finally:
            c.unregister_system_shared_memory(f"in-{tag}")
            c.unregister_system_shared_memory(f"out-{tag}")
            shm.destroy_shared_memory_region(h_in)
            shm.destroy_shared_memory_region(h_out)
        """,
        {"URL": url, "PROTO": protocol},
    )
    assert "shm ok" in out


def test_zerocopy_client_on_the_host(compose_stack: Any) -> None:
    """A ZeroCopy client on the host: the doorbell socket in the host directory mounted as the
    gateway's ZeroCopy volume, the region in the host's /dev/shm, read in place by the executor."""
    stack = compose_stack
    zc_dir = stack.compose_env.get("ANVIL_ZEROCOPY_HOST_DIR")
    if not zc_dir:
        pytest.skip("the project's env file sets no ANVIL_ZEROCOPY_HOST_DIR (a named volume instead)")
    before = _metric(stack.metrics("executor"), "anvil_executor_shm_inputs_total")
    out = _shm_client(
        """
        import os
        import numpy as np
        from anvil_client import ZeroCopyClient

        x = np.random.default_rng(7).standard_normal((1, (1 << 20) // 4)).astype(np.float32)
        with service_uid():  # its region (created and registered here) belongs to the gateway's uid
            zc = ZeroCopyClient(os.environ["ENDPOINT"], slots=2, slot_bytes=4 << 20).__enter__()
        with zc:
            for _ in range(3):
                got = zc.infer("identity", {"INPUT0": x}, priority=3)["OUTPUT0"]
                assert np.array_equal(got, x)
        print("zerocopy ok")
        """,
        {"ENDPOINT": f"ipc://{zc_dir}/anvil-zc.sock"},
    )
    assert "zerocopy ok" in out
    after = _metric(stack.metrics("executor"), "anvil_executor_shm_inputs_total")
    assert after - before >= 3  # the executor read the inputs from the client's region


def _mlp_onnx(seed: int) -> tuple[bytes, dict[str, np.ndarray]]:
    pytest.importorskip("onnx", reason="onnx is a test-only package that .ci/run installs")
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    w = {
        "w1": (rng.standard_normal((16, 64)) / 4).astype(np.float32),
        "b1": (rng.standard_normal(64) * 0.1).astype(np.float32),
        "w2": (rng.standard_normal((64, 8)) / 8).astype(np.float32),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h0"], name="fc1"),
        helper.make_node("Add", ["h0", "b1"], ["h1"], name="fc1_bias"),
        helper.make_node("Relu", ["h1"], ["h2"], name="act"),
        helper.make_node("MatMul", ["h2", "w2"], ["y"], name="fc2"),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])],
        [numpy_helper.from_array(v, k) for k, v in w.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model.SerializeToString(), w


def _compose_run(stack: Any, volumes: list[str], argv: list[str], timeout_s: float = 300) -> tuple[int, str]:
    """`<compose> -p <project> --env-file <env> run --rm --no-deps -T [-v ...] cli <argv>` from the repo
    root (--no-deps: the stack is up; podman makes compose recreate running dependencies otherwise):
    the operator's tools container, as a user runs it (ANVIL_COMPOSE_CLI: the compose command
    `make test-compose` uses; else `docker compose`)."""
    env_file = os.environ.get("ANVIL_COMPOSE_ENV_FILE")
    if not env_file:
        pytest.fail("ANVIL_COMPOSE_ENV_FILE is unset: the project's secrets are needed to run `cli`")
    cli = shlex.split(os.environ.get("ANVIL_COMPOSE_CLI") or "docker compose")
    mounts = [arg for v in volumes for arg in ("-v", v)]
    run = ["run", "--rm", "--no-deps", "-T", *mounts, "cli", *argv]
    proc = subprocess.run(
        [*cli, "-p", stack.project, "--env-file", env_file, *run],
        cwd=Path(__file__).resolve().parents[2],  # compose.yaml
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    return proc.returncode, proc.stdout + proc.stderr


@pytest.mark.timeout(900)  # compile, load and two `compose run`s: over 300 s at load 35-50 on 2 vCPUs
def test_anvil_deploy_through_the_cli_container(compose_stack: Any, tmp_path: Path, waiter: Any) -> None:
    """`docker compose run --rm cli anvil deploy` (the operator's container: Redis's admin user and
    the compiler's API key, on the compose network): compiled by the compiler container without a
    CUDA toolkit, served by the CPU executor, answered through the gateway; then undeployed."""
    stack = compose_stack
    data, w = _mlp_onnx(5)
    name = f"composed-{uuid.uuid4().hex[:6]}"
    model = tmp_path / "model.onnx"
    model.write_bytes(data)
    model.chmod(0o644)  # read in the container by uid 10001
    mount = [f"{model}:/models/model.onnx:ro"]
    code, out = _compose_run(
        stack,
        mount,
        ["anvil", "deploy", "/models/model.onnx", "--name", name, "--wait", "--timeout-s", "240"],
    )
    assert code == 0, out
    assert f"{name} version 1 serves (READY)" in out, out
    try:
        x = np.random.default_rng(6).standard_normal((3, 16)).astype(np.float32)
        body = {
            "inputs": [{"name": "x", "datatype": "FP32", "shape": [3, 16], "data": x.ravel().tolist()}],
            "parameters": {"priority": 3},  # a 2 s budget: containers on a loaded 2-vCPU host
        }
        r = httpx.post(f"{stack.url}/v2/models/{name}/infer", json=body, timeout=60)
        assert r.status_code == 200, r.text
        (output,) = r.json()["outputs"]
        y = np.array(output["data"], np.float32).reshape(output["shape"])
        ref = np.maximum(x @ w["w1"] + w["b1"], 0) @ w["w2"]
        # INT4 by default, within the compiler's default error budget (5% of the largest output)
        assert np.abs(y - ref).max() <= 0.05 * np.abs(ref).max(), (y, ref)
    finally:
        code, out = _compose_run(stack, [], ["anvil", "undeploy", name, "--wait", "--timeout-s", "120"])
        assert code == 0, out

    def gone() -> bool:
        return httpx.get(f"{stack.url}/v2/models/{name}/ready", timeout=10).status_code == 404

    waiter(gone, 30, f"the gateway to answer 404 for the undeployed {name}")


def test_the_service_users_cannot_deploy(compose_stack: Any) -> None:
    """The compiler's container holds its own Redis user, not the admin's: registering a model (a
    write to the repository keys) is refused there, so deploys go through `cli`."""
    stack = compose_stack
    probe = textwrap.dedent("""
        import redis
        password = open("/run/secrets/compiler.redis_password").read().strip()
        r = redis.Redis.from_url("redis://redis:6379/0", username="compiler", password=password)
        try:
            r.hset("anvil:model:intruder", "status", "READY")
            print("written")
        except redis.exceptions.NoPermissionError:
            print("refused")
    """)
    code, out = stack.exec("compiler", ["python", "-c", probe])
    assert (code, out.strip()) == (0, "refused"), out


def test_qos_observes_with_ebpf_or_says_why_not(compose_stack: Any) -> None:
    """qos runs privileged in the host's PID namespace: eBPF when the host lets bcc compile its
    probes, else /proc, with the reason logged once."""
    stack = compose_stack
    text = stack.metrics("qos")
    modes = {m for m in ("ebpf", "procfs") if f'anvil_qos_mode{{mode="{m}"}} 1.0' in text}
    assert len(modes) == 1, [line for line in text.splitlines() if line.startswith("anvil_qos_mode")]
    logs = bytes(stack.container("qos").logs()).decode(errors="replace")
    if modes == {"procfs"}:
        lines = [json.loads(line) for line in logs.splitlines() if "eBPF unavailable" in line]
        assert lines and lines[0].get("reason"), logs[-2000:]
        print(f"\nqos in containers: procfs, because {lines[0]['reason']}")
    else:
        print("\nqos in containers: eBPF")
    # it found the stack's processes through the host's PID namespace
    assert "executor:" in logs and "gateway:" in logs


def test_env_file_is_private(compose_stack: Any) -> None:
    env_file = os.environ.get("ANVIL_COMPOSE_ENV_FILE")
    if not env_file:
        pytest.skip("no env file given")
    assert Path(env_file).stat().st_mode & 0o077 == 0  # the secrets' file: 0600
