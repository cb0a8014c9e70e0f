"""`ANVIL_STACK=docker`: the services of compose.yaml as containers, through the Docker SDK.

Two ways. `ComposeStack` attaches to a project that `docker compose up` started (what `make
test-compose` does; ANVIL_COMPOSE_PROJECT names it): it creates nothing and reads, execs into and
kills the project's containers. `DockerStack` (below) starts the services itself:

What `docker compose --profile cpu up` does, reduced to what the integration tests need: images built
from the repo root, one user network where each container answers to its service name, every service
started once its dependencies are healthy (Redis first), only the gateway's HTTP port published (on
127.0.0.1:<http_port>). All it creates is labelled `io.anvil.project=<project>`; `stop()` removes it,
`start()` first removes what a crashed run left. Restart policies stay off unless asked for, so
`kill(service)` leaves the service dead until `restart(service)`.

Secrets (issue #18): each service's `secrets` are written into its container before it starts, at
/run/secrets/<target> with the uid and mode compose.yaml asks for, as compose does with secrets
taken from the environment; a fresh set (`anvil secrets`) is made when the environment has none.
"""

from __future__ import annotations

import io
import os
import re
import tarfile
import time
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from anvil_client.compose_file import ServiceDef, interpolate, load_services
from anvil_client.compose_secrets import compose_secrets_env

__all__ = ["ComposeStack", "DockerStack", "DockerStackError", "DockerUnavailable", "connect_engine"]

LABEL = "io.anvil.project"
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ns|us|ms|s|m|h)")
_NS_PER = {"ns": 1, "us": 10**3, "ms": 10**6, "s": 10**9, "m": 60 * 10**9, "h": 3600 * 10**9}


class DockerUnavailable(RuntimeError):
    """No Docker engine answered; the message names the endpoint tried and the error it gave."""


class DockerStackError(RuntimeError):
    """The engine answered but the stack did not come up; the message names the service."""


def _duration_ns(value: str) -> int:
    """A compose duration (`5s`, `1m30s`, `500ms`) in nanoseconds, as the Engine API wants it."""
    parts = _DURATION.findall(value)
    if not parts or "".join(n + u for n, u in parts) != value:
        raise DockerStackError(f"not a compose duration: {value!r}")
    return sum(int(float(n) * _NS_PER[u]) for n, u in parts)


def _container_port(spec: Any) -> int:
    """The container side of a `ports` entry: `8000:8000`, `127.0.0.1:80:8000/tcp`, `{target: 8000}`."""
    return int(spec["target"]) if isinstance(spec, dict) else int(str(spec).split("/")[0].rsplit(":", 1)[-1])


def _healthcheck(raw: Mapping[str, Any]) -> dict[str, Any]:
    health = raw.get("healthcheck") or {}
    if not health.get("test") or health.get("disable"):
        return {}
    check = {"test": health["test"], "retries": int(health.get("retries", 3))}
    check.update({k: _duration_ns(health[k]) for k in ("interval", "timeout", "start_period") if k in health})
    return {"healthcheck": check}


def _gpus(raw: Mapping[str, Any]) -> dict[str, Any]:
    """`deploy.resources.reservations.devices` as Engine device requests (the nvidia runtime)."""
    import docker

    devices = (((raw.get("deploy") or {}).get("resources") or {}).get("reservations") or {}).get("devices")
    requests = [
        docker.types.DeviceRequest(
            driver=d.get("driver", ""),
            count=d.get("count"),
            device_ids=d.get("device_ids"),
            capabilities=[d.get("capabilities", ["gpu"])],
        )
        for d in devices or []
    ]
    return {"device_requests": requests} if requests else {}


def secrets_tar(
    service: str, entries: Iterable[Any], defined: Mapping[str, Any], env: Mapping[str, str], base: Path
) -> bytes:
    """A tar of `service`'s secrets for extraction at /run: `secrets/<target>` with uid and mode.

    `entries` is the service's `secrets` list (short: a name; long: source/target/uid/gid/mode),
    `defined` the top-level `secrets` map (`environment: VAR` or `file: PATH`)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        folder = tarfile.TarInfo("secrets")
        folder.type, folder.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(folder)
        for entry in entries:
            spec = {"source": entry} if isinstance(entry, str) else dict(entry)
            source = str(spec["source"])
            origin = defined.get(source) or {}
            if "environment" in origin:
                if origin["environment"] not in env:
                    raise DockerStackError(f"{service}: secret {source} needs ${origin['environment']}")
                data = env[origin["environment"]].encode()
            elif "file" in origin:
                data = (base / origin["file"]).read_bytes()
            else:
                raise DockerStackError(f"{service}: secret {source} is not defined (environment or file)")
            info = tarfile.TarInfo(f"secrets/{spec.get('target', source)}")
            info.size, info.uid, info.gid = len(data), int(spec.get("uid", 0)), int(spec.get("gid", 0))
            mode = spec.get("mode", 0o444)
            info.mode = int(mode, 8) if isinstance(mode, str) else int(mode)  # "0o400", "0400" or 256
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _ordered(services: Mapping[str, ServiceDef]) -> list[ServiceDef]:
    """Dependencies first; a dependency outside the enabled profiles is ignored, as compose does."""
    done: list[str] = []
    while len(done) < len(services):
        ready = [
            n for n, s in services.items() if n not in done and set(s.depends_on) & set(services) <= set(done)
        ]
        if not ready:
            raise DockerStackError(f"depends_on cycle among {sorted(set(services) - set(done))}")
        done += ready
    return [services[n] for n in done]


def connect_engine(env: Mapping[str, str]) -> Any:
    """A docker SDK client of the engine DOCKER_HOST names (else /var/run/docker.sock), pinged;
    DockerUnavailable says which endpoint failed and how."""
    try:
        import docker
    except ImportError:
        raise DockerUnavailable("the `docker` Python package is not installed (root dev group)") from None
    host = env.get("DOCKER_HOST")
    where = f"DOCKER_HOST={host}" if host else "DOCKER_HOST unset: unix:///var/run/docker.sock"
    try:
        client = docker.from_env(environment=dict(env), timeout=30)
        client.ping()
    except (docker.errors.DockerException, OSError) as exc:
        raise DockerUnavailable(
            f"no Docker engine reachable ({where}): {exc}. docker-py does not follow "
            "`docker context`; set DOCKER_HOST to the engine's socket"
        ) from None
    return client


class DockerStack:
    def __init__(
        self,
        compose: Path,
        project: str,
        env: Mapping[str, str],
        http_port: int,
        *,
        grpc_port: int | None = None,  # publish the gateway's gRPC port here too (None: not)
        profiles: set[str] | None = None,
        build: bool = True,
        restart_policies: bool = False,
        ready_timeout_s: float = 180.0,  # after the builds: pulls, start-up, first registration
        say: Callable[[str], None] = print,
    ) -> None:
        self.compose = compose.resolve()
        self.project = project
        self.env = {**os.environ, **env}  # interpolation and DOCKER_HOST, like the compose CLI
        if not any(k.startswith("ANVIL_SECRET_") for k in self.env):
            self.env.update(compose_secrets_env())  # a fresh set: what `anvil secrets` writes
        doc = yaml.safe_load(self.compose.read_text()) or {}
        self._defined_secrets: dict[str, Any] = doc.get("secrets") or {}
        self.http_port = http_port
        self.grpc_port = grpc_port
        self.profiles = profiles or {"cpu"}
        self.build = build
        self.restart_policies = restart_policies
        self.ready_timeout_s = ready_timeout_s
        self.say = say
        self._client: Any = None
        self._containers: dict[str, Any] = {}
        self._network = f"{project}_default"

    @property
    def gateway_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def grpc_target(self) -> str | None:
        """host:port of the gateway's KServe v2 gRPC endpoint, when it is published."""
        return None if self.grpc_port is None else f"127.0.0.1:{self.grpc_port}"

    def start(self) -> None:
        """Build, create the network, run every service in dependency order, wait for the gateway.

        Raises DockerUnavailable when no engine answers, DockerStackError when the stack does not
        come up (everything already created is removed first)."""
        self._client = self._connect()
        doc = yaml.safe_load(self.compose.read_text()) or {}
        raw: dict[str, dict[str, Any]] = interpolate(doc.get("services") or {}, self.env)
        services = load_services(self.compose, self.env, self.profiles)
        self._teardown()
        try:
            if self.build:
                self._build_images(services.values(), raw)
            self._client.networks.create(self._network, driver="bridge", labels={LABEL: self.project})
            for name in doc.get("volumes") or {}:
                self._client.volumes.create(f"{self.project}_{name}", labels={LABEL: self.project})
            deadline = time.monotonic() + self.ready_timeout_s
            for svc in _ordered(services):
                for dep in svc.depends_on:
                    if dep in self._containers:
                        self._wait_healthy(dep, deadline)
                self._run(svc, raw[svc.name])
            self._wait_ready(deadline)
        except BaseException:
            self.stop()
            raise

    def _connect(self) -> Any:
        return connect_engine(self.env)

    def _build_images(self, services: Iterable[ServiceDef], raw: Mapping[str, dict[str, Any]]) -> None:
        import docker

        built: set[str] = set()
        for svc in services:
            spec = raw[svc.name].get("build")
            if not spec or svc.image in built:
                continue
            spec = {"context": spec} if isinstance(spec, str) else spec
            dockerfile = spec.get("dockerfile", "Dockerfile")
            context = self.compose.parent / spec.get("context", ".")
            self.say(f"anvil: building {svc.image} from {dockerfile} (context {context})")
            try:
                args = {"dockerfile": dockerfile, "tag": svc.image, "buildargs": spec.get("args")}
                if spec.get("target"):  # one Dockerfile, a stage per service
                    args["target"] = spec["target"]
                self._client.images.build(path=str(context), rm=True, forcerm=True, **args)
            except docker.errors.BuildError as exc:
                log = "".join(str(c.get("stream") or c.get("error") or "") for c in list(exc.build_log)[-30:])
                raise DockerStackError(f"building {svc.image} ({dockerfile}): {exc.msg}\n{log}") from None
            built.add(svc.image)

    def _run(self, svc: ServiceDef, raw: Mapping[str, Any]) -> None:
        import docker

        api = self._client.api
        kwargs: dict[str, Any] = {
            "name": f"{self.project}-{svc.name}-1",
            "command": svc.command or None,
            "environment": svc.environment,
            "labels": {LABEL: self.project, f"{LABEL}.service": svc.name},
            "network": self._network,
            "networking_config": {self._network: api.create_endpoint_config(aliases=[svc.name])},
            "privileged": bool(raw.get("privileged", False)),
            "detach": True,
        }
        kwargs.update(_healthcheck(raw), **self._mounts(svc.name, raw), **_gpus(raw))
        if raw.get("pid") == "host":
            kwargs["pid_mode"] = "host"
        if raw.get("ipc"):  # `ipc: host`: the host's /dev/shm (ZeroCopy, client system shm)
            kwargs["ipc_mode"] = raw["ipc"]
        if self.restart_policies and svc.restart != "no":
            kwargs["restart_policy"] = {"Name": svc.restart}
        if svc.name == "gateway":
            port = int(svc.environment.get("ANVIL_HTTP_PORT") or _container_port(raw["ports"][0]))
            kwargs["ports"] = {f"{port}/tcp": ("127.0.0.1", self.http_port)}
            grpc_port = int(svc.environment.get("ANVIL_GRPC_PORT") or 8001)
            if self.grpc_port is not None and grpc_port:
                kwargs["ports"][f"{grpc_port}/tcp"] = ("127.0.0.1", self.grpc_port)
        self.say(f"anvil: starting {svc.name} ({svc.image})")
        try:
            try:  # create, then secrets in, then start: what containers.run does, plus the secrets
                container = self._client.containers.create(svc.image, **kwargs)
            except docker.errors.ImageNotFound:
                self._client.images.pull(svc.image)
                container = self._client.containers.create(svc.image, **kwargs)
            self._containers[svc.name] = container
            if raw.get("secrets"):
                tar = secrets_tar(
                    svc.name, raw["secrets"], self._defined_secrets, self.env, self.compose.parent
                )
                container.put_archive("/run", tar)
            container.start()
        except docker.errors.DockerException as exc:
            raise DockerStackError(f"{svc.name}: could not start a container of {svc.image}: {exc}") from None

    def _mounts(self, service: str, raw: Mapping[str, Any]) -> dict[str, Any]:
        """Short-syntax `volumes`: a named volume (project-prefixed, created in start()) or a bind."""
        volumes: dict[str, dict[str, str]] = {}
        for entry in raw.get("volumes") or []:
            if not isinstance(entry, str):
                raise DockerStackError(f"{service}: only the short volume syntax is supported: {entry!r}")
            source, target, *mode = entry.split(":")
            if source.startswith("."):
                source = str(self.compose.parent / source)
            elif not source.startswith("/"):
                source = f"{self.project}_{source}"
            volumes[source] = {"bind": target, "mode": mode[0] if mode else "rw"}
        return {"volumes": volumes}

    def _logs(self, service: str) -> str:
        try:
            return bytes(self._containers[service].logs(tail=40)).decode(errors="replace")
        except Exception as exc:  # the logs only decorate an error that is already being raised
            return f"(no logs: {exc})"

    def _wait_healthy(self, service: str, deadline: float) -> None:
        container = self._containers[service]
        while True:
            container.reload()
            state = container.attrs["State"]
            health = (state.get("Health") or {}).get("Status")
            if state.get("Status") in ("exited", "dead"):
                code = state.get("ExitCode")
                raise DockerStackError(f"{service} exited with code {code}; its log:\n{self._logs(service)}")
            if state.get("Status") == "running" and health in (None, "healthy"):
                return
            if time.monotonic() > deadline:
                raise DockerStackError(
                    f"{service} not healthy in time ({health}); log:\n{self._logs(service)}"
                )
            time.sleep(0.5)

    def _wait_ready(self, deadline: float) -> None:
        url = f"{self.gateway_url}/v2/health/ready"
        while True:
            try:
                with urllib.request.urlopen(url, timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            if "gateway" in self._containers:
                self._wait_healthy("gateway", deadline)  # raises if it exited or the time is up
            if time.monotonic() > deadline:
                raise DockerStackError(f"{url} did not answer 200 within {self.ready_timeout_s:.0f} s")
            time.sleep(0.5)

    def kill(self, service: str) -> None:
        """SIGKILL the service's container (no graceful shutdown, no restart unless policies are on)."""
        self._containers[service].kill(signal="SIGKILL")

    def restart(self, service: str, timeout_s: float = 60.0) -> None:
        """Start the service's container again (killed or not) and wait until it is healthy."""
        self._containers[service].restart(timeout=10)
        self._wait_healthy(service, time.monotonic() + timeout_s)

    def stop(self) -> None:
        """Remove every container, the network and the volumes of this project."""
        if self._client is not None:
            self._teardown()
        self._containers.clear()

    def _teardown(self) -> None:
        """Remove what carries this project's label. Never raises (it also runs while a start-up
        error propagates): what cannot be removed is said."""
        import docker

        label = {"label": f"{LABEL}={self.project}"}
        try:
            containers = self._client.containers.list(all=True, filters=label)
            found = [
                *containers,
                *self._client.networks.list(filters=label),
                *self._client.volumes.list(filters=label),
            ]
        except docker.errors.DockerException as exc:
            self.say(f"anvil: could not list what {self.project} created: {exc}")
            return
        for obj in found:
            try:
                obj.remove() if isinstance(obj, docker.models.networks.Network) else obj.remove(force=True)
            except docker.errors.NotFound:
                pass
            except docker.errors.DockerException as exc:
                self.say(f"anvil: could not remove {obj!r}: {exc}")


COMPOSE_PROJECT_LABEL = "com.docker.compose.project"
COMPOSE_SERVICE_LABEL = "com.docker.compose.service"


def read_env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines of a compose env file (`anvil secrets --env-file`: values may be single-quoted)."""
    env: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        env[key.strip()] = value
    return env


class ComposeStack:
    """A stack that `docker compose up` started (project `project`), attached through the Docker SDK:
    what `make test-compose` runs the integration tests against (ANVIL_STACK=docker with
    ANVIL_COMPOSE_PROJECT set). It creates and removes nothing; compose owns the containers.

    `compose_env` is the project's env file (ports, secrets; not named `env`, which tests read as
    "a local stack's environment"); services are reached on their compose-network
    address from this host (a Linux bridge is routable from its host), the gateway and compiler also
    on their published ports. `kill(service)` is a SIGKILL; compose's `restart: unless-stopped`
    brings the container back."""

    def __init__(self, project: str, env: Mapping[str, str], say: Callable[[str], None] = print) -> None:
        self.project = project
        self.compose_env = dict(env)
        self.say = say
        self._client: Any = None
        self.engine = ""

    # ---- attach ------------------------------------------------------------------------------
    def start(self, timeout_s: float = 120.0) -> None:
        """Connect and wait until every service of the project runs and is healthy."""
        self._client = connect_engine({**os.environ, **self.compose_env})
        version = self._client.version()
        names = " ".join(str(c.get("Name", "")) for c in version.get("Components") or [])
        self.engine = "podman" if "podman" in names.lower() else "docker"
        deadline = time.monotonic() + timeout_s
        services = self.services()
        if not {"gateway", "scheduler", "redis"} <= set(services):
            raise DockerStackError(f"compose project {self.project!r} has services {sorted(services)}")
        for name in services:
            self.wait_healthy(name, deadline)

    def services(self) -> list[str]:
        found = self._client.containers.list(
            all=True, filters={"label": f"{COMPOSE_PROJECT_LABEL}={self.project}"}
        )
        return sorted({c.labels.get(COMPOSE_SERVICE_LABEL, "") for c in found} - {""})

    def container(self, service: str) -> Any:
        found = self._client.containers.list(
            all=True,
            filters={
                "label": [f"{COMPOSE_PROJECT_LABEL}={self.project}", f"{COMPOSE_SERVICE_LABEL}={service}"]
            },
        )
        if len(found) != 1:
            raise DockerStackError(f"{self.project}: {len(found)} containers of service {service!r}")
        return found[0]

    # ---- addresses ---------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.compose_env.get('ANVIL_HTTP_PORT', '8000')}"

    gateway_url = url

    @property
    def grpc_target(self) -> str | None:
        """host:port of the gateway's published KServe v2 gRPC port (None: ANVIL_GRPC_PORT=0)."""
        port = self.compose_env.get("ANVIL_GRPC_PORT", "8001")
        return None if port == "0" else f"127.0.0.1:{port}"

    @property
    def compiler_url(self) -> str:
        return f"http://127.0.0.1:{self.compose_env.get('ANVIL_COMPILER_PORT', '8010')}"

    def address(self, service: str) -> str:
        """The service container's address on the project's network."""
        networks = self.container(service).attrs["NetworkSettings"]["Networks"]
        for name, net in networks.items():
            if name.startswith(f"{self.project}_") and net.get("IPAddress"):
                return str(net["IPAddress"])
        raise DockerStackError(f"{service}: no address on {self.project}'s network ({sorted(networks)})")

    def service_env(self, service: str) -> dict[str, str]:
        """The container's environment (Config.Env)."""
        pairs = self.container(service).attrs["Config"]["Env"] or []
        return dict(p.split("=", 1) for p in pairs if "=" in p)

    def metrics(self, service: str) -> str:
        """The service's Prometheus text, fetched from its container's address."""
        port = self.service_env(service)["ANVIL_METRICS_PORT"]
        with urllib.request.urlopen(f"http://{self.address(service)}:{port}/metrics", timeout=5) as r:
            return bytes(r.read()).decode()

    def exec(self, service: str, argv: list[str], user: str = "") -> tuple[int, str]:
        """Run argv in the service's container; (exit code, stdout+stderr)."""
        code, out = self._client.containers.get(self.container(service).id).exec_run(argv, user=user)
        return int(code), bytes(out or b"").decode(errors="replace")

    def put_file(self, service: str, path: str, data: bytes, uid: int = 10001) -> None:
        """Write one file (0600, owned by uid) into the service's container."""
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            info = tarfile.TarInfo(os.path.basename(path))
            info.size, info.uid, info.gid, info.mode = len(data), uid, uid, 0o600
            tar.addfile(info, io.BytesIO(data))
        self.container(service).put_archive(os.path.dirname(path), buf.getvalue())

    @property
    def redis_password(self) -> str:
        return self.compose_env["ANVIL_SECRET_REDIS_PASSWORD"]

    # ---- state -------------------------------------------------------------------------------
    def state(self, service: str) -> dict[str, Any]:
        """Status, Health, Pid, RestartCount and StartedAt of the service's container."""
        attrs = self.container(service).attrs
        st = attrs["State"]
        health = st.get("Health") or st.get("Healthcheck") or {}
        return {
            "status": st.get("Status"),
            "health": health.get("Status"),
            "pid": int(st.get("Pid") or 0),
            "restarts": int(attrs.get("RestartCount") or 0),
            "started": st.get("StartedAt"),
        }

    def wait_healthy(self, service: str, deadline: float) -> None:
        while True:
            st = self.state(service)
            if st["status"] == "running" and st["health"] in (None, "", "healthy"):
                return
            if time.monotonic() > deadline:
                logs = bytes(self.container(service).logs(tail=30)).decode(errors="replace")
                raise DockerStackError(f"{service} not healthy in time ({st}); log:\n{logs}")
            time.sleep(0.5)

    def kill(self, service: str) -> str:
        """SIGKILL the service's main process; says how. Docker: `docker kill` (the API's kill),
        which `restart: unless-stopped` answers with a restart. podman 4 counts its own kill as a
        stop by the user and does not restart such a container, so there the container's process
        is killed from this host (as the kernel's OOM killer or a crash would) by its pid."""
        if self.engine == "docker":
            self.container(service).kill(signal="SIGKILL")
            return "docker kill (Engine API)"
        pid = self.state(service)["pid"]
        if pid <= 0:
            raise DockerStackError(f"{service} has no process to kill ({self.state(service)})")
        os.kill(pid, 9)
        return f"kill -9 {pid} (the container's process, from the host: podman)"

    def stop(self) -> None:
        """Nothing to remove (compose owns the containers); closes the client."""
        if self._client is not None:
            self._client.close()
            self._client = None
