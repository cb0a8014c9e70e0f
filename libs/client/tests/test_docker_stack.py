"""DockerStack says plainly when no engine is reachable; its compose translation is right offline."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from anvil_client.compose_file import ServiceDef, interpolate, load_services
from anvil_client.docker_stack import (
    DockerStack,
    DockerStackError,
    DockerUnavailable,
    _container_port,
    _duration_ns,
    _healthcheck,
    _ordered,
)

ROOT = Path(__file__).resolve().parents[3]


def test_unreachable_engine_raises_docker_unavailable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("docker", reason="the docker SDK is in the root dev group")
    socket = tmp_path / "no-such-dir" / "docker.sock"
    monkeypatch.setenv("DOCKER_HOST", f"unix://{socket}")
    stack = DockerStack(ROOT / "compose.yaml", "anvil-test", {"DOCKER_HOST": f"unix://{socket}"}, 18000)
    with pytest.raises(DockerUnavailable) as info:
        stack.start()
    message = str(info.value)
    assert f"DOCKER_HOST=unix://{socket}" in message  # names what was tried
    assert "no Docker engine reachable" in message
    stack.stop()  # nothing was created; stop() is still safe


def test_duration_and_port_parsing() -> None:
    assert _duration_ns("5s") == 5 * 10**9
    assert _duration_ns("1m30s") == 90 * 10**9
    assert _duration_ns("500ms") == 500 * 10**6
    with pytest.raises(DockerStackError):
        _duration_ns("5 seconds")
    assert _container_port("8000:8000") == 8000
    assert _container_port("127.0.0.1:18000:8000/tcp") == 8000
    assert _container_port({"target": 8002, "published": 9002}) == 8002


def test_healthcheck_translation() -> None:
    raw = {
        "healthcheck": {
            "test": ["CMD", "redis-cli", "ping"],
            "interval": "2s",
            "timeout": "2s",
            "retries": 15,
        }
    }
    assert _healthcheck(raw) == {
        "healthcheck": {
            "test": ["CMD", "redis-cli", "ping"],
            "retries": 15,
            "interval": 2 * 10**9,
            "timeout": 2 * 10**9,
        }
    }
    assert _healthcheck({}) == {}


def _svc(name: str, *deps: str) -> ServiceDef:
    return ServiceDef(name=name, command=[], environment={}, depends_on=deps)


def test_dependency_order_and_cycles() -> None:
    services = {
        s.name: s for s in (_svc("gateway", "redis"), _svc("redis"), _svc("executor", "redis", "gpu"))
    }
    order = [s.name for s in _ordered(services)]
    assert order[0] == "redis"  # `gpu` is outside the enabled profiles: ignored, as compose does
    with pytest.raises(DockerStackError, match="cycle"):
        _ordered({"a": _svc("a", "b"), "b": _svc("b", "a")})


@pytest.mark.parametrize("profiles", [{"cpu"}, {"gpu", "gpu-x2"}])
def test_container_requests_for_the_real_compose_file(profiles: set[str]) -> None:
    """Every container DockerStack would run, passed through docker-py's own run() -> create()
    translation up to the request body (no engine needed when the API version is given)."""
    docker = pytest.importorskip("docker")
    if not hasattr(docker.models.containers, "_create_container_args"):
        pytest.skip("this docker-py has no _create_container_args to translate run() options with")
    create_args = docker.models.containers._create_container_args
    api = docker.APIClient(base_url="unix:///nonexistent/docker.sock", version="1.44")
    bodies: dict[str, dict[str, Any]] = {}
    api.create_container_from_config = lambda config, name, platform=None: bodies.setdefault(name, config)

    archives: dict[str, dict[str, tarfile.TarInfo]] = {}

    class Containers:
        def create(self, image: str, command: Any = None, **kwargs: Any) -> Any:
            api.create_container(
                **create_args({**kwargs, "image": image, "command": command, "version": "1.44"})
            )

            def put_archive(path: str, data: bytes) -> None:
                assert path == "/run"
                with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                    archives[kwargs["name"]] = {m.name: m for m in tar.getmembers() if m.isfile()}

            return SimpleNamespace(put_archive=put_archive, start=lambda: None)

    stack = DockerStack(ROOT / "compose.yaml", "t", {}, 18000, profiles=profiles, say=lambda _: None)
    stack._client = SimpleNamespace(api=api, containers=Containers())
    raw = interpolate(yaml.safe_load((ROOT / "compose.yaml").read_text())["services"], stack.env)
    for svc in _ordered(load_services(stack.compose, stack.env, profiles)):
        stack._run(svc, raw[svc.name])

    gateway = bodies["t-gateway-1"]
    assert gateway["NetworkingConfig"]["EndpointsConfig"]["t_default"]["Aliases"] == ["gateway"]
    port = stack.env.get("ANVIL_HTTP_PORT") or "8000"  # ${ANVIL_HTTP_PORT:-8000}
    assert gateway["HostConfig"]["PortBindings"] == {
        f"{port}/tcp": [{"HostIp": "127.0.0.1", "HostPort": "18000"}]
    }
    assert bodies["t-redis-1"]["Healthcheck"]["Interval"] == 2 * 10**9
    published = [n for n, b in bodies.items() if b["HostConfig"].get("PortBindings")]
    assert published == ["t-gateway-1"]  # nothing else claims a host port
    assert all("RestartPolicy" not in b["HostConfig"] for b in bodies.values())
    # secrets (issue #18): each container gets its own, 0400 for the services' user, and no other's
    secrets = {name: sorted(files) for name, files in archives.items()}
    assert secrets["t-gateway-1"] == ["secrets/gateway.key_secret", "secrets/gateway.redis_password"]
    assert secrets["t-scheduler-1"] == ["secrets/scheduler.key_secret", "secrets/scheduler.redis_password"]
    assert secrets["t-redis-1"] == ["secrets/redis.acl"]
    key = archives["t-gateway-1"]["secrets/gateway.key_secret"]
    assert (key.uid, key.mode, key.size) == (10001, 0o400, 64)
    if "gpu-x2" in profiles:
        request = bodies["t-executor-gpu1-1"]["HostConfig"]["DeviceRequests"][0]
        assert (request["Driver"], request["DeviceIDs"]) == ("nvidia", ["1"])
    else:
        assert "t-executor-1" in bodies and bodies["t-qos-1"]["HostConfig"]["Privileged"] is True
