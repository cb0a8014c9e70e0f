"""The request path, this checkout against another (issue #19's per-request targets): CPU per request
of gateway + scheduler + executor at 16 connections, and the latency of a lone request (1 connection),
`identity`, 1 KB HTTP binary, wrk.

Two stacks run side by side on free ports (`bench/gateway_overhead.py`'s `start_stack`, ANVIL_MODELS=
identity): this tree's and TREE's (run by TREE/.venv/bin/python). Per round and load, wrk drives one
stack then the other, the order alternating every round, so that drift on a shared machine hits both
alike. CPU = utime + stime of the three processes (/proc/<pid>/stat) over the run / requests wrk
completed (at c1: its rate x the seconds); any non-2xx answer voids the run. Medians of the rounds.

    flock /tmp/anvil-timing.lock uv run python bench/request_path_ab.py --baseline TREE [--rounds 5]

Or this tree against itself with a setting changed (`--base-env KEY=VALUE`, repeatable: the base
stack gets it, e.g. `ANVIL_DIRECT_ANSWERS=0`), and `--name` for the results' file stem:

    flock /tmp/anvil-timing.lock uv run python bench/request_path_ab.py --base-env ANVIL_DIRECT_ANSWERS=0 \
        --name direct_answers_ab

Writes bench/results/request_path_ab.{json,md} (or NAME.{json,md}).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
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
from auth_overhead import PATH_SERVICES, cpu_s, wrk_count  # noqa: E402
from gateway_cpu import service_pids  # noqa: E402
from gateway_overhead import RESULTS, bodies, lua_for, start_stack, wrk  # noqa: E402

LOADS = (("c16", 16), ("c1", 1))  # label, wrk connections
STACK_ENV = {"ANVIL_MODELS": "identity"}


def _commit(tree: Path) -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tree, capture_output=True, text=True)
    return out.stdout.strip()


def run(baseline: Path | None, base_env: dict[str, str], seconds: int, rounds: int) -> list[dict[str, Any]]:
    tmp = Path(tempfile.mkdtemp(prefix="anvil-path-ab-"))
    base = (baseline, str(baseline / ".venv/bin/python")) if baseline else (ROOT, sys.executable)
    trees = {"now": (ROOT, sys.executable), "base": base}
    envs = {"now": STACK_ENV, "base": {**STACK_ENV, **base_env}}
    stacks: dict[str, Any] = {}
    rows: list[dict[str, Any]] = []
    try:
        for name, (root, python) in trees.items():
            (tmp / name).mkdir()
            proc, env, url = start_stack(tmp / name, envs[name], root=root, python=python)
            body, headers = bodies(tmp / name, 256, url)["http_binary"]
            stacks[name] = (proc, url, service_pids(env), lua_for(body, headers))
            wrk_count(f"{url}/v2/models/identity/infer", stacks[name][3], 16, 2)  # warm-up
        for rnd in range(rounds):
            for label, conns in LOADS:
                for name in list(trees)[:: 1 if rnd % 2 == 0 else -1]:
                    _, url, pids, lua = stacks[name]
                    c0 = {svc: cpu_s([pid]) for svc, pid in pids.items()}
                    res = wrk(f"{url}/v2/models/identity/infer", lua, conns, seconds)
                    per = {svc: cpu_s([pid]) - c0[svc] for svc, pid in pids.items()}
                    if res["non2xx"]:
                        raise SystemExit(f"{res['non2xx']} non-2xx answers from the {name} stack: void")
                    count = max(1.0, res["rps"] * seconds)
                    row = {"load": label, "tree": name, "round": rnd, **res}
                    row["cpu_us_per_request"] = sum(per.values()) / count * 1e6
                    row |= {f"cpu_us_{svc}": t / count * 1e6 for svc, t in per.items()}
                    row["load_average_1m"] = round(os.getloadavg()[0], 2)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    finally:
        for proc, *_ in stacks.values():
            proc.send_signal(signal.SIGINT)
            proc.wait(30)
    return rows


def write(
    rows: list[dict[str, Any]],
    baseline: Path | None,
    base_env: dict[str, str],
    seconds: int,
    rounds: int,
    name: str,
) -> None:
    if baseline is not None:
        against = f"--baseline <checkout of {_commit(baseline)}>"
        base_label = _commit(baseline)
    else:
        against = " ".join(f"--base-env {k}={v}" for k, v in base_env.items())
        base_label = f"{_commit(ROOT)} with {', '.join(f'{k}={v}' for k, v in base_env.items())}"
    meta = {
        "command": f"flock /tmp/anvil-timing.lock uv run python bench/request_path_ab.py {against} "
        f"--seconds {seconds} --rounds {rounds}" + (f" --name {name}" if name != "request_path_ab" else ""),
        "commit": _commit(ROOT),
        "baseline_commit": base_label,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.node()}",
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }
    keys = ["cpu_us_per_request", *(f"cpu_us_{s}" for s in PATH_SERVICES), "p50_ms", "p99_ms", "rps"]
    summary = []
    for label, conns in LOADS:
        s: dict[str, Any] = {"load": label, "conns": conns}
        for tree in ("now", "base"):
            for key in keys:
                vals = [r[key] for r in rows if (r["load"], r["tree"]) == (label, tree)]
                s[f"{key}_{tree}"] = statistics.median(vals) if vals else float("nan")
        s["cpu_ratio"] = s["cpu_us_per_request_now"] / s["cpu_us_per_request_base"]
        s["p50_ratio"] = s["p50_ms_now"] / s["p50_ms_base"]
        summary.append(s)
    RESULTS.mkdir(parents=True, exist_ok=True)
    doc = {"meta": meta, "summary": summary, "rows": rows}
    (RESULTS / f"{name}.json").write_text(json.dumps(doc, indent=1) + "\n")
    loads = [r["load_average_1m"] for r in rows]
    lines = [
        "# Request path: this tree vs a baseline (CPU per request, lone-request latency)",
        "",
        f"{meta['date']}, commit {meta['commit']} (`now`) vs {meta['baseline_commit']} (`base`), "
        f"{meta['machine']}, Python {meta['python']}. `{meta['command']}`. `identity`, 1 KB HTTP binary, "
        "wrk; both stacks, wrk and any other work on the machine shared the cores (1-min load average "
        f"{min(loads):.1f}-{max(loads):.1f} during the rounds); the order alternates every round. "
        "CPU = gateway + scheduler + executor (utime + stime) / requests; medians of the rounds.",
        "",
        "| load | CPU µs/req now | base | now / base | gateway now / base | scheduler now / base | "
        "executor now / base | p50 ms now | base | now / base | p99 ms now | base | req/s now | base |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in summary:
        svc = " | ".join(f"{s[f'cpu_us_{v}_now']:.0f} / {s[f'cpu_us_{v}_base']:.0f}" for v in PATH_SERVICES)
        lines.append(
            f"| {s['load']} | {s['cpu_us_per_request_now']:.0f} | {s['cpu_us_per_request_base']:.0f} | "
            f"{s['cpu_ratio']:.3f} | {svc} | {s['p50_ms_now']:.2f} | {s['p50_ms_base']:.2f} | "
            f"{s['p50_ratio']:.3f} | {s['p99_ms_now']:.2f} | {s['p99_ms_base']:.2f} | {s['rps_now']:.0f} | "
            f"{s['rps_base']:.0f} |"
        )
    (RESULTS / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", type=Path, help="another checkout with its own .venv")
    ap.add_argument(
        "--base-env", action="append", default=[], metavar="KEY=VALUE",
        help="instead of --baseline: this tree, its base stack with this setting (repeatable)",
    )  # fmt: skip
    ap.add_argument("--name", default="request_path_ab", help="results file stem in bench/results")
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    base_env = dict(kv.split("=", 1) for kv in args.base_env)
    if (args.baseline is None) == (not base_env):
        ap.error("give --baseline TREE or --base-env KEY=VALUE (one of them)")
    rows = run(args.baseline, base_env, args.seconds, args.rounds)
    write(rows, args.baseline, base_env, args.seconds, args.rounds, args.name)


if __name__ == "__main__":
    main()
