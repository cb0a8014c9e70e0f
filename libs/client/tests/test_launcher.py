"""The launcher's plan on a GPU host: one executor per GPU, chosen by ANVIL_GPUS.

A fake `nvidia-smi` on PATH stands in for the driver; nothing is started (`plan_procs`).
"""

from __future__ import annotations

import stat
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from anvil_client import launcher
from anvil_client.gpus import executors_per_gpu, visible_gpus
from anvil_client.launcher import Proc, Stack, StackError, default_profiles, plan_procs

ROOT = Path(__file__).resolve().parents[3]
COMPOSE = ROOT / "compose.yaml"


def _fake_smi(tmp_path: Path, gpus: int, code: int = 0) -> Path:
    """A directory holding an `nvidia-smi` that lists `gpus` H200s for `-L` (exits `code`)."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    lines = "".join(
        f'echo "GPU {i}: NVIDIA H200 (UUID: GPU-{i:08d}-0000-0000-0000-000000000000)"\n' for i in range(gpus)
    )
    smi = bindir / "nvidia-smi"
    smi.write_text(f'#!/bin/sh\n[ "$1" = "-L" ] || exit 2\n{lines}exit {code}\n')
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    return bindir


def _env(bindir: Path | None, **extra: str) -> dict[str, str]:
    """One executor per GPU unless a test says otherwise (the default, `auto`, follows the host's cores)."""
    path = f"{bindir}:/usr/bin:/bin" if bindir else "/usr/bin:/bin"
    return {"PATH": path, "ANVIL_REDIS_URL": "redis://127.0.0.1:1/0", "ANVIL_EXECUTORS_PER_GPU": "1", **extra}


def _plan(env: dict[str, str], tmp_path: Path, profiles: set[str] | None = None, **kw: Any) -> list[Proc]:
    said: list[str] = kw.pop("said", [])
    return plan_procs(COMPOSE, env, profiles or default_profiles(env), kw, tmp_path / "run", said.append)


def _gpu_procs(procs: list[Proc]) -> list[Proc]:
    return [p for p in procs if p.service.per_gpu]


def test_two_gpus_get_one_executor_each(tmp_path: Path) -> None:
    env = _env(_fake_smi(tmp_path, 2))
    said: list[str] = []
    assert default_profiles(env) == {"gpu"}
    procs = _plan(env, tmp_path, said=said)
    gpu = _gpu_procs(procs)
    assert [p.name for p in gpu] == ["executor-gpu0", "executor-gpu1"]
    assert [p.device for p in gpu] == ["cuda:0", "cuda:1"]
    assert [p.env["ANVIL_METRICS_PORT"] for p in gpu] == ["8004", "8104"]
    ids = [p.env["ANVIL_SERVICE_ID"] for p in gpu]
    assert len(set(ids)) == 2 and "executor-gpu0-" in ids[0] and "executor-gpu1-" in ids[1]
    assert not [p for p in procs if p.name == "executor"]  # no CPU executor beside them
    ports = [p.env["ANVIL_METRICS_PORT"] for p in procs]
    assert len(ports) == len(set(ports))  # clear of the compiler's 8005 and everyone else's
    assert any("GPUs visible: 2 (nvidia-smi -L)" in s and "cuda:0, cuda:1" in s for s in said)


def test_executors_per_gpu_share_each_gpu(tmp_path: Path) -> None:
    """ANVIL_EXECUTORS_PER_GPU=2 on two GPUs: two executor processes on each, own ports and ids."""
    said: list[str] = []
    procs = _plan(_env(_fake_smi(tmp_path, 2), ANVIL_EXECUTORS_PER_GPU="2"), tmp_path, said=said)
    gpu = _gpu_procs(procs)
    assert [p.name for p in gpu] == ["executor-gpu0", "executor-gpu0.1", "executor-gpu1", "executor-gpu1.1"]
    assert [p.device for p in gpu] == ["cuda:0", "cuda:0", "cuda:1", "cuda:1"]
    assert [p.env["ANVIL_METRICS_PORT"] for p in gpu] == ["8004", "8104", "8204", "8304"]
    assert len({p.env["ANVIL_SERVICE_ID"] for p in gpu}) == 4
    ports = [p.env["ANVIL_METRICS_PORT"] for p in procs]
    assert len(ports) == len(set(ports))
    assert any("2 executors on each of cuda:0, cuda:1" in s for s in said)


@pytest.mark.parametrize("spec", ["0", "9", "two", "-1", "1.5", "AUTO"])
def test_bad_executors_per_gpu_is_refused(tmp_path: Path, spec: str) -> None:
    env = _env(_fake_smi(tmp_path, 1), ANVIL_EXECUTORS_PER_GPU=spec)
    want = r"ANVIL_EXECUTORS_PER_GPU=.*expected `auto` or a whole number from 1 to 8"
    with pytest.raises(StackError, match=want):
        _plan(env, tmp_path)


@pytest.mark.parametrize(("cpus", "want"), [(1, 1), (2, 1), (7, 1), (8, 2), (12, 3), (16, 4), (128, 4)])
def test_auto_executors_per_gpu_follow_the_cores(cpus: int, want: int) -> None:
    """`auto` (and unset): one executor per 4 cores, 1 to 4 (4 was the best measured on the H200 host)."""
    assert executors_per_gpu("auto", cpus=cpus) == want
    assert executors_per_gpu(None, cpus=cpus) == want
    assert executors_per_gpu(" ", cpus=cpus) == want


def test_unset_executors_per_gpu_plans_the_auto_count(tmp_path: Path) -> None:
    env = _env(_fake_smi(tmp_path, 1))
    del env["ANVIL_EXECUTORS_PER_GPU"]
    said: list[str] = []
    gpu = _gpu_procs(_plan(env, tmp_path, said=said))
    n = executors_per_gpu(None)
    assert [p.device for p in gpu] == ["cuda:0"] * n
    assert len({p.env["ANVIL_METRICS_PORT"] for p in gpu}) == n


def test_container_copies_are_not_run_twice(tmp_path: Path) -> None:
    """`gpu-x2` adds the containers' executor-gpu1; the launcher still runs one per GPU."""
    env = _env(_fake_smi(tmp_path, 2))
    gpu = _gpu_procs(_plan(env, tmp_path, {"gpu", "gpu-x2"}))
    assert [p.device for p in gpu] == ["cuda:0", "cuda:1"]


@pytest.mark.parametrize(
    ("spec", "want"), [("1", ["cuda:1"]), ("all", ["cuda:0", "cuda:1"]), (" 1, 0 ", ["cuda:0", "cuda:1"])]
)
def test_anvil_gpus_chooses(tmp_path: Path, spec: str, want: list[str]) -> None:
    env = _env(_fake_smi(tmp_path, 2), ANVIL_GPUS=spec)
    gpu = _gpu_procs(_plan(env, tmp_path))
    assert [p.device for p in gpu] == want
    if spec == "1":
        assert gpu[0].name == "executor-gpu1" and gpu[0].env["ANVIL_METRICS_PORT"] == "8104"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("2", r"GPU 2 is not visible \(indices 0..1; nvidia-smi -L\)"),
        ("0,0", "GPU 0 is listed twice"),
        ("cuda:1", r"expected 'all' or comma-separated GPU indices such as '0,1'.*'cuda:1' is not an index"),
        ("0;1", "'0;1' is not an index"),
        ("-1", "'-1' is not an index"),
        ("0,", "'' is not an index"),
    ],
)
def test_bad_anvil_gpus_is_refused(tmp_path: Path, spec: str, message: str) -> None:
    env = _env(_fake_smi(tmp_path, 2), ANVIL_GPUS=spec)
    with pytest.raises(StackError, match=message):
        _plan(env, tmp_path)


def test_cuda_visible_devices_is_what_the_executors_see(tmp_path: Path) -> None:
    """CUDA renumbers the listed devices from 0 in every process that inherits the variable."""
    bindir = _fake_smi(tmp_path, 4)
    gpu = _gpu_procs(_plan(_env(bindir, CUDA_VISIBLE_DEVICES="2,3"), tmp_path))
    assert [p.device for p in gpu] == ["cuda:0", "cuda:1"]
    assert all(p.env["CUDA_VISIBLE_DEVICES"] == "2,3" for p in gpu)
    with pytest.raises(StackError, match=r"GPU 1 is not visible \(indices 0..0; CUDA_VISIBLE_DEVICES='3'\)"):
        _plan(_env(bindir, CUDA_VISIBLE_DEVICES="3", ANVIL_GPUS="1"), tmp_path)
    with pytest.raises(StackError, match=r"no GPU to start executors on \(visible GPUs: none"):
        _plan(_env(bindir, CUDA_VISIBLE_DEVICES=""), tmp_path)


def test_no_gpu_keeps_the_cpu_profile(tmp_path: Path) -> None:
    for env in (_env(None), _env(_fake_smi(tmp_path, 0)), _env(_fake_smi(tmp_path, 2, code=9))):
        assert default_profiles(env) == {"cpu"}
        said: list[str] = []
        procs = _plan({**env, "ANVIL_GPUS": "0"}, tmp_path, said=said)
        assert [(p.name, p.device) for p in procs if p.device] == [("executor", "cpu")]
        assert not _gpu_procs(procs)
        assert "ANVIL_SERVICE_ID" not in procs[0].env  # only GPU executors get a named id
        assert any("ANVIL_GPUS='0' ignored" in s for s in said)


def test_gpu_profile_without_a_visible_gpu_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(StackError, match="ANVIL_GPUS=0,1 or run the CPU stack with ANVIL_PROFILES=cpu"):
        _plan(_env(None), tmp_path, {"gpu"})
    # Explicit indices are trusted where nothing can be asked (GPUs without nvidia-smi).
    gpu = _gpu_procs(_plan(_env(None, ANVIL_GPUS="0,1"), tmp_path, {"gpu"}))
    assert [p.device for p in gpu] == ["cuda:0", "cuda:1"]


def test_scale_and_port_clashes_are_refused(tmp_path: Path) -> None:
    env = _env(_fake_smi(tmp_path, 2))
    with pytest.raises(StackError, match="one per GPU; choose the GPUs with ANVIL_GPUS"):
        _plan(env, tmp_path, **{"executor-gpu0": 2})
    with pytest.raises(StackError, match="executor and executor-gpu0 would both serve metrics on port 8004"):
        _plan(env, tmp_path, {"cpu", "gpu"})


def test_per_gpu_copies_must_agree(tmp_path: Path) -> None:
    text = COMPOSE.read_text().replace(
        "    environment: *executor-gpu-env\n",
        "    environment:\n      <<: *executor-gpu-env\n      ANVIL_MODELS: mlp\n",
    )
    compose = tmp_path / "compose.yaml"
    compose.write_text(text)
    env = _env(_fake_smi(tmp_path, 2))
    with pytest.raises(
        StackError,
        match="executor-gpu1 and executor-gpu0 are both x-anvil-per-gpu but differ in ANVIL_MODELS",
    ):
        plan_procs(compose, env, {"gpu", "gpu-x2"}, {}, tmp_path / "run", lambda _: None)


def test_start_messages_name_the_device_and_a_restart_gets_a_new_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = _env(_fake_smi(tmp_path, 2))
    proc = _gpu_procs(_plan(env, tmp_path))[1]
    said: list[str] = []
    stack = Stack(COMPOSE, env=env, say=said.append)
    monkeypatch.setattr(launcher, "spawn", lambda argv, env, log: SimpleNamespace(pid=4242))
    first = proc.env["ANVIL_SERVICE_ID"]
    stack._spawn(proc)
    assert proc.env["ANVIL_SERVICE_ID"] == first
    assert said[-1].startswith("anvil: started executor-gpu1 on cuda:1 (pid 4242)")
    stack._spawn(proc)  # what _maybe_restart does
    again = proc.env["ANVIL_SERVICE_ID"]
    assert again != first and again.rsplit("-", 1)[0] == first.rsplit("-", 1)[0]


@pytest.mark.parametrize(
    ("value", "count"),
    [("0,1", 2), ("GPU-8a3e,MIG-77c1", 2), ("1,-1,0", 1), ("", 0), ("-1", 0), ("NoDevFiles", 0)],
)
def test_cuda_visible_devices_count(value: str, count: int) -> None:
    """CUDA exposes the entries up to the first invalid one."""
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": value, "PATH": ""}).count == count


def test_compose_http_healthchecks_run_in_process_with_the_same_answer() -> None:
    """Every `python -c` urlopen healthcheck of compose.yaml is one the launcher runs itself (no
    Python process per check), against the same URL and timeout; it passes when a server answers
    and fails on an error status or where none listens, as the command would."""
    import http.server
    import socket
    import threading

    from anvil_client.compose_file import load_services

    root = Path(__file__).resolve().parents[3]
    services = load_services(root / "compose.yaml", {}, {"cpu", "gpu", "cli"})
    checks = [s.healthcheck for s in services.values() if s.healthcheck and s.healthcheck[0] == "python"]
    assert checks, "compose.yaml has no python healthchecks any more: drop url_check"
    for argv in checks:
        url, timeout = launcher.url_check(argv, {_port_var(argv): "8123"}) or ("", 0.0)
        assert url.startswith("http://127.0.0.1:8123/") and timeout > 0, argv
        assert launcher.url_check(argv, {}) is None  # the port variable unset: the command decides
    assert launcher.url_check(["python", "-c", "import os; os.system('true')"], {}) is None

    class Metrics(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/metrics" else 503)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    metrics = next(a for a in checks if "/metrics" in a[2])
    other = next(a for a in checks if "/metrics" not in a[2])
    server = http.server.HTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert launcher._check(_proc(metrics, server.server_port))
        assert not launcher._check(_proc(other, server.server_port))  # 503: urlopen raises
    finally:
        server.shutdown()
        server.server_close()
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        free = sock.getsockname()[1]
    assert not launcher._check(_proc(metrics, free))


def _port_var(argv: list[str]) -> str:
    return argv[2].split("environ['")[1].split("'")[0]


def _proc(check: list[str], port: int) -> Any:
    return SimpleNamespace(service=SimpleNamespace(healthcheck=check), env={_port_var(check): str(port)})
