"""What authenticated internal links cost (issue #18): CPU per request of the request path (gateway +
scheduler + executor processes), in the same run, on `bench/gateway_overhead.py`'s machinery: three
stacks (`anvil up`, free ports) side by side, wrk driving HTTP binary `identity` requests, the order
of the stacks rotating every round so that drift on a shared machine hits all alike.

- `on`: the default of `anvil up`: links over ipc in a 0700 directory, CURVE tcp ports open beside;
- `curve_tcp`: every link tcp with CURVE (ANVIL_LINK_IPC_DIR=""), as in compose or across hosts;
- `off`: no authentication, tcp (ANVIL_ZMQ_CURVE=0, ANVIL_LINK_IPC_DIR=""), the code before #18.

CPU per request = (utime + stime of the three processes over a round, from /proc/<pid>/stat) /
requests completed in the round (wrk's count; any non-2xx fails the run). Medians over rounds.

    flock /tmp/anvil-timing.lock uv run python bench/auth_overhead.py [--seconds 5] [--rounds 5]

Writes bench/results/auth_overhead.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from gateway_overhead import RESULTS, bodies, lua_for, start_stack  # noqa: E402

PATH_SERVICES = ("gateway", "scheduler", "executor")  # the processes every request passes through
LOADS = (("1KB", 256, 16), ("64KB", 16_384, 16), ("1MB", 262_144, 4))  # size, FP32 elements, conns
TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
MODES = {
    "on": {},
    "curve_tcp": {"ANVIL_LINK_IPC_DIR": ""},
    "off": {"ANVIL_ZMQ_CURVE": "0", "ANVIL_LINK_IPC_DIR": ""},
}


def cpu_s(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15 of stat)
    return total * TICK_S


def wrk_count(url: str, lua: Path, conns: int, seconds: int) -> tuple[int, float, int]:
    out = subprocess.run(
        ["wrk", "-t1", f"-c{conns}", f"-d{seconds}s", "-s", str(lua), url],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    n = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    rps = float(re.search(r"Requests/sec:\s+([0-9.]+)", out).group(1))  # type: ignore[union-attr]
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return n, rps, int(bad.group(1)) if bad else 0


def path_pids(env: dict[str, str]) -> list[int]:
    state = json.loads((Path(env["ANVIL_RUN_ROOT"]) / "current.json").read_text())
    return [int(s["pid"]) for s in state["services"] if s["service"] in PATH_SERVICES]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is required (apt-get install wrk)")
    tmp = Path(tempfile.mkdtemp(prefix="anvil-auth-bench-"))
    rows = cpu_per_request_ab(MODES, "auth", tmp, args.rounds, args.seconds)
    write(rows, args)


def cpu_per_request_ab(
    modes: dict[str, dict[str, str]],
    label: str,
    tmp: Path,
    rounds: int,
    seconds: float,
    loads: tuple[tuple[str, int, int], ...] = LOADS,
) -> list[dict[str, Any]]:
    """One local stack per mode (its extra env), then per load and round wrk against each in an
    order that rotates every round; a row per run with the CPU of the request path per request (µs).
    Stops the stacks and removes the bench's shm regions however it ends."""
    stacks: dict[str, Any] = {}
    rows: list[dict[str, Any]] = []
    try:
        for mode, extra in modes.items():
            (tmp / mode).mkdir()
            proc, env, url = start_stack(tmp / mode, dict(extra))
            stacks[mode] = (proc, env, url, path_pids(env))
        for size, n, conns in loads:
            luas = {}
            for mode, (_, _, url, _) in stacks.items():
                body, headers = bodies(tmp / mode, n, url)["http_binary"]
                luas[mode] = lua_for(body, headers)
            for rnd in range(rounds):
                order = list(modes)
                for mode in order[rnd % len(order) :] + order[: rnd % len(order)]:
                    _, _, url, pids = stacks[mode]
                    c0 = cpu_s(pids)
                    count, rps, bad = wrk_count(f"{url}/v2/models/identity/infer", luas[mode], conns, seconds)
                    used = cpu_s(pids) - c0
                    if bad:
                        raise SystemExit(f"{bad} non-2xx answers with {label} {mode}: the comparison is void")
                    row = {"size": size, "conns": conns, label: mode, "round": rnd, "requests": count}
                    row |= {"rps": rps, "cpu_us_per_request": used / max(count, 1) * 1e6}
                    rows.append(row)
                    print(row, flush=True)
    finally:
        for proc, *_ in stacks.values():
            proc.send_signal(signal.SIGINT)
            proc.wait(30)
        for f in Path("/dev/shm").glob("anvil-bench-*"):
            f.unlink(missing_ok=True)
    return rows


def write(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    meta = {
        "command": "flock /tmp/anvil-timing.lock uv run python bench/auth_overhead.py "
        f"--seconds {args.seconds} --rounds {args.rounds}",
        "commit": commit.stdout.strip(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.node()}",
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }
    summary = []
    for size, _, conns in LOADS:

        def med(mode: str, key: str, size: str = size) -> float:
            return statistics.median(r[key] for r in rows if r["size"] == size and r["auth"] == mode)

        row: dict[str, Any] = {"size": size, "conns": conns}
        for mode in MODES:
            row[f"cpu_us_{mode}"] = med(mode, "cpu_us_per_request")
            row[f"rps_{mode}"] = med(mode, "rps")
        for mode in ("on", "curve_tcp"):
            row[f"cpu_ratio_{mode}"] = row[f"cpu_us_{mode}"] / row["cpu_us_off"]
        summary.append(row)
    RESULTS.mkdir(parents=True, exist_ok=True)
    doc = {"meta": meta, "summary": summary, "rows": rows}
    (RESULTS / "auth_overhead.json").write_text(json.dumps(doc, indent=1))
    lines = [
        "# CPU per request with authenticated internal links",
        "",
        f"{meta['date']}, commit {meta['commit']}, {meta['machine']}, Python {meta['python']}. "
        f"`{meta['command']}`. The three stacks, wrk and any other work on the machine shared its "
        "cores; the order rotates every round. CPU = gateway + scheduler + executor processes, HTTP "
        "binary `identity` requests; medians of the rounds. `on`: `anvil up`'s default (ipc links in a "
        "0700 dir); `curve_tcp`: every link tcp + CURVE (compose, other hosts); `off`: no auth (before #18).",
        "",
        "| size | conns | CPU us/req on | curve_tcp | off | on / off | curve_tcp / off "
        "| req/s on | curve_tcp | off |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in summary:
        lines.append(
            f"| {s['size']} | {s['conns']} | {s['cpu_us_on']:.0f} | {s['cpu_us_curve_tcp']:.0f} | "
            f"{s['cpu_us_off']:.0f} | {s['cpu_ratio_on']:.3f} | {s['cpu_ratio_curve_tcp']:.3f} | "
            f"{s['rps_on']:.0f} | {s['rps_curve_tcp']:.0f} | {s['rps_off']:.0f} |"
        )
    (RESULTS / "auth_overhead.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
