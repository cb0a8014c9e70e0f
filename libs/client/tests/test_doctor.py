"""`anvil doctor`'s checks against a fake host: each says ok / missing / off and the fix."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from anvil_client import doctor
from anvil_client.cli import main


@dataclass
class FakeHost:
    uid: int = 0
    paths: set[str] = field(default_factory=set)
    files: dict[str, str] = field(default_factory=dict)
    environ: dict[str, str] = field(default_factory=dict)
    modules: dict[str, str | None] = field(default_factory=dict)  # module -> None (imports) or why not
    calls: dict[str, Any] = field(default_factory=dict)
    shm: int | None = 8 << 30
    memlock: int = -1
    busy: set[int] = field(default_factory=set)
    redis_error: str | None = None
    libs: dict[str, str] = field(default_factory=dict)

    def euid(self) -> int:
        return self.uid

    def exists(self, path: str) -> bool:
        return path in self.paths

    def read(self, path: str) -> str | None:
        return self.files.get(path)

    def env(self, name: str) -> str | None:
        return self.environ.get(name)

    def release(self) -> str:
        return "6.18.44-fc"

    def can_import(self, module: str, extra_path: str | None = None) -> str | None:
        return self.modules.get(module, f"No module named {module!r}")

    def call(self, module: str, fn: str) -> Any:
        return self.calls.get(f"{module}.{fn}")

    def disk_bytes(self, path: str) -> int | None:
        return self.shm

    def memlock_bytes(self) -> int:
        return self.memlock

    def port_free(self, port: int) -> bool:
        return port not in self.busy

    def redis_ping(self, url: str) -> str | None:
        return self.redis_error

    def find_library(self, name: str) -> str | None:
        return self.libs.get(name)


READY = FakeHost(
    paths={"/sys/kernel/debug/tracing/events", "/sys/kernel/btf/vmlinux", "/kh/merged/include"},
    files={doctor.BCC_SOURCE_FILE: "/kh/merged\n", "/proc/driver/nvidia/version": "NVRM version: 580\n"},
    modules={"bcc": None, "cupy": None},
    calls={"cupy.is_available": True},
)


def by_name(host: FakeHost) -> dict[str, doctor.Check]:
    return {c.name: c for c in doctor.run_checks(host)}


def test_a_prepared_gpu_host_is_all_ok() -> None:
    checks = by_name(READY)
    assert {c.status for c in checks.values()} == {"ok"}, [
        c.line() for c in checks.values() if c.status != "ok"
    ]
    assert "/kh/merged" in checks["kernel headers"].detail


def test_a_fresh_unprivileged_host_says_what_is_missing_and_how_to_fix_it() -> None:
    fresh = FakeHost(uid=1000, memlock=8 << 20, shm=64 << 20, busy={8000}, redis_error="refused")
    checks = by_name(fresh)
    assert checks["root"].status == "missing" and "/proc" in checks["root"].detail
    assert checks["tracefs"].status == "missing" and "mount -t debugfs" in checks["tracefs"].fix
    assert checks["kernel headers"].status == "missing" and "prepare_ebpf.sh" in checks["kernel headers"].fix
    assert checks["bcc"].status == "missing" and "python3-bpfcc" in checks["bcc"].fix
    assert checks["memlock"].status == "missing" and "ulimit -l" in checks["memlock"].fix
    assert checks["/dev/shm"].status == "missing" and "64 MiB" in checks["/dev/shm"].detail
    assert checks["port 8000"].status == "missing" and checks["port 8002"].status == "ok"
    # Optional capabilities are "off", never "missing": a CPU host is a valid host.
    assert checks["GPU driver"].status == "off" and checks["CuPy"].status == "off"
    assert checks["redis"].status == "off" and "embedded" in checks["redis"].detail
    assert checks["BTF"].status == "off"


def test_explicit_headers_win_and_are_checked() -> None:
    host = FakeHost(environ={"BCC_KERNEL_SOURCE": "/nowhere"}, paths={"/kh/merged/include"})
    host.files[doctor.BCC_SOURCE_FILE] = "/kh/merged"
    check = doctor.check_headers(host)  # qos's loader uses the variable alone when it is set
    assert check.status == "missing" and "BCC_KERNEL_SOURCE=/nowhere" in check.detail
    host.environ.clear()
    assert doctor.check_headers(host).status == "ok"


def test_cupy_without_a_device_is_off_with_the_reason() -> None:
    host = FakeHost(modules={"cupy": None}, calls={"cupy.is_available": False})
    check = doctor.check_cupy(host)
    assert check.status == "off" and "is_available() -> False" in check.detail


def test_exit_code_is_zero_unless_strict(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    fresh = FakeHost(uid=1000)
    monkeypatch.setattr(doctor, "RealHost", lambda: fresh)
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "[missing] qos      root" in out and "fix: run qos as root" in out
    assert main(["doctor", "--strict"]) == 1
    monkeypatch.setattr(doctor, "RealHost", lambda: READY)
    assert main(["doctor", "--strict"]) == 0
