"""`anvil doctor`: what this host offers each Anvil service, item by item, and the command that fixes
what is missing.

Each check is a function of a `Host` (the few system calls it needs), so tests run them against fakes.
A check says `ok`, `missing` (a service loses something it needs: qos falls back to /proc, ZeroCopy
has no room, a port is taken) or `off` (an optional capability this host does not have, e.g. no GPU:
the CPU executor serves). `anvil doctor` prints every item and exits 0; with `--strict` it exits 1
when any item is `missing` (CI gates on it).

The default ports are the services' documented defaults (each service's settings; ANVIL_* overrides
them): a client library does not import the services.
"""

from __future__ import annotations

import argparse
import ctypes.util
import importlib
import os
import resource
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from anvil_client import launcher
from anvil_core.settings import redact_url

__all__ = ["CHECKS", "Check", "Host", "add_doctor_command", "run_checks"]

BCC_DIST_PACKAGES = "/usr/lib/python3/dist-packages"  # Debian's python3-bpfcc
BCC_SOURCE_FILE = "/var/tmp/anvil-bcc-kernel-source"  # written by .ci/prepare_ebpf.sh
SHM_MIN_BYTES = 1 << 30  # ZeroCopy regions live in /dev/shm: 1 GiB holds a few 64 MiB tenant regions
MEMLOCK_MIN_BYTES = 64 << 20  # bcc's maps on kernels that still charge BPF memory to RLIMIT_MEMLOCK
DEFAULT_PORTS = {  # port -> who listens there by default
    8000: "gateway HTTP",
    8001: "gateway gRPC",
    8002: "gateway metrics",
    5555: "scheduler (gateways)",
    5556: "scheduler (executors)",
    8003: "scheduler metrics",
    8004: "executor metrics",
    8005: "compiler metrics",
    8010: "compiler HTTP",
    8006: "qos metrics",
}
PREPARE_EBPF = "sudo .ci/prepare_ebpf.sh"


@dataclass(frozen=True)
class Check:
    name: str  # "tracefs", "port 8000", ...
    service: str  # who needs it: qos, gateway, executor, stack
    status: str  # "ok" | "missing" | "off"
    detail: str  # what was found, or what is missing
    fix: str = ""  # the command (or step) that fixes it; empty when ok

    def line(self) -> str:
        text = f"[{self.status:<7}] {self.service:<8} {self.name:<16} {self.detail}"
        return text + (f"\n{'':29}fix: {self.fix}" if self.fix and self.status != "ok" else "")


class Host(Protocol):
    """The system calls the checks make (a fake in tests)."""

    def euid(self) -> int: ...
    def exists(self, path: str) -> bool: ...
    def read(self, path: str) -> str | None: ...
    def env(self, name: str) -> str | None: ...
    def release(self) -> str: ...
    def can_import(self, module: str, extra_path: str | None = None) -> str | None:
        """None when `module` imports (after appending extra_path to sys.path if needed), else why."""

    def call(self, module: str, fn: str) -> Any:
        """module.fn() or the exception it raised."""

    def disk_bytes(self, path: str) -> int | None:
        """Size of the file system at path, None if absent."""

    def memlock_bytes(self) -> int:
        """Soft RLIMIT_MEMLOCK (-1: unlimited)."""

    def port_free(self, port: int) -> bool: ...
    def redis_ping(self, url: str) -> str | None:
        """None when url answers PING, else why not."""

    def find_library(self, name: str) -> str | None: ...


class RealHost:
    def euid(self) -> int:
        return os.geteuid()

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def read(self, path: str) -> str | None:
        try:
            return Path(path).read_text()
        except OSError:
            return None

    def env(self, name: str) -> str | None:
        return os.environ.get(name)

    def release(self) -> str:
        return os.uname().release

    def can_import(self, module: str, extra_path: str | None = None) -> str | None:
        try:
            importlib.import_module(module)
            return None
        except (ImportError, OSError) as exc:
            if extra_path is None:
                return str(exc)
            if extra_path not in sys.path:
                sys.path.append(extra_path)
            return self.can_import(module)

    def call(self, module: str, fn: str) -> Any:
        try:
            return getattr(importlib.import_module(module), fn)()
        except Exception as exc:  # a missing driver raises anything from CUDARuntimeError to OSError
            return exc

    def disk_bytes(self, path: str) -> int | None:
        try:
            st = os.statvfs(path)
        except OSError:
            return None
        return st.f_frsize * st.f_blocks

    def memlock_bytes(self) -> int:
        soft = resource.getrlimit(resource.RLIMIT_MEMLOCK)[0]
        return -1 if soft == resource.RLIM_INFINITY else int(soft)

    def port_free(self, port: int) -> bool:
        return launcher.port_free(port)

    def redis_ping(self, url: str) -> str | None:
        import redis

        from anvil_client.stack_redis import open_redis

        try:
            open_redis(url, socket_timeout=1, socket_connect_timeout=1).ping()
        except redis.RedisError as exc:
            return str(exc)
        return None

    def find_library(self, name: str) -> str | None:
        return ctypes.util.find_library(name)


# -- the checks (qos: eBPF) ------------------------------------------------------------------------
def check_root(h: Host) -> Check:
    if h.euid() == 0:
        return Check("root", "qos", "ok", "running as root (eBPF can load)")
    return Check(
        "root",
        "qos",
        "missing",
        "not root: qos observes through /proc (no run-queue p99, no per-port TCP, no GPU probe)",
        "run qos as root (compose: privileged: true, pid: host)",
    )


def check_tracefs(h: Host) -> Check:
    # bcc reads tracepoint formats through debugfs's view (/sys/kernel/debug/tracing).
    if h.exists("/sys/kernel/debug/tracing/events"):
        return Check("tracefs", "qos", "ok", "/sys/kernel/debug/tracing/events")
    return Check(
        "tracefs",
        "qos",
        "missing",
        "tracefs/debugfs not mounted at /sys/kernel/debug/tracing",
        "mount -t debugfs nodev /sys/kernel/debug && mount -t tracefs nodev /sys/kernel/tracing",
    )


def check_btf(h: Host) -> Check:
    if h.exists("/sys/kernel/btf/vmlinux"):
        return Check("BTF", "qos", "ok", "/sys/kernel/btf/vmlinux")
    return Check(
        "BTF",
        "qos",
        "off",
        "no /sys/kernel/btf/vmlinux (bcc does not need it; CO-RE tools do)",
        "CONFIG_DEBUG_INFO_BTF=y",
    )


def check_headers(h: Host) -> Check:
    # The order qos's loader uses: BCC_KERNEL_SOURCE alone when set, else the kernel's own, else
    # the tree .ci/prepare_ebpf.sh merged.
    explicit = h.env("BCC_KERNEL_SOURCE")
    candidates = (
        [explicit]
        if explicit
        else [f"/lib/modules/{h.release()}/build", (h.read(BCC_SOURCE_FILE) or "").strip()]
    )
    for path in candidates:
        if path and h.exists(f"{path}/include"):
            return Check("kernel headers", "qos", "ok", f"{path} (bcc compiles against it)")
    what = f"BCC_KERNEL_SOURCE={explicit} has no include/" if explicit else "no kernel headers for bcc"
    return Check(
        "kernel headers",
        "qos",
        "missing",
        f"{what} ({h.release()}): qos falls back to /proc",
        f"{PREPARE_EBPF} (or apt-get install linux-headers-$(uname -r))",
    )


def check_bcc(h: Host) -> Check:
    why = h.can_import("bcc", BCC_DIST_PACKAGES)
    if why is None:
        return Check("bcc", "qos", "ok", "bcc imports")
    return Check(
        "bcc", "qos", "missing", f"bcc does not import: {why}", "apt-get install bpfcc-tools python3-bpfcc"
    )


def check_memlock(h: Host) -> Check:
    limit = h.memlock_bytes()
    if limit < 0 or limit >= MEMLOCK_MIN_BYTES or h.euid() == 0:
        shown = "unlimited" if limit < 0 else f"{limit >> 20} MiB"
        return Check(
            "memlock", "qos", "ok", f"RLIMIT_MEMLOCK {shown} (root, or kernel >= 5.11 charges memcg)"
        )
    return Check(
        "memlock",
        "qos",
        "missing",
        f"RLIMIT_MEMLOCK {limit >> 10} KiB: BPF maps may fail on older kernels",
        "ulimit -l unlimited (compose: ulimits: memlock: -1)",
    )


# -- gateway / executor / stack ----------------------------------------------------------------------
def check_shm(h: Host) -> Check:
    size = h.disk_bytes("/dev/shm")
    if size is None:
        return Check(
            "/dev/shm",
            "gateway",
            "missing",
            "no /dev/shm: ZeroCopy off",
            "mount -t tmpfs -o size=4G tmpfs /dev/shm",
        )
    if size < SHM_MIN_BYTES:
        return Check(
            "/dev/shm",
            "gateway",
            "missing",
            f"/dev/shm is {size >> 20} MiB (< {SHM_MIN_BYTES >> 20} MiB): ZeroCopy regions will not fit",
            "mount -o remount,size=4G /dev/shm (docker: --shm-size=4g)",
        )
    return Check("/dev/shm", "gateway", "ok", f"{size >> 20} MiB")


def check_gpu_driver(h: Host) -> Check:
    version = h.read("/proc/driver/nvidia/version")
    if version:
        return Check("GPU driver", "executor", "ok", version.splitlines()[0].strip())
    lib = h.find_library("cuda")
    if lib:
        return Check(
            "GPU driver",
            "executor",
            "off",
            f"{lib} present but no NVIDIA kernel driver loaded",
            "modprobe nvidia",
        )
    return Check("GPU driver", "executor", "off", "no NVIDIA driver: executors serve on the CPU")


def check_cupy(h: Host) -> Check:
    why = h.can_import("cupy")
    if why is not None:
        return Check(
            "CuPy",
            "executor",
            "off",
            "CuPy not installed: GPU plans off",
            "pip install cupy-cuda12x (on a GPU host)",
        )
    available = h.call("cupy", "is_available")
    if available is True:
        return Check("CuPy", "executor", "ok", "cupy.is_available() is True")
    return Check(
        "CuPy", "executor", "off", f"CuPy installed, cupy.is_available() -> {available!r}: no usable GPU"
    )


def check_ports(h: Host, ports: dict[int, str] | None = None) -> list[Check]:
    out = []
    for port, who in sorted((ports or DEFAULT_PORTS).items()):
        if h.port_free(port):
            out.append(Check(f"port {port}", "stack", "ok", f"free ({who})"))
        else:
            out.append(
                Check(
                    f"port {port}",
                    "stack",
                    "missing",
                    f"in use ({who}'s default): another stack, or another program",
                    f"anvil down; or `ss -ltnp sport = :{port}` to see who holds it",
                )
            )
    return out


def check_redis(h: Host, url: str | None = None) -> Check:
    url = url or h.env("ANVIL_REDIS_URL") or "redis://127.0.0.1:6379/0"
    why = h.redis_ping(url)
    url = redact_url(url)  # shown below: a password in the URL must not be
    if why is None:
        return Check("redis", "stack", "ok", f"{url} answers PING")
    return Check(
        "redis",
        "stack",
        "off",
        f"{url} unreachable ({why}); `make up` starts its own embedded Redis",
        "apt-get install redis-server, or set ANVIL_REDIS_URL",
    )


CHECKS: tuple[Callable[[Host], Check | list[Check]], ...] = (
    check_root,
    check_tracefs,
    check_btf,
    check_headers,
    check_bcc,
    check_memlock,
    check_shm,
    check_gpu_driver,
    check_cupy,
    check_ports,
    check_redis,
)


def run_checks(host: Host, checks: Sequence[Callable[[Host], Check | list[Check]]] = CHECKS) -> list[Check]:
    out: list[Check] = []
    for check in checks:
        got = check(host)
        out.extend(got if isinstance(got, list) else [got])
    return out


def cmd_doctor(args: argparse.Namespace) -> int:
    results = run_checks(RealHost())
    for c in results:
        print(c.line())
    missing = [c for c in results if c.status == "missing"]
    print(f"{len(results) - len(missing)} of {len(results)} ok or optional; {len(missing)} missing")
    return 1 if args.strict and missing else 0


def add_doctor_command(sub: Any) -> None:
    p = sub.add_parser("doctor", help="check this host for what each service needs (and how to fix it)")
    p.add_argument("--strict", action="store_true", help="exit 1 when any item is missing (default: 0)")
    p.set_defaults(fn=cmd_doctor)
