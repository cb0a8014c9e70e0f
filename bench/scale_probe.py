"""What bench/gpu_scale.py reads around each load phase, as before/after snapshots: Prometheus text
from the services' /metrics, each service's CPU seconds from /proc (its process and descendants, so
the gateway's worker processes count), the host's busy CPU, and GPU utilisation sampled by
`nvidia-smi` while the load runs.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import httpx

__all__ = [
    "GpuSampler",
    "Series",
    "cpu_seconds",
    "delta",
    "host_busy",
    "label_sum",
    "scrape",
]

Series = dict[tuple[str, frozenset[tuple[str, str]]], float]  # (name, labels) -> value
_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100  # /proc/<pid>/stat ticks per s


def scrape(port: int | str, timeout_s: float = 3.0) -> Series:
    """A service's /metrics on 127.0.0.1:port as {(name, labels): value}; {} when it does not answer."""
    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=timeout_s).text
    except httpx.HTTPError:
        return {}
    out: Series = {}
    for line in text.splitlines():
        if line.startswith("#") or not (mm := _LINE.match(line)):
            continue
        labels = frozenset(_LABEL.findall(mm[2] or ""))
        try:
            out[(mm[1], labels)] = float(mm[3])
        except ValueError:
            continue
    return out


def label_sum(series: Series, name: str, **labels: str) -> float:
    """Sum of `name` over the series whose labels include `labels`."""
    want = set(labels.items())
    return sum(v for (n, lab), v in series.items() if n == name and want <= lab)


def delta(before: Series, after: Series, name: str, **labels: str) -> float:
    return label_sum(after, name, **labels) - label_sum(before, name, **labels)


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, CPU seconds user + system) of a live process, None when it is gone."""
    try:
        raw = open(f"/proc/{pid}/stat", "rb").read().decode(errors="replace")  # noqa: SIM115
    except OSError:
        return None
    rest = raw[raw.rfind(")") + 2 :].split()  # the command name may hold spaces and parentheses
    return int(rest[1]), (int(rest[11]) + int(rest[12])) / CLK_TCK


def cpu_seconds(roots: Mapping[str, int]) -> dict[str, float]:
    """{service: CPU seconds of its process and every live descendant}, for `roots` {service: pid}."""
    parent: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (st := _stat(int(entry))) is not None:
            parent[int(entry)], cpu[int(entry)] = st
    owner: dict[int, str] = {pid: name for name, pid in roots.items()}
    out = dict.fromkeys(roots, 0.0)
    for pid in cpu:
        p, seen = pid, 0
        while p not in owner and p in parent and seen < 64:  # walk up to a service's root
            p, seen = parent[p], seen + 1
        if p in owner:
            out[owner[p]] += cpu[pid]
    return out


def host_busy() -> tuple[float, float]:
    """(busy, total) jiffies of all CPUs from /proc/stat: busy share = Δbusy / Δtotal."""
    with open("/proc/stat") as f:
        fields = [float(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


@dataclass
class GpuSampler:
    """`nvidia-smi --query-gpu ... -lms` in the background while a load phase runs: utilisation (%)
    and memory used (MiB) per GPU index. `available` is False where nvidia-smi is absent."""

    period_ms: int = 200
    samples: dict[int, list[tuple[float, float]]] = field(default_factory=dict)
    error: str = ""
    _proc: subprocess.Popen[str] | None = None
    _reader: threading.Thread | None = None

    @property
    def available(self) -> bool:
        return shutil.which("nvidia-smi") is not None

    def start(self) -> None:
        if not self.available:
            self.error = "no nvidia-smi on PATH"
            return
        cmd = ["nvidia-smi", "--query-gpu=index,utilization.gpu,memory.used"]
        cmd += ["--format=csv,noheader,nounits", "-lms", str(self.period_ms)]
        self._proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            parts = [p.strip() for p in line.split(",")]
            try:
                self.samples.setdefault(int(parts[0]), []).append((float(parts[1]), float(parts[2])))
            except (ValueError, IndexError):
                continue  # "[N/A]" on a GPU that reports no utilisation

    def stop(self) -> dict[str, dict[str, float]] | str:
        """{gpu index: {util_mean_pct, util_max_pct, mem_max_mib, samples}}, or why there is none."""
        if self._proc is None:
            return self.error or "not sampled"
        self._proc.terminate()
        try:
            self._proc.wait(5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
        if self._reader is not None:
            self._reader.join(5)
        if not self.samples:
            return "nvidia-smi printed no sample"
        return {str(i): _summary(s) for i, s in sorted(self.samples.items())}


def _summary(samples: Iterable[tuple[float, float]]) -> dict[str, float]:
    util, mem = zip(*samples, strict=True)
    return {
        "util_mean_pct": round(sum(util) / len(util), 1),
        "util_max_pct": max(util),
        "mem_max_mib": max(mem),
        "samples": len(util),
    }
