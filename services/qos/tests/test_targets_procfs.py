"""Registry records -> probed PIDs (including containers' namespace PIDs), the Redis formats, and the
/proc observer (which needs no privileges, so it runs everywhere)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from anvil_qos.procfs import ProcfsObserver, read_tcp
from anvil_qos.rates import parse_bases, parse_key, parse_slo
from anvil_qos.targets import Target, parse_explicit, resolve


def _fake_proc(root: Path, pid: int, cmd: str, nspid: str, hostname: str = "") -> None:
    d = root / str(pid)
    (d / "root/etc").mkdir(parents=True)
    (d / "cmdline").write_bytes(cmd.replace(" ", "\0").encode())
    (d / "status").write_text(f"Name:\tpython\nNSpid:\t{nspid}\n")
    (d / "root/etc/hostname").write_text(hostname + "\n")


def test_resolve_same_namespace_and_container_pids(tmp_path: Path) -> None:
    _fake_proc(tmp_path, 300, "python -m anvil_gateway", "300")  # make up: same namespace
    _fake_proc(tmp_path, 7001, "python -m anvil_executor", "7001 1", "exec-a")  # two containers, pid 1
    _fake_proc(tmp_path, 7002, "python -m anvil_executor", "7002 1", "exec-b")
    _fake_proc(tmp_path, 1, "/sbin/init", "1")
    records = [
        {"kind": "gateway", "id": "g", "pid": "300", "host": "h", "http_port": "8000"},
        {"kind": "executor", "id": "b", "pid": "1", "host": "exec-b"},
        {"kind": "executor", "id": "c", "pid": "1", "host": "elsewhere"},
        {"kind": "scheduler", "id": "s", "host": "h"},
    ]
    cache: dict[tuple[str, ...], Target] = {}
    targets, problems = resolve(records, tmp_path, cache)
    assert targets == [Target("executor", "b", 7002), Target("gateway", "g", 300, 8000)]
    assert any("executor:c" in p and "no local process" in p for p in problems)
    assert any("scheduler:s has no pid" in p for p in problems)
    assert resolve(records, tmp_path, cache)[0] == targets  # from the cache, re-checked
    (tmp_path / "7002/cmdline").write_bytes(b"sleep\x00100")  # the pid now runs something else
    assert resolve(records, tmp_path, cache)[0] == [Target("gateway", "g", 300, 8000)]


def test_explicit_targets() -> None:
    assert parse_explicit("executor=12, gateway=34:8000") == [
        Target("executor", "pid-12", 12),
        Target("gateway", "pid-34", 34, 8000),
    ]
    with pytest.raises(ValueError, match="kind=pid"):
        parse_explicit("executor")


def test_redis_formats_are_validated_at_the_edge() -> None:
    bases, errors = parse_bases(
        {"acme:3": {"rate_rps": 10, "burst": 5}, "old:2": {"rate_rps": 1}},
        {"acme:3": '{"rate_rps": 20, "burst": 4}', "bad:9": '{"rate_rps": 1}', "neg:2": '{"rate_rps": -1}'},
    )
    assert bases["acme:3"].rate_rps == 20 and bases["acme:3"].burst == 4  # Redis overrides settings
    assert bases["old:2"].burst == 1
    assert sorted(e.split("'")[1] for e in errors) == ["bad:9", "neg:2"]
    assert parse_key("team:a:*") == ("team:a", None)
    slo = parse_slo(
        {"1": '{"attainment": 0.97, "p99_ms": 31, "requests": 40, "window_s": 10, "ts": 5}', "2": "x"}
    )
    assert list(slo) == [1] and slo[1].attainment == 0.97 and slo[1].slo_ms is None


def test_procfs_observer_reads_schedstat_and_tcp(spawn, sleeper) -> None:
    import socket

    target = sleeper()
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    port = srv.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    obs = ProcfsObserver("test")
    obs.set_targets([Target("executor", "s", target.pid), Target("gateway", "me", os.getpid(), port)], [])
    obs.sample()
    time.sleep(0.5)
    sample = obs.sample()
    assert sample.mode == "procfs" and any("GPU probe off" in n for n in sample.notes)
    by_pid = {p.target.pid: p for p in sample.processes}
    assert by_pid[target.pid].runq_events > 100 and by_pid[target.pid].runq_hist is None
    assert by_pid[target.pid].cpu_ns > 0
    (tcp,) = sample.tcp
    assert tcp.states == {"LISTEN": 1, "ESTABLISHED": 1} and tcp.retransmits_scope == "netns"
    assert read_tcp(port, os.getpid()).states == tcp.states
    client.close()
    srv.close()
