"""`anvil up`: the stack of compose.yaml as local processes (no docker).

Same commands and environment as the containers; compose host names become 127.0.0.1; an embedded
Redis when ANVIL_REDIS_URL is unset. A service marked `x-anvil-per-gpu` runs once per GPU chosen
by ANVIL_GPUS (`anvil_client.gpus`). Per-service logs and a state file live in a run directory;
Ctrl-C (or `anvil down`) stops everything that was started, children first, Redis last.

Secrets (issue #18): each start makes fresh CURVE keypairs for the internal ZeroMQ links, the
compiler's API key and, for the embedded Redis, one user and password per service plus the
operator's (``anvil_core.redis_acl``), as 0600 files in ``<run dir>/secrets`` (0700). Children find them
through ANVIL_SECRETS_DIR (compose's ``/run/secrets``, mapped there) and the public keys in
ANVIL_CURVE_*_PUBLIC; the state file records the directory, never a secret. The gateway and the
executors reach the scheduler through ipc sockets in ``<run dir>/links`` (0700; ANVIL_LINK_IPC_DIR,
set it empty for tcp with CURVE); its CURVE tcp ports bind 127.0.0.1 unless ANVIL_LINK_BIND_HOST
says otherwise (executors on other hosts).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from anvil_client.compose_file import ServiceDef, load_services
from anvil_client.embedded_redis import start_redis, wait_redis
from anvil_client.gpus import GpuSelectionError, nvidia_smi_gpus, per_gpu_services
from anvil_client.procs import spawn, stop_group, stop_groups
from anvil_core import redis_acl
from anvil_core.curve import generate_role_keys, write_secret_file
from anvil_core.settings import COMPILER_API_KEY_FILE
from anvil_core.signals import set_on_signals
from anvil_core.unix_link import unix_endpoint
from anvil_core.zmq_sockets import ipc_endpoint

__all__ = [
    "Proc",
    "Stack",
    "StackError",
    "default_profiles",
    "free_ports",
    "plan_procs",
    "private_port_env",
    "run_root",
]

EMBEDDED = "redis"  # the compose service replaced by the embedded server
# Replicas and per-GPU executors share this host's ports: copy n listens on metrics port + 100 x n,
# clear of compose's 8000-8010 block (+ n would put GPU 1's executor on the compiler's 8005).
PORT_STRIDE = 100
CONTAINER_SECRETS = "/run/secrets"  # where compose mounts secrets; the run's secrets dir here
CONTAINER_ZEROCOPY = "/run/anvil/zerocopy"  # compose's ZeroCopy socket volume; private dirs here


class StackError(RuntimeError):
    """The stack could not start; the message names the service and points at its log."""


def run_root(env: Mapping[str, str]) -> Path:
    return Path(env.get("ANVIL_RUN_ROOT", ".anvil/run")).resolve()


def free_ports(n: int) -> list[int]:
    """`n` distinct ports free on 127.0.0.1 right now."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def port_free(port: int) -> bool:
    """Whether `port` can be bound on 127.0.0.1 right now."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def private_port_env(compose: Path) -> dict[str, str]:
    """A free port for every `${ANVIL_*PORT}` that compose.yaml reads: set them to run a second
    stack beside another one (tests, benchmarks). compose.yaml stays the one list of ports, plus
    ANVIL_REDIS_PORT: the embedded Redis's, which compose never publishes."""
    found = set(re.findall(r"\$\{(ANVIL_[A-Z0-9_]*PORT)\b", compose.read_text()))
    names = sorted(found | {"ANVIL_REDIS_PORT"})
    return dict(zip(names, map(str, free_ports(len(names))), strict=True))


def default_profiles(env: Mapping[str, str]) -> set[str]:
    """ANVIL_PROFILES if set, else `gpu` when nvidia-smi lists a GPU, else `cpu`."""
    if env.get("ANVIL_PROFILES"):
        return {p.strip() for p in env["ANVIL_PROFILES"].split(",") if p.strip()}
    return {"gpu"} if nvidia_smi_gpus(env) else {"cpu"}


@dataclass
class Proc:
    name: str  # service name, with `.N` for replicas after the first
    service: ServiceDef
    argv: list[str]
    env: dict[str, str]
    log: Path
    popen: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    next_start_s: float = 0.0
    # Per-GPU executors: ANVIL_SERVICE_ID is this plus a fresh suffix at every (re)start. A restarted
    # executor must not reuse its predecessor's id: the scheduler keeps a re-registered executor's
    # in-flight batches (ExecutorPool.register), which the new process never answers and which hold
    # its credits; under a new id the old one is declared lost and its batches re-dispatched.
    id_prefix: str = ""

    @property
    def device(self) -> str | None:
        return self.env.get("ANVIL_DEVICE") if "ANVIL_DEVICE" in self.service.environment else None


def plan_procs(
    compose: Path,
    env: Mapping[str, str],
    profiles: set[str],
    scale: Mapping[str, int],
    run_dir: Path,
    say: Callable[[str], None] = print,
) -> list[Proc]:
    """The processes `Stack.start` runs for compose.yaml under `profiles`, in start order.

    Starts nothing (the tests plan with a fake nvidia-smi on PATH). `env` is the launcher's
    environment with ANVIL_REDIS_URL already pointing at the Redis to use. Raises StackError when
    ANVIL_GPUS cannot be satisfied or two processes would claim one metrics port.
    """
    services = load_services(compose, env, profiles)
    hosts = set(services) | {EMBEDDED}
    try:
        services = per_gpu_services(services, env, scale, PORT_STRIDE, say)
    except GpuSelectionError as exc:
        raise StackError(str(exc)) from None
    procs: list[Proc] = []
    for svc in _in_dependency_order(services):
        if svc.name == EMBEDDED or not svc.command:
            continue
        for replica in range(scale.get(svc.name, 1)):
            procs.append(_proc(svc, replica, env, hosts | set(services), run_dir))
    _check_metrics_ports(procs)
    return procs


def _proc(svc: ServiceDef, replica: int, base_env: Mapping[str, str], hosts: set[str], run_dir: Path) -> Proc:
    env = dict(base_env)
    env.update({k: _local_hosts(v, hosts) for k, v in svc.environment.items()})
    if replica and "ANVIL_METRICS_PORT" in env:  # replicas share a host here: one port each
        env["ANVIL_METRICS_PORT"] = str(int(env["ANVIL_METRICS_PORT"]) + PORT_STRIDE * replica)
    name = svc.name if replica == 0 else f"{svc.name}.{replica}"
    for key in ("ANVIL_ARTIFACT_DIR", "ANVIL_BUILTIN_ARTIFACT_DIR"):
        if env.get(key, "").startswith("/var/lib/"):  # the container volumes: one directory here
            env[key] = str(run_dir / "artifacts")
    if env.get("ANVIL_SECRETS_DIR") == CONTAINER_SECRETS:
        env["ANVIL_SECRETS_DIR"] = str(secrets_dir(run_dir))
    if env.get("ANVIL_ZEROCOPY_DIR") == CONTAINER_ZEROCOPY:  # the container volume: here, each
        env["ANVIL_ZEROCOPY_DIR"] = ""  # gateway makes its private directory (docs/protocol.md)
    proc = Proc(name, svc, _local_argv(svc.command), env, run_dir / f"{name}.log")
    if svc.per_gpu:
        proc.id_prefix = f"{socket.gethostname()}-{name}"
        env["ANVIL_SERVICE_ID"] = _fresh_id(proc.id_prefix)
    return proc


def secrets_dir(run_dir: Path) -> Path:
    return run_dir / "secrets"


def make_secrets(run_dir: Path, env: dict[str, str], redis_users: bool) -> dict[str, str]:
    """Fresh CURVE keys (public keys into `env`), the compiler's API key and, if asked, a Redis
    password per role, as 0600 files under the run's secrets directory; returns role -> password
    for the embedded Redis (empty when not asked)."""
    where = secrets_dir(run_dir)
    env.update(generate_role_keys(where))
    # 256 bits, hex: nothing to escape in any client, header or file
    write_secret_file(where / COMPILER_API_KEY_FILE, secrets.token_hex(32))
    if not redis_users:
        return {}
    users = {role: secrets.token_hex(32) for role in redis_acl.ROLES}
    for role, password in users.items():
        write_secret_file(where / redis_acl.password_file(role), password)
    return users


def _ipc_dir(run_dir: Path, say: Callable[[str], None]) -> str:
    """<run dir>/links for the links' ipc sockets, or "" (tcp with CURVE) when the path is too long
    for a unix socket address."""
    where = str(run_dir / "links")
    try:
        ipc_endpoint(where, "executor")
        unix_endpoint(where, "executor")  # the Unix stream links' path (one byte longer)
    except ValueError as exc:
        say(f"anvil: {exc}; the links use tcp with CURVE instead")
        return ""
    return where


def _fresh_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def _check_metrics_ports(procs: list[Proc]) -> None:
    owner: dict[str, str] = {}
    for proc in procs:
        port = proc.env.get("ANVIL_METRICS_PORT")
        if port is None or "ANVIL_METRICS_PORT" not in proc.service.environment:
            continue
        if port in owner:
            raise StackError(
                f"{owner[port]} and {proc.name} would both serve metrics on port {port}; "
                "give one of them another port (its ANVIL_*METRICS_PORT) or drop a profile"
            )
        owner[port] = proc.name


@dataclass
class Stack:
    compose: Path
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    profiles: set[str] | None = None
    scale: dict[str, int] = field(default_factory=dict)
    restart: bool = True
    run_dir: Path | None = None
    say: Callable[[str], None] = print

    def __post_init__(self) -> None:
        self.procs: list[Proc] = []
        self.redis: subprocess.Popen[bytes] | None = None
        self.redis_port: int | None = None
        self._stopping = threading.Event()
        self.lock = threading.Lock()

    # ---- start ------------------------------------------------------------------------------
    def start(self, timeout_s: float = 60.0) -> None:
        root = run_root(self.env)
        self.run_dir = self.run_dir or root / time.strftime("%Y%m%d-%H%M%S")
        self.run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        env = dict(self.env)
        env.setdefault("ANVIL_LINK_BIND_HOST", "127.0.0.1")
        if "ANVIL_LINK_IPC_DIR" not in env:
            env["ANVIL_LINK_IPC_DIR"] = _ipc_dir(self.run_dir, self.say)
        users = make_secrets(self.run_dir, env, redis_users=not env.get("ANVIL_REDIS_URL"))
        if not env.get("ANVIL_REDIS_URL"):
            self.redis_port = int(env.get("ANVIL_REDIS_PORT", "6379"))
            password = users[redis_acl.ADMIN]
            self.redis = start_redis(self.redis_port, self.run_dir, users=users)
            if not wait_redis(self.redis_port, 10, password):
                self.stop()
                raise StackError(
                    f"embedded redis did not answer on port {self.redis_port}; see {self.run_dir}/redis.log"
                )
            env["ANVIL_REDIS_URL"] = f"redis://127.0.0.1:{self.redis_port}/0"
            where = secrets_dir(self.run_dir)
            self.say(
                f"anvil: embedded redis on 127.0.0.1:{self.redis_port}, "
                f"a user per service, passwords in {where}"
            )
        try:
            profiles = self.profiles or default_profiles(env)
            self.procs = plan_procs(self.compose, env, profiles, self.scale, self.run_dir, self.say)
        except Exception:  # the embedded Redis is already running
            self.stop()
            raise
        for proc in self.procs:
            self._spawn(proc)
        self.write_state(ready=False)
        try:
            self._wait_healthy(timeout_s)
        except StackError:
            self.stop()
            raise
        self.write_state(ready=True)

    def _spawn(self, proc: Proc) -> None:
        if proc.id_prefix and proc.popen is not None:  # a restart: a new id (see Proc.id_prefix)
            proc.env["ANVIL_SERVICE_ID"] = _fresh_id(proc.id_prefix)
        proc.popen = spawn(proc.argv, proc.env, proc.log)
        where = f" on {proc.device}" if proc.device else ""
        self.say(f"anvil: started {proc.name}{where} (pid {proc.popen.pid}), log {proc.log}")

    def _wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        pending = [p for p in self.procs if p.service.healthcheck]
        while pending:
            for proc in list(pending):
                assert proc.popen is not None
                if proc.popen.poll() is not None:
                    raise StackError(f"{proc.name} exited with code {proc.popen.returncode}; see {proc.log}")
                if _check(proc):
                    pending.remove(proc)
            if time.monotonic() > deadline:
                raise StackError(f"not healthy after {timeout_s:.0f} s: {[p.name for p in pending]}")
            if pending:
                time.sleep(0.2)
        url = self.gateway_url()
        while url is not None:
            try:
                with urllib.request.urlopen(f"{url}/v2/health/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise StackError(f"gateway {url} not ready after {timeout_s:.0f} s; see {self.run_dir}")
            time.sleep(0.2)

    def gateway_url(self) -> str | None:
        for proc in self.procs:
            if proc.service.name == "gateway":
                return f"http://127.0.0.1:{proc.env.get('ANVIL_HTTP_PORT', '8000')}"
        return None

    def grpc_target(self) -> str | None:
        """host:port of the gateway's KServe v2 gRPC endpoint; None when ANVIL_GRPC_PORT is 0."""
        for proc in self.procs:
            if proc.service.name == "gateway":
                port = proc.env.get("ANVIL_GRPC_PORT", "8001")
                return None if port == "0" else f"127.0.0.1:{port}"
        return None

    # ---- supervise / stop ---------------------------------------------------------------------
    def supervise(self, stop: threading.Event) -> None:
        """Until `stop` is set: restart services that exit, per their compose restart policy."""
        while not stop.wait(0.2):
            with self.lock:
                for proc in self.procs:
                    self._maybe_restart(proc)

    def _maybe_restart(self, proc: Proc) -> None:
        if proc.popen is None or proc.popen.poll() is None or self._stopping.is_set():
            return
        code = proc.popen.returncode
        policy = proc.service.restart
        wanted = self.restart and (
            policy in ("always", "unless-stopped") or (policy == "on-failure" and code != 0)
        )
        if not wanted:
            return
        now = time.monotonic()
        if proc.next_start_s == 0.0:
            proc.next_start_s = now + min(10.0, 0.5 * 2 ** min(proc.restarts, 5))
            self.say(f"anvil: {proc.name} exited with code {code}; restarting (see {proc.log})")
        elif now >= proc.next_start_s:
            proc.restarts += 1
            proc.next_start_s = 0.0
            self._spawn(proc)
            self.write_state(ready=True)

    def stop(self) -> None:
        """Every service at once (SIGTERM, SIGKILL after one grace for all), then Redis, which they
        may still write to as they stop."""
        self._stopping.set()
        with self.lock:
            live = [p.popen for p in reversed(self.procs) if p.popen is not None and p.popen.poll() is None]
            stop_groups([popen.pid for popen in live])
            for popen in live:
                popen.wait()
            if self.redis is not None and self.redis.poll() is None:
                stop_group(self.redis.pid)
                self.redis.wait()
        if self.run_dir is not None:  # the keys and password of a stopped stack open nothing
            shutil.rmtree(secrets_dir(self.run_dir), ignore_errors=True)
        self.say("anvil: stopped")
        state = run_root(self.env) / "current.json"
        if state.exists():
            state.unlink()

    def write_state(self, ready: bool) -> None:
        """The state file `anvil down`, `anvil status` and the tests read (0600: it holds the env)."""
        assert self.run_dir is not None
        doc = {
            "launcher_pid": os.getpid(),
            "ready": ready,
            "run_dir": str(self.run_dir),
            "gateway": self.gateway_url(),
            "redis_url": (
                f"redis://127.0.0.1:{self.redis_port}/0"
                if self.redis_port
                else self.env.get("ANVIL_REDIS_URL")
            ),
            "redis_pid": self.redis.pid if self.redis else None,
            "secrets_dir": str(secrets_dir(self.run_dir)),
            "services": [
                {
                    "name": p.name,
                    "service": p.service.name,
                    "pid": p.popen.pid if p.popen else None,
                    "argv": p.argv,
                    "env": p.env,
                    "log": str(p.log),
                }
                for p in self.procs
            ],
        }
        for path in (self.run_dir / "state.json", run_root(self.env) / "current.json"):
            tmp = path.with_suffix(".tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump(doc, f, indent=1)
            tmp.replace(path)


# compose.yaml's HTTP healthchecks: `python -c` of one urlopen of 127.0.0.1 at a port from the
# service's environment. The launcher runs the same request itself instead of a Python process per
# check (~35 of them per `anvil up`, ~0.12 s of CPU each); any other check runs as written.
_URL_CHECK = re.compile(
    r"^__import__\('urllib\.request'\)\.request\.urlopen\('http://127\.0\.0\.1:'"
    r"\+__import__\('os'\)\.environ\['(?P<var>[A-Z0-9_]+)'\]\+'(?P<path>/[A-Za-z0-9_/.-]*)',"
    r"timeout=(?P<timeout>[0-9.]+)\)$"
)


def url_check(argv: list[str], env: dict[str, str]) -> tuple[str, float] | None:
    """(url, timeout s) when argv is one of compose.yaml's `python -c` urlopen checks, else None."""
    if len(argv) != 3 or argv[0] not in ("python", "python3") or argv[1] != "-c":
        return None
    m = _URL_CHECK.match(argv[2])
    if m is None or m["var"] not in env:
        return None
    return f"http://127.0.0.1:{env[m['var']]}{m['path']}", float(m["timeout"])


def _check(proc: Proc) -> bool:
    assert proc.service.healthcheck is not None
    probe = url_check(proc.service.healthcheck, proc.env)
    if probe is not None:
        try:  # what the command does: exit 0 iff urlopen answers (any 2xx/3xx) within the timeout
            with urllib.request.urlopen(probe[0], timeout=probe[1]):
                return True
        except (OSError, ValueError):
            return False
    try:
        argv = _local_argv(proc.service.healthcheck)
        return subprocess.run(argv, env=proc.env, capture_output=True, timeout=5).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _local_argv(argv: list[str]) -> list[str]:
    """`python ...` runs with this interpreter (the workspace's virtual environment)."""
    if argv and argv[0] in ("python", "python3"):
        return [sys.executable, *argv[1:]]
    return list(argv)


def _local_hosts(value: str, hosts: set[str]) -> str:
    """Map compose service host names inside a value to 127.0.0.1."""
    if value in hosts:
        return "127.0.0.1"
    for host in hosts:
        value = re.sub(
            rf"(?<=://){re.escape(host)}(?=[:/]|$)|(?<=@){re.escape(host)}(?=[:/]|$)", "127.0.0.1", value
        )
    return value


def _in_dependency_order(services: dict[str, ServiceDef]) -> list[ServiceDef]:
    order: list[ServiceDef] = []
    seen: set[str] = set()

    def visit(name: str, stack: tuple[str, ...]) -> None:
        if name in seen or name not in services:
            return
        if name in stack:
            raise StackError(f"depends_on cycle: {' -> '.join((*stack, name))}")
        for dep in services[name].depends_on:
            visit(dep, (*stack, name))
        seen.add(name)
        order.append(services[name])

    for name in services:
        visit(name, ())
    return order


def install_signal_stop(stop: threading.Event) -> None:
    """Ctrl-C and SIGTERM (`anvil down`) set `stop`; not from the handler itself (anvil_core.signals)."""
    set_on_signals(stop)
