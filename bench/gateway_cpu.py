"""CPU per request of the request path, this checkout against another one (issue #18's budget: the
trust-boundary work may cost at most +10%). Run through `bench/gateway_overhead.py --baseline TREE`.

Two stacks run side by side on free ports: this tree's `anvil up` with its defaults (CURVE keys,
ipc links, Redis users, verified codec, compiler API key) and TREE's (run by TREE/.venv/bin/python).
Both serve only `identity` (ANVIL_MODELS) so nothing else loads. For each load (transport, size,
connections) and round, wrk drives one stack then the other (the order alternates), and the
request path's CPU (utime + stime of the gateway, scheduler and executor processes from
/proc/<pid>/stat) over the round is divided by the requests wrk completed; any non-2xx answer voids
the run. Medians over rounds. Writes bench/results/gateway_cpu_vs_base.{json,md}.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from auth_overhead import PATH_SERVICES, cpu_s, wrk_count
from gateway_overhead import RESULTS, ROOT, bodies, lua_for, start_stack

# transport, size label, FP32 elements, connections
LOADS = (
    ("http_binary", "1KB", 256, 16),
    ("http_json", "1KB", 256, 16),
    ("http_binary", "64KB", 16_384, 16),
    ("http_binary", "1MB", 262_144, 4),
)
STACK_ENV = {"ANVIL_MODELS": "identity"}
PROFILE_S = 15  # py-spy seconds per stack (--profile)


def service_pids(env: dict[str, str]) -> dict[str, int]:
    """service -> pid of the request path's processes (one replica each here)."""
    state = json.loads((Path(env["ANVIL_RUN_ROOT"]) / "current.json").read_text())
    return {s["service"]: int(s["pid"]) for s in state["services"] if s["service"] in PATH_SERVICES}


def _commit(tree: Path) -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tree, capture_output=True, text=True)
    return out.stdout.strip()


def compare(
    baseline: Path,
    seconds: int,
    rounds: int,
    profile: bool = False,
    sizes: tuple[str, ...] = (),
    profile_size: str = "1KB",
) -> None:
    """`sizes`: only the loads of these size labels (all when empty); `profile_size`: the size label
    of the binary requests py-spy samples under (`--profile`)."""
    loads = [load for load in LOADS if not sizes or load[1] in sizes]
    tmp = Path(tempfile.mkdtemp(prefix="anvil-cpu-vs-"))
    trees = {"now": (ROOT, sys.executable), "base": (baseline, str(baseline / ".venv/bin/python"))}
    stacks: dict[str, Any] = {}
    rows: list[dict[str, Any]] = []
    try:
        for name, (root, python) in trees.items():
            (tmp / name).mkdir()
            proc, env, url = start_stack(tmp / name, STACK_ENV, root=root, python=python)
            stacks[name] = (proc, env, url, service_pids(env))
        for transport, size, n, conns in loads:
            luas = {}
            for name, (_, _, url, _) in stacks.items():
                body, headers = bodies(tmp / name, n, url)[transport]
                luas[name] = lua_for(body, headers)
            for rnd in range(rounds):
                for name in list(trees)[:: 1 if rnd % 2 == 0 else -1]:
                    _, _, url, pids = stacks[name]
                    c0 = {svc: cpu_s([pid]) for svc, pid in pids.items()}
                    count, rps, bad = wrk_count(f"{url}/v2/models/identity/infer", luas[name], conns, seconds)
                    per = {svc: cpu_s([pid]) - c0[svc] for svc, pid in pids.items()}
                    used = sum(per.values())
                    if bad:
                        raise SystemExit(
                            f"{bad} non-2xx answers from the {name} stack: the comparison is void"
                        )
                    row = {"transport": transport, "size": size, "conns": conns, "tree": name, "round": rnd}
                    row |= {"requests": count, "rps": rps, "cpu_us_per_request": used / max(count, 1) * 1e6}
                    row |= {f"cpu_us_{svc}": t / max(count, 1) * 1e6 for svc, t in per.items()}
                    rows.append(row)
                    print(row, flush=True)
        if profile:
            n = {size: n for _, size, n, _ in LOADS}[profile_size]
            for name, (_, _, url, pids) in stacks.items():
                body, headers = bodies(tmp / name, n, url)["http_binary"]
                py_spy(name, pids, url, lua_for(body, headers), tmp, profile_size)
    finally:
        for proc, *_ in stacks.values():
            proc.send_signal(signal.SIGINT)
            proc.wait(30)
        for f in Path("/dev/shm").glob("anvil-bench-*"):
            f.unlink(missing_ok=True)
    if rows:  # --rounds 0 --profile: the profiles only
        write(rows, baseline, seconds, rounds, [load[1] for load in loads] if sizes else [])


def write(
    rows: list[dict[str, Any]], baseline: Path, seconds: int, rounds: int, sizes: list[str] | None = None
) -> None:
    only = f" --sizes {' '.join(dict.fromkeys(sizes))}" if sizes else ""
    meta = {
        "command": "flock /tmp/anvil-timing.lock uv run python bench/gateway_overhead.py "
        f"--baseline <checkout of {_commit(baseline)}> --seconds {seconds} --rounds {rounds}{only}",
        "commit": _commit(ROOT),
        "baseline_commit": _commit(baseline),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.node()}",
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }
    summary = []
    for transport, size, _, conns in LOADS:
        if not any((r["transport"], r["size"]) == (transport, size) for r in rows):
            continue

        def med(tree: str, key: str, transport: str = transport, size: str = size) -> float:
            pick = [r[key] for r in rows if (r["transport"], r["size"], r["tree"]) == (transport, size, tree)]
            return statistics.median(pick)

        s: dict[str, Any] = {"transport": transport, "size": size, "conns": conns}
        for tree in ("now", "base"):
            s[f"cpu_us_{tree}"] = med(tree, "cpu_us_per_request")
            s[f"rps_{tree}"] = med(tree, "rps")
        s["cpu_ratio"] = s["cpu_us_now"] / s["cpu_us_base"]
        for svc in PATH_SERVICES:
            for tree in ("now", "base"):
                s[f"cpu_us_{svc}_{tree}"] = med(tree, f"cpu_us_{svc}")
        summary.append(s)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "gateway_cpu_vs_base.json").write_text(
        json.dumps({"meta": meta, "summary": summary, "rows": rows}, indent=1)
    )
    lines = [
        "# CPU per request of the request path: now vs before the trust-boundary work (#18)",
        "",
        f"{meta['date']}, commit {meta['commit']} (`now`, its defaults: auth on) vs "
        f"{meta['baseline_commit']} (`base`), {meta['machine']}, Python {meta['python']}. "
        f"`{meta['command']}`. Both stacks, wrk and any other work on the machine shared the cores; "
        "the order alternates every round. CPU = gateway + scheduler + executor processes (utime + stime) / "
        "requests completed; medians of the rounds.",
        "",
        "| transport | size | conns | CPU us/req now | base | now / base | gateway now / base | "
        "scheduler now / base | executor now / base | req/s now | base |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in summary:
        lines.append(
            f"| {s['transport']} | {s['size']} | {s['conns']} | {s['cpu_us_now']:.0f} | "
            f"{s['cpu_us_base']:.0f} | {s['cpu_ratio']:.3f} | "
            + " | ".join(f"{s[f'cpu_us_{v}_now']:.0f} / {s[f'cpu_us_{v}_base']:.0f}" for v in PATH_SERVICES)
            + f" | {s['rps_now']:.0f} | {s['rps_base']:.0f} |"
        )
    (RESULTS / "gateway_cpu_vs_base.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def py_spy(name: str, pids: dict[str, int], url: str, lua: Path, tmp: Path, size: str = "1KB") -> None:
    """Sample every request-path process of one stack with py-spy while wrk drives binary requests
    of `size` (16 connections), and write the top self-time functions per service to
    bench/results/gateway_cpu_profile_<name>[_<size>].txt (1 KB: no suffix)."""

    def record(svc: str, pid: int) -> subprocess.Popen[bytes]:
        out = str(tmp / f"{name}-{svc}.txt")
        exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))  # pip install py-spy
        argv = [exe, "record", "--pid", str(pid), "--duration", str(PROFILE_S), "--rate", "250"]
        argv += ["--format", "raw", "--output", out, "--nonblocking"]
        return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    spies = {svc: record(svc, pid) for svc, pid in pids.items()}
    wrk_count(f"{url}/v2/models/identity/infer", lua, 16, PROFILE_S + 1)
    lines = [
        f"# py-spy, {name} stack, {size} HTTP binary identity requests, 16 connections, {PROFILE_S} s",
        "",
    ]
    for svc, spy in spies.items():
        spy.wait(60)
        own: dict[str, int] = {}
        inclusive: dict[str, int] = {}
        total = 0
        path = tmp / f"{name}-{svc}.txt"
        for row in path.read_text().splitlines() if path.exists() else []:
            stack, _, count = row.rpartition(" ")
            frames = stack.split(";")[1:] or [stack]  # the first is the thread
            own[frames[-1]] = own.get(frames[-1], 0) + int(count)
            for frame in set(frames):
                inclusive[frame] = inclusive.get(frame, 0) + int(count)
            total += int(count)
        lines.append(f"## {svc}: {total} samples")
        for title, table in (("self", own), ("inclusive", inclusive)):
            lines.append(f"### {title}")
            for frame, n in sorted(table.items(), key=lambda kv: -kv[1])[:30]:
                lines.append(f"{100 * n / max(total, 1):5.1f}%  {frame}")
        lines.append("")
    RESULTS.mkdir(parents=True, exist_ok=True)
    suffix = "" if size == "1KB" else f"_{size}"
    (RESULTS / f"gateway_cpu_profile_{name}{suffix}.txt").write_text("\n".join(lines) + "\n")
