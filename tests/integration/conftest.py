"""The stack under test, started through the same launcher as `make up` (or, with
ANVIL_STACK=docker, as containers through the docker SDK), on free ports."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import zmq

from anvil_client.launcher import free_ports, private_port_env
from anvil_core.curve import CurveClient, parse_public_keys, read_secret_key
from anvil_core.redis_conn import load_redis_auth, sync_redis
from anvil_core.zmq_sockets import make_socket

ROOT = Path(__file__).resolve().parents[2]
HEARTBEAT_TTL_S = 1.5


def wait_for(predicate: Callable[[], bool], timeout_s: float, what: str, every_s: float = 0.05) -> float:
    """Poll a condition of another process until it holds; returns the seconds it took."""
    t0 = time.monotonic()
    while not predicate():
        if time.monotonic() - t0 > timeout_s:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(every_s)
    return time.monotonic() - t0


class LocalStack:
    """`anvil up` in a subprocess; exposes the launcher's state file for pids and environments."""

    def __init__(
        self, tmp: Path, extra_env: dict[str, str] | None = None, scale: dict[str, int] | None = None
    ) -> None:
        ports = private_port_env(ROOT / "compose.yaml")
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("ANVIL_")}
        self.env.update(ports)
        self.env.update(
            {
                "ANVIL_RUN_ROOT": str(tmp / "run"),
                "ANVIL_PROFILES": "cpu",
                "ANVIL_HEARTBEAT_INTERVAL_MS": "300",
                "ANVIL_HEARTBEAT_TTL_MS": str(int(HEARTBEAT_TTL_S * 1000)),
                "ANVIL_EXECUTOR_TIMEOUT_MS": str(int(HEARTBEAT_TTL_S * 1000)),
                "ANVIL_ALLOW_CLIENT_SHM": "1",
                "PYTHONUNBUFFERED": "1",
                # not `make up`'s default (which adds minilm): the suites that embed text ask for it
                "ANVIL_MODELS": "identity,mlp",
            }
        )
        self.env.update(extra_env or {})
        self.url = f"http://127.0.0.1:{ports['ANVIL_HTTP_PORT']}"
        grpc_port = self.env.get("ANVIL_GRPC_PORT", ports["ANVIL_GRPC_PORT"])
        self.grpc_target = None if grpc_port == "0" else f"127.0.0.1:{grpc_port}"
        self.redis_port = int(ports["ANVIL_REDIS_PORT"])
        argv = [sys.executable, "-m", "anvil_client.cli", "up", "--no-restart", "--timeout", "90"]
        for name, n in (scale or {}).items():
            argv += ["--scale", f"{name}={n}"]
        self.proc = subprocess.Popen(
            argv, cwd=ROOT, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.output: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()
        self._await_line("anvil: ready", 120)
        self.extra: list[subprocess.Popen[bytes]] = []

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line)
            self.lines.put(line)
        self.lines.put("<eof>")

    def _await_line(self, marker: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                line = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"launcher never printed {marker!r}:\n{''.join(self.output)}") from None
            if line.startswith(marker):
                return
            if line == "<eof>":
                raise AssertionError(f"launcher exited before {marker!r}:\n{''.join(self.output)}")

    @property
    def state(self) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads((Path(self.env["ANVIL_RUN_ROOT"]) / "current.json").read_text())
        return doc

    @property
    def secrets_dir(self) -> Path:
        """The stack's secrets (CURVE keys, Redis password), 0600 files in a 0700 directory."""
        return Path(self.state["secrets_dir"])

    @property
    def redis_password(self) -> str | None:
        return load_redis_auth(secrets_dir=self.secrets_dir).password

    def curve(self, role: str) -> CurveClient:
        """The CURVE keys a trusted `role` peer (gateway or executor) of this stack holds."""
        (server,) = parse_public_keys(self.service("scheduler")["env"]["ANVIL_CURVE_SCHEDULER_PUBLIC"], "")
        return CurveClient(read_secret_key(self.secrets_dir, role), server)

    def redis(self, **kwargs: Any) -> redis.Redis:
        """A client of the stack's Redis, with its password."""
        return sync_redis(self.state["redis_url"], load_redis_auth(secrets_dir=self.secrets_dir), **kwargs)

    def zerocopy_endpoint(self) -> str:
        """The ZeroCopy endpoint the gateway advertises in its registry record (clients find it so)."""
        client = self.redis(decode_responses=True)
        try:
            for key in client.scan_iter("anvil:svc:gateway:*"):
                if endpoint := client.hget(key, "zerocopy_endpoint"):
                    return str(endpoint)
        finally:
            client.close()
        # The gateway always serves ZeroCopy on a local stack: a record without it is a bug.
        raise AssertionError("the gateway advertises no zerocopy_endpoint (ZeroCopyServer not wired)")

    def service(self, name: str) -> dict[str, Any]:
        for svc in self.state["services"]:
            if svc["name"] == name:
                return dict(svc)
        raise KeyError(name)

    def kill(self, name: str) -> int:
        pid = int(self.service(name)["pid"])
        os.kill(pid, signal.SIGKILL)
        return pid

    def start_again(self, name: str) -> subprocess.Popen[bytes]:
        """Start a replacement for a killed service with its recorded command and environment."""
        svc = self.service(name)
        log = open(svc["log"], "ab")  # noqa: SIM115
        proc = subprocess.Popen(
            svc["argv"], env=svc["env"], stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()
        self.extra.append(proc)
        return proc

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()  # returncode -9: what a test of the clean stop then sees
                self.proc.wait(10)
        for proc in self.extra:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(10)


DOCKER = os.environ.get("ANVIL_STACK", "local") == "docker"
# In docker mode the suite runs against containers; what starts its own local stack skips saying so.
LOCAL_ONLY = "starts a local stack of its own (`make test` runs it); ANVIL_STACK=docker tests the containers"


def _docker_stack(tmp: Path) -> Any:
    from anvil_client.docker_stack import ComposeStack, DockerStack, DockerUnavailable, read_env_file

    project = os.environ.get("ANVIL_COMPOSE_PROJECT")
    if project:  # `make test-compose`: attach to what `docker compose up` started
        env_file = os.environ.get("ANVIL_COMPOSE_ENV_FILE")
        compose = ComposeStack(project, read_env_file(Path(env_file)) if env_file else {})
        try:
            compose.start()
        except DockerUnavailable as exc:
            pytest.fail(f"ANVIL_COMPOSE_PROJECT={project}, but no Docker engine is usable: {exc}")
        return compose
    port, grpc_port = free_ports(2)
    stack = DockerStack(
        ROOT / "compose.yaml",
        project=f"anvil-test-{os.getpid()}",
        env=dict(os.environ),
        http_port=port,
        grpc_port=grpc_port,
    )
    try:
        stack.start()
    except DockerUnavailable as exc:
        pytest.fail(f"ANVIL_STACK=docker was asked for, but no Docker engine is usable here: {exc}")
    return stack


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One stack shared by the tests that do not break it (tests that kill services use their own)."""
    tmp = tmp_path_factory.mktemp("stack")
    mode = os.environ.get("ANVIL_STACK", "local")
    if mode == "docker":
        s = _docker_stack(tmp)
        yield s
        s.stop()
        return
    if mode != "local":
        pytest.fail(f"ANVIL_STACK must be 'local' or 'docker', got {mode!r}")
    local = LocalStack(tmp)
    yield local
    local.stop()


@pytest.fixture
def compose_stack(request: pytest.FixtureRequest) -> Any:
    """The stack, when it is the containers of `make test-compose` (else the test skips)."""
    if not os.environ.get("ANVIL_COMPOSE_PROJECT"):
        pytest.skip("runs against the containers of `make test-compose` (ANVIL_COMPOSE_PROJECT unset)")
    return request.getfixturevalue("stack")


@pytest.fixture(scope="module")
def private_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    """A stack of the module's own, for tests that kill services or Redis."""
    if os.environ.get("ANVIL_STACK", "local") != "local":
        pytest.skip("kill/restart tests drive local processes; the docker mode has its own chaos suite")
    local = LocalStack(tmp_path_factory.mktemp("private"))
    yield local
    local.stop()


@pytest.fixture
def http(stack: Any) -> Iterator[httpx.Client]:
    with httpx.Client(
        base_url=stack.url if hasattr(stack, "url") else stack.gateway_url, timeout=10
    ) as client:
        yield client


SHED_TRIES = 5


def is_shed(r: httpx.Response) -> bool:
    """The gateway's load-shedding answer: 429 with Retry-After, said to be a shed. Priority 3 gets
    it while the gateway's event loop is late and a more important request came within the last
    second (an earlier test's, say): on a loaded 2-vCPU CI machine that happens."""
    return r.status_code == 429 and "retry-after" in r.headers and r.text.startswith('{"error":"shed:')


class ThroughShedding:
    """Sends a request again as its shed answer advises (Retry-After), as a client would, up to
    SHED_TRIES times; returns the last answer (whatever it is: the test asserts on it). ``shed``
    counts the shed answers (the model's statistics count each as a failure)."""

    def __init__(self) -> None:
        self.shed = 0
        self._lock = threading.Lock()

    def _was_shed(self, r: httpx.Response) -> bool:
        if not is_shed(r):
            return False
        with self._lock:
            self.shed += 1
        return True

    def call(self, send: Callable[[], httpx.Response]) -> httpx.Response:
        for _ in range(SHED_TRIES - 1):
            r = send()
            if not self._was_shed(r):
                return r
            time.sleep(float(r.headers["retry-after"]))
        return send()

    async def acall(self, send: Callable[[], Awaitable[httpx.Response]]) -> httpx.Response:
        import asyncio

        for _ in range(SHED_TRIES - 1):
            r = await send()
            if not self._was_shed(r):
                return r
            await asyncio.sleep(float(r.headers["retry-after"]))
        return await send()


@pytest.fixture
def through_shedding() -> ThroughShedding:
    """Concurrent priority-3 requests, sent again as their 429 shed answers advise."""
    return ThroughShedding()


@pytest.fixture
def waiter() -> Callable[..., float]:
    """`wait_for(predicate, timeout_s, what)` for conditions of other processes."""
    return wait_for


def _stacks(tmp_path_factory: pytest.TempPathFactory, label: str) -> Iterator[Callable[..., LocalStack]]:
    """A maker of stacks with their own settings; every stack it made is stopped when it closes."""
    if DOCKER:
        pytest.skip(LOCAL_ONLY)
    made: list[LocalStack] = []

    def make(env: dict[str, str] | None = None, scale: dict[str, int] | None = None) -> LocalStack:
        s = LocalStack(tmp_path_factory.mktemp(label), extra_env=env, scale=scale)
        made.append(s)
        return s

    yield make
    for s in made:
        s.stop()


@pytest.fixture
def new_local_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., LocalStack]]:
    """Start extra, private stacks (stopped at teardown if the test did not)."""
    yield from _stacks(tmp_path_factory, "extra")


@pytest.fixture(scope="module")
def scaled_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    """A private stack with two CPU executors (`--scale executor=2`), for the chaos suite."""
    if os.environ.get("ANVIL_STACK", "local") != "local":
        pytest.skip("chaos tests drive local processes")
    local = LocalStack(
        tmp_path_factory.mktemp("scaled"),
        extra_env={"ANVIL_MODELS": "identity,mlp,busy"},
        scale={"executor": 2},
    )
    yield local
    local.stop()


@pytest.fixture(scope="session")
def stack_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., LocalStack]]:
    """Stacks with their own settings, for module-scoped fixtures; all stopped at session end."""
    yield from _stacks(tmp_path_factory, "custom")


@pytest.fixture(scope="session")
def strict_stack(stack_factory: Callable[..., LocalStack]) -> LocalStack:
    """A stack that refuses requests without a known API key (ANVIL_REQUIRE_API_KEY=1), shared by the
    HTTP and gRPC suites that check it."""
    return stack_factory(env={"ANVIL_REQUIRE_API_KEY": "1"})


@pytest.fixture(scope="session")
def tcp_stack(stack_factory: Callable[..., LocalStack]) -> LocalStack:
    """A stack whose links are tcp with CURVE (no ipc directory), as in compose and across hosts;
    for tests that watch or need the tcp links (`anvil up` otherwise links through ipc)."""
    if os.environ.get("ANVIL_STACK", "local") != "local":
        pytest.skip("starts a local stack")
    return stack_factory(env={"ANVIL_LINK_IPC_DIR": ""})


@pytest.fixture(scope="module")
def busy_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    """A private stack that also loads `busy` (slow on purpose), for tests that abuse the gateway."""
    if os.environ.get("ANVIL_STACK", "local") != "local":
        pytest.skip("needs local processes")
    local = LocalStack(tmp_path_factory.mktemp("busy"), extra_env={"ANVIL_MODELS": "identity,mlp,busy"})
    yield local
    local.stop()


# ---- idle means zero (issue #22) -------------------------------------------------------------------
# The scheduler's accounting gauges: each returns to 0 once every admitted request has been answered.
IDLE_GAUGES = (
    "anvil_scheduler_queue_depth",
    "anvil_scheduler_in_flight_batches",
    "anvil_scheduler_in_flight_requests",
    "anvil_scheduler_open_requests",
    "anvil_scheduler_work_ahead_us",
    "anvil_scheduler_awaiting_result_batches",
)


def scheduler_held(stack: Any) -> dict[str, float]:
    """Non-zero accounting series of the stack's scheduler ({series: value}); {} when idle."""
    port = stack.service("scheduler")["env"]["ANVIL_METRICS_PORT"]
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    held: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(IDLE_GAUGES):
            series, _, value = line.rpartition(" ")
            if float(value) != 0.0:
                held[series] = float(value)
    return held


def assert_idle_means_zero(stack: Any, timeout_s: float = 10.0) -> None:
    """After a scenario, once its requests are answered, the scheduler holds nothing: no queued, in
    flight or open request, no predicted work ahead. Waits for the gauges' next export (50 ms) and
    for answers still on their way; fails naming what is still held."""
    last: dict[str, float] = {}

    def idle() -> bool:
        nonlocal last
        last = scheduler_held(stack)
        return not last

    try:
        wait_for(idle, timeout_s, "the scheduler's accounting to return to zero")
    except AssertionError:
        raise AssertionError(f"idle means zero, but the scheduler still holds {last}") from None


@pytest.fixture
def idle_means_zero() -> Callable[..., None]:
    """`idle_means_zero(stack)`: assert the scheduler's accounting is back to zero (see above)."""
    return assert_idle_means_zero


@pytest.fixture(scope="module")
def sockets(private_stack: Any) -> Iterator[tuple[Any, zmq.Socket[bytes], zmq.Socket[bytes]]]:
    """(stack, gateway-side DEALER, executor-side DEALER) on the private stack's scheduler ports, each
    holding the stack's CURVE keys of its role: what a compromised gateway or executor could send."""
    env = private_stack.service("scheduler")["env"]
    ctx = zmq.Context()
    gw, ex = (
        make_socket(ctx, zmq.DEALER, identity=f"peer-{role[:2]}", curve=private_stack.curve(role),
                    connect=f"tcp://127.0.0.1:{env[port]}")
        for role, port in (("gateway", "ANVIL_GATEWAY_PORT"), ("executor", "ANVIL_EXECUTOR_PORT"))
    )  # fmt: skip
    yield private_stack, gw, ex
    gw.close()
    ex.close()
    ctx.term()
