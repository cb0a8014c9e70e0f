"""Which processes the probes watch: Anvil services found in the registry, resolved to host PIDs.

Each registry record (`anvil:svc:{kind}:{id}`) carries the `pid` its process saw (os.getpid()) and the
`host` it runs on (socket.gethostname()). Under compose that PID is inside the service's container PID
namespace, while qos runs with `pid: host`. `resolve` maps it to a PID that qos can probe:

1. the PID itself, when /proc/<pid> here is a process of that service (same namespace: `make up`);
2. else the host process whose innermost namespace PID (last `NSpid:` entry in /proc/<p>/status) is
   that PID, whose command line names the service's module (`anvil_<kind>`), and whose hostname
   (/proc/<p>/root/etc/hostname, where readable) is the record's `host` — every container's first
   process is PID 1, so the hostname tells them apart.

A record on another host, or without `pid`, is skipped (qos runs one per host). Extra targets can be
given explicitly as "kind=pid" (tests, processes outside the registry).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Target", "parse_explicit", "resolve", "thread_ids"]

PROC = Path("/proc")


@dataclass(frozen=True, order=True)
class Target:
    """One probed process. `pid` is a PID of qos's own PID namespace (the host's under compose)."""

    kind: str  # registry kind: gateway, scheduler, executor, ...
    id: str  # registry id (or "pid-<pid>" for explicit targets)
    pid: int
    port: int = 0  # the gateway's HTTP port (TCP probe), 0 for other kinds


def parse_explicit(spec: str) -> list[Target]:
    """'executor=1234,gateway=5678:8000' -> targets; ':port' gives a gateway's TCP port."""
    targets = []
    for item in filter(None, (part.strip() for part in spec.split(","))):
        kind, sep, rest = item.partition("=")
        pid_s, _, port_s = rest.partition(":")
        if not sep or not kind or not pid_s.isdigit() or (port_s and not port_s.isdigit()):
            raise ValueError(f"target {item!r} must look like kind=pid or kind=pid:port")
        targets.append(Target(kind, f"pid-{pid_s}", int(pid_s), int(port_s or 0)))
    return targets


def resolve(
    records: Iterable[Mapping[str, str]],
    proc: Path = PROC,
    cache: dict[tuple[str, ...], Target] | None = None,
) -> tuple[list[Target], list[str]]:
    """Targets for the records of live services, and one line per record that could not be resolved.

    `cache` (owned by the caller, kept across calls) remembers resolutions, re-checked cheaply, so
    the /proc scan of the namespace case runs once per new record, not every tick."""
    targets: list[Target] = []
    problems: list[str] = []
    ns_index: dict[int, list[int]] | None = None  # innermost ns pid -> host pids, built on demand
    cache = {} if cache is None else cache
    for rec in records:
        kind, sid, pid_s = rec.get("kind", ""), rec.get("id", ""), rec.get("pid", "")
        if not pid_s.isdigit():
            problems.append(f"{kind}:{sid} has no pid field in its registry record")
            continue
        pid = int(pid_s)
        port = int(rec["http_port"]) if rec.get("http_port", "").isdigit() else 0
        ident = (kind, sid, pid_s, rec.get("host", ""), str(port))
        known = cache.get(ident)
        if known is not None and _is_service(proc, known.pid, kind):
            targets.append(known)
            continue
        cache.pop(ident, None)
        if _is_service(proc, pid, kind):
            targets.append(cache.setdefault(ident, Target(kind, sid, pid, port)))
            continue
        if ns_index is None:
            ns_index = _ns_pid_index(proc)
        found = [p for p in ns_index.get(pid, []) if p != pid and _is_service(proc, p, kind)]
        if rec.get("host"):  # a container whose hostname is known must be the record's
            found = [p for p in found if _hostname(proc, p) in ("", rec["host"])]
        if len(found) == 1:
            targets.append(cache.setdefault(ident, Target(kind, sid, found[0], port)))
        else:
            where = "no" if not found else f"{len(found)} ambiguous"
            problems.append(f"{kind}:{sid} pid {pid} (host {rec.get('host', '?')}): {where} local process")
    return sorted(targets), problems


def _is_service(proc: Path, pid: int, kind: str) -> bool:
    try:
        cmdline = (proc / str(pid) / "cmdline").read_bytes()
    except OSError:
        return False
    return f"anvil_{kind}".encode() in cmdline or f"anvil-{kind}".encode() in cmdline


def _ns_pid_index(proc: Path) -> dict[int, list[int]]:
    index: dict[int, list[int]] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("NSpid:"):
                innermost = int(line.split()[-1])
                index.setdefault(innermost, []).append(int(entry.name))
                break
    return index


def _hostname(proc: Path, pid: int) -> str:
    try:
        return (proc / str(pid) / "root/etc/hostname").read_text().strip()
    except OSError:
        return ""


def thread_ids(pid: int, proc: Path = PROC) -> list[int]:
    """The thread ids of a process now (empty if it is gone)."""
    try:
        return [int(t.name) for t in (proc / str(pid) / "task").iterdir() if t.name.isdigit()]
    except OSError:
        return []
