"""Live policy comparison (issue #19): the real stack (`anvil up`, CPU executor, model `mlp`) under each
batching policy on the same arrival traces, with the simulator's prediction beside each live row.

    uv run python bench/live_scheduling.py --production-trace PATH [--seconds 8]

PATH (or env ANVIL_PRODUCTION_TRACE) is a file of send offsets in s, one per line: the Azure LLM
conversation trace of the shared traces folder (`azure_llm_inference_2023_conv.offsets`, 227 KB, so it
is referenced, not copied). Without it the production rows are left out and the report says so.

Traces (priority mix 1:0.1, 2:0.3, 3:0.6; default SLOs 50/200/2000 ms):
* ``step_burst``: Poisson 100 req/s, 10x (1,000 req/s) for the middle third;
* ``on_off``: Poisson 600 req/s for 1 s, silent for 1 s (mean 300 req/s);
* ``production_300`` / ``production_900``: the production trace's first ``--seconds`` after rescaling
  its mean rate to 300 / 900 req/s (its bursts kept).

Each policy gets a fresh stack (``ANVIL_POLICY``; fixed_delay at two queue delays), one run per trace,
then a closed-loop concurrency-1 run on ``identity`` (the lone-request path). After each run the
scheduler's learned latency profile of ``mlp`` is read from Redis, fitted as a + b*B, and the
simulator (`bench/batching_sim.py`, the same core classes in simulated time) replays the very same
arrivals against that service model: its goodput, p1 attainment and p1 p99 sit beside the live ones.
The simulator models no CPU contention and no hops, so the gap between the two is what the stack's
own queues cost. Writes bench/results/live_scheduling.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from anvil_client.bench.arrivals import Schedule, schedule
from anvil_client.bench.engine import Engine, RunResult
from anvil_client.bench.report import summarize
from anvil_client.bench.workload import Workload
from anvil_client.launcher import private_port_env
from anvil_client.stack_redis import open_redis
from anvil_core.keys import profile_key

sys.path.insert(0, str(Path(__file__).resolve().parent))
import batching_sim as sim

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
MIX = {1: 0.1, 2: 0.3, 3: 0.6}
MODEL = "mlp"  # the default; --model busy puts a stand-in device in its place (see main)
# (label, scheduler environment, simulator policy and params)
POLICIES: tuple[tuple[str, dict[str, str], str, dict[str, Any]], ...] = (
    ("edf_pid", {"ANVIL_POLICY": "edf_pid"}, "edf_pid", {}),
    (
        "fixed_delay_1ms",
        {"ANVIL_POLICY": "fixed_delay", "ANVIL_FIXED_MAX_QUEUE_DELAY_US": "1000"},
        "fixed_delay",
        {"max_batch": 32, "max_queue_delay_us": 1000},
    ),
    (
        "fixed_delay_5ms",
        {"ANVIL_POLICY": "fixed_delay", "ANVIL_FIXED_MAX_QUEUE_DELAY_US": "5000"},
        "fixed_delay",
        {"max_batch": 32, "max_queue_delay_us": 5000},
    ),
    ("aimd", {"ANVIL_POLICY": "aimd"}, "aimd", {}),
)


@dataclass(frozen=True)
class Arrivals:
    """What the simulator needs of a trace (duck-types batching_sim.Trace)."""

    name: str
    times: tuple[tuple[float, int], ...]
    duration_s: float
    seed: int = 19

    def arrivals(self) -> list[tuple[float, int]]:
        return list(self.times)


def traces(seconds: float, production: Path | None) -> list[tuple[str, Schedule]]:
    out = [
        ("step_burst", schedule("step", 100.0, seconds, seed=14, burst_factor=10.0)),
        ("on_off", schedule("onoff", 600.0, seconds, seed=15, period_s=2.0)),
    ]
    if production is not None:
        for rate in (300.0, 900.0):
            out.append(
                (
                    f"production_{rate:.0f}",
                    schedule("trace", rate, seconds, trace=production, trace_rate_rps=rate),
                )
            )
    return out


def start_stack(tmp: Path, extra: dict[str, str]) -> tuple[subprocess.Popen[str], dict[str, str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANVIL_")}
    env.update(private_port_env(ROOT / "compose.yaml"))
    env.update({"ANVIL_RUN_ROOT": str(tmp / "run"), "ANVIL_PROFILES": "cpu", "PYTHONUNBUFFERED": "1"})
    env.update(extra)
    proc = subprocess.Popen(
        [sys.executable, "-m", "anvil_client.cli", "up", "--no-restart", "--timeout", "180"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("anvil: ready"):
            return proc, env
    raise SystemExit("the stack did not start")


def stop_stack(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()


# The open-loop generator's connection cap. It stands in for many independent clients, so it must not
# be what limits the requests in flight: EDF lets priority 3 wait towards its 2 s deadline, and on
# `busy` at 900 req/s ~700 requests are in flight at once. With the engine's default of 512, every
# new request (priority 1 too) then waited in the generator for a connection: p1 p99 2.5 s, all of it
# outside the stack's hops. 4096 is the gateway's bound per model (ANVIL_MAX_INFLIGHT_PER_MODEL).
MAX_CONNECTIONS = 4096


def run_open(url: str, sched: Schedule, seed: int, model: str = MODEL) -> RunResult:
    wl = Workload(model=model, width=16, priorities=dict(MIX), binary=True, seed=seed)
    engine = Engine(url, wl, request_timeout_s=10.0, max_connections=MAX_CONNECTIONS)
    return asyncio.run(engine.run_open(sched))


def run_c1(url: str, seconds: float) -> dict[str, Any]:
    wl = Workload(model="identity", width=256, priorities={1: 1.0}, binary=True)
    r = asyncio.run(Engine(url, wl, max_connections=1).run_closed(1, seconds))
    s = summarize(r)
    return {"requests": s["ok"], "latency_ms": s["latency_ms"], "hops_ms": s["priorities"]["1"]["hops_ms"]}


_HOP_LINE = re.compile(r'^(anvil_\w+)_hop_us_(sum|count)\{hop="(\w+)",priority="(\w+)"\} (\S+)$')


def hop_totals(env: dict[str, str]) -> dict[tuple[str, str, str], list[float]]:
    """(service, hop, priority) -> [sum µs, count] from the scheduler's and executor's /metrics."""
    out: dict[tuple[str, str, str], list[float]] = {}
    for var in ("ANVIL_SCHEDULER_METRICS_PORT", "ANVIL_EXECUTOR_METRICS_PORT"):
        text = httpx.get(f"http://127.0.0.1:{env[var]}/metrics", timeout=5).text
        for line in text.splitlines():
            m = _HOP_LINE.match(line)
            if m:
                key = (m[1].removeprefix("anvil_"), m[3], m[4])
                out.setdefault(key, [0.0, 0.0])[0 if m[2] == "sum" else 1] = float(m[5])
    return out


def cpu_s(tmp: Path) -> dict[str, float]:
    """CPU seconds (user + system) used so far by each service process of the stack in ``tmp``."""
    doc = json.loads((tmp / "run" / "current.json").read_text())
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for svc in doc["services"]:
        try:
            fields = Path(f"/proc/{svc['pid']}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, KeyError):
            continue
        out[svc["name"]] = (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return out


def hop_means_ms(
    before: dict[Any, list[float]], after: dict[Any, list[float]]
) -> dict[str, dict[str, float]]:
    """Mean ms per priority and '<service>.<hop>' over one run (the difference of the counters)."""
    out: dict[str, dict[str, float]] = {}
    for key, (total, count) in sorted(after.items()):
        t0, c0 = before.get(key, [0.0, 0.0])
        if count > c0:
            out.setdefault(key[2], {})[f"{key[0]}.{key[1]}"] = round((total - t0) / (count - c0) / 1e3, 3)
    return out


def learned_service(env: dict[str, str], model: str = MODEL) -> tuple[sim.ServiceModel, dict[int, float]]:
    """a + b*B fitted to the scheduler's learned profile of `model` (µs per batch size) in Redis, over
    sizes up to 8 when two or more are there: larger ones are seen rarely at these loads, and their
    exported values still lean on the pessimistic prior (10 ms + 1 ms per request)."""
    client = open_redis(env=env)  # the stack's URL and password, from its state file
    full = {int(k): float(v) for k, v in client.hgetall(profile_key(model, "cpu")).items()}
    client.close()
    small = {b: us for b, us in full.items() if b <= 8}
    table = small if len(small) >= 2 else full
    if len(table) < 2:
        one = next(iter(table.values()), 1000.0)
        return sim.ServiceModel(base_ms=one / 1e3, per_item_ms=0.0, max_batch=64), full
    b = np.array(sorted(table), dtype=np.float64)
    y = np.array([table[int(x)] for x in b]) / 1e3
    slope, base = np.polyfit(b, y, 1)
    svc = sim.ServiceModel(base_ms=max(float(base), 0.0), per_item_ms=max(float(slope), 0.0), max_batch=64)
    return svc, full


def simulated(
    kind: str, params: dict[str, Any], name: str, r: RunResult, svc: sim.ServiceModel
) -> dict[str, Any]:
    times = tuple((float(t), int(p)) for t, p in zip(r.intended_s, r.priority, strict=True))
    res = sim.simulate(kind, params, Arrivals(name, times, float(r.intended_s.max())), svc, False)  # type: ignore[arg-type]
    return {
        "goodput_rps": round(res.goodput_rps, 1),
        "p1_attainment": round(res.attainment.get(1, float("nan")), 5),
        "p1_p99_ms": round(res.p1_p99_ms, 2),
    }


def live_row(s: dict[str, Any], duration_s: float) -> dict[str, Any]:
    """The live figures of one run. Goodput is the answers within their SLO over the trace's duration
    (its last intended send), as the simulator counts it; the engine's own figure divides by the span
    to the last answer, which charges a policy for the deadline it keeps work to (EDF+PID answers
    priority 3 up to its 2 s SLO after the trace ends, a fixed delay within ~0.3 s)."""
    pr = s["priorities"]
    good = round(s["slo_attainment"] * s["sent"])  # answers within their SLO

    def p99(p: str) -> float | None:
        return pr[p]["latency_ms"]["p99"] if p in pr else None

    return {
        "sent": s["sent"],
        "good": good,
        "duration_s": round(duration_s, 3),
        "goodput_rps": round(good / max(duration_s, 1e-9), 1),
        "goodput_span_rps": s["goodput_rps"],
        "p1_attainment": pr.get("1", {}).get("slo_attainment"),
        "p1_p99_ms": p99("1"),
        "p2_p99_ms": p99("2"),
        "p3_p99_ms": p99("3"),
        "errors": s["errors"],
        "generator_lag_p99_ms": s["generator"]["lag_ms"]["p99"],
        "hops_ms": {p: d.get("hops_ms", {}) for p, d in pr.items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=8.0, help="seconds of load per trace")
    ap.add_argument("--production-trace", type=Path, default=os.environ.get("ANVIL_PRODUCTION_TRACE"))
    ap.add_argument("--policies", default=",".join(p[0] for p in POLICIES), help="labels to run")
    ap.add_argument("--traces", default="", help="trace names to run (comma-separated); default: all")
    ap.add_argument("--c1-seconds", type=float, default=3.0)
    ap.add_argument(
        "--interleave",
        type=int,
        default=0,
        help="N rounds with every policy's stack up at once, the policies in rotating order per trace "
        "(paired runs: the machine's drift hits every policy alike); 0: one stack after the other",
    )
    ap.add_argument(
        "--model",
        default=MODEL,
        choices=(MODEL, "busy"),
        help="mlp: the stack keeps up with every trace on 2 CPUs (the host's CPU is the limit); busy: "
        "a stand-in device that sleeps t(B) = base + per_row·B (--busy-us), no CPU, so the device is "
        "the limit, as in the simulator",
    )
    ap.add_argument(
        "--busy-us",
        default="4000,1000",
        help="BASE,PER_ROW µs of `busy` (4000,1000: the simulator's service model, 889 req/s at B=32)",
    )
    ap.add_argument(
        "--stack-env",
        action="append",
        default=[],
        metavar="K=V",
        help="an ANVIL_* setting for every stack (repeatable; the policy's own settings win)",
    )
    ap.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="LABEL:K=V[,K=V]",
        help="one more EDF+PID stack with these settings, run as policy LABEL (name it in --policies), "
        "e.g. edf_pid_late:ANVIL_LATE_BINDING=1",
    )
    ap.add_argument("--name", default="live_scheduling", help="result file stem")
    args = ap.parse_args()
    model_env = dict(kv.split("=", 1) for kv in args.stack_env)
    if args.model == "busy":
        base_us, _, per_row_us = args.busy_us.partition(",")
        model_env |= {
            "ANVIL_MODELS": "identity,mlp,busy",
            "ANVIL_BUSY_BASE_US": str(int(base_us)),
            "ANVIL_BUSY_PER_ROW_US": str(int(per_row_us)),
        }
    prod = Path(args.production_trace) if args.production_trace else None
    if prod is not None and not prod.is_file():
        raise SystemExit(f"--production-trace {prod}: no such file")
    variants = []
    for text in args.variant:
        label, _, pairs = text.partition(":")
        env = {"ANVIL_POLICY": "edf_pid"} | dict(kv.split("=", 1) for kv in pairs.split(",") if kv)
        variants.append((label, env, "edf_pid", {}))
    chosen = [p for p in (*POLICIES, *variants) if p[0] in args.policies.split(",")]
    picked = [
        (n, sc) for n, sc in traces(args.seconds, prod) if not args.traces or n in args.traces.split(",")
    ]
    rows: list[dict[str, Any]] = []
    c1: dict[str, Any] = {}
    stacks: dict[str, tuple[subprocess.Popen[str], dict[str, str], Path]] = {}
    try:
        if args.interleave:  # every policy's stack up at once; each round runs them in rotating order
            for label, env_extra, _, _ in chosen:
                tmp = Path(tempfile.mkdtemp(prefix="anvil-live-"))
                stacks[label] = (*start_stack(tmp, {**model_env, **env_extra}), tmp)
            for label, *_ in chosen:
                c1[label] = run_c1(_url(stacks[label][1]), args.c1_seconds)
                print(f"{label} c1: {c1[label]['latency_ms']}", flush=True)
            for rnd in range(args.interleave):
                for name, sched in picked:
                    k = (rnd + len(rows)) % len(chosen)
                    for label, _, kind, params in chosen[k:] + chosen[:k]:
                        _, env, tmp = stacks[label]
                        rows.append(
                            measure(label, kind, params, name, sched, env, tmp, len(rows), rnd, args.model)
                        )
            return write(args, rows, c1, prod)
        for label, env_extra, kind, params in chosen:
            tmp = Path(tempfile.mkdtemp(prefix="anvil-live-"))
            stacks = {label: (*start_stack(tmp, {**model_env, **env_extra}), tmp)}
            c1[label] = run_c1(_url(stacks[label][1]), args.c1_seconds)
            print(f"{label} c1: {c1[label]['latency_ms']}", flush=True)
            for name, sched in picked:
                env = stacks[label][1]
                rows.append(measure(label, kind, params, name, sched, env, tmp, len(rows), 0, args.model))
            stop_stack(stacks.pop(label)[0])
    finally:
        for proc, *_ in stacks.values():
            stop_stack(proc)
    write(args, rows, c1, prod)


def _url(env: dict[str, str]) -> str:
    return f"http://127.0.0.1:{env['ANVIL_HTTP_PORT']}"


def measure(
    label: str,
    kind: str,
    params: dict[str, Any],
    name: str,
    sched: Schedule,
    env: dict[str, str],
    tmp: Path,
    seed: int,
    rnd: int,
    model: str = MODEL,
) -> dict[str, Any]:
    """One open-loop run of trace `name` against the stack of policy `label`: the live row, the
    services' hops and CPU, the learned profile and the simulator's prediction for the same arrivals."""
    before, cpu0 = hop_totals(env), cpu_s(tmp)
    r = run_open(_url(env), sched, seed=seed, model=model)
    row: dict[str, Any] = {
        "policy": label,
        "trace": name,
        "round": rnd,
        "live": live_row(summarize(r), float(r.intended_s.max())),
    }
    row["service_hops_mean_ms"] = hop_means_ms(before, hop_totals(env))
    row["load_average_1m"] = round(os.getloadavg()[0], 2)  # others' work on the machine
    cpu1 = cpu_s(tmp)
    row["cpu_us_per_request"] = {
        k: round((cpu1[k] - cpu0.get(k, 0.0)) * 1e6 / max(1, len(r.status)))
        for k in ("gateway", "scheduler", "executor")
        if k in cpu1
    }
    svc, table = learned_service(env, model)
    row["profile"] = {"base_ms": round(svc.base_ms, 4), "per_item_ms": round(svc.per_item_ms, 4)}
    row["profile_us"] = {str(b): us for b, us in sorted(table.items())}
    row["sim"] = simulated(kind, params, name, r, svc)
    brief = {k: v for k, v in row["live"].items() if k != "hops_ms"}
    print(
        json.dumps({"policy": label, "trace": name, "round": rnd, "live": brief, "sim": row["sim"]}),
        flush=True,
    )
    time.sleep(1.0)  # let the queues drain before the next run
    return row


def _commit() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return out.stdout.strip()


def write(
    args: argparse.Namespace, rows: list[dict[str, Any]], c1: dict[str, Any], prod: Path | None
) -> None:
    meta = {
        "command": "uv run python bench/live_scheduling.py " + " ".join(sys.argv[1:]),
        "commit": _commit(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "model": args.model if args.model != "busy" else f"busy, t(B) = {args.busy_us} (base, per row) µs",
        "seconds_per_trace": args.seconds,
        "generator_max_connections": MAX_CONNECTIONS,
        "stack_env": " ".join(args.stack_env) or "-",
        "production_trace": prod.name if prod else None,
        # what else ran on the machine is not known to the script: the load average at the end says how busy
        "note": "generator on the same machine, sharing its CPUs with the stacks and any other work; "
        f"1-min load average at the end {os.getloadavg()[0]:.2f}",
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(
        json.dumps({"meta": meta, "rows": rows, "c1": c1}, indent=1) + "\n"
    )
    md = [f"# Live scheduling: policies on the real stack ({meta['commit']})", ""]
    md += [f"- {k}: {v}" for k, v in meta.items()] + [""]
    md += ["Goodput: answers within their SLO per second of trace (as the simulator counts); in brackets "
           "per second up to the last answer (the load engine's figure).", ""]  # fmt: skip
    md += ["| trace | policy | sent | goodput live | sim | p1 attain. live | sim | p1 p99 ms live | sim | "
           "p2 p99 | p3 p99 | profile a + b·B (ms) | errors |", "|" + "---|" * 13]  # fmt: skip
    for r in rows:
        lv, sm = r["live"], r["sim"]
        errs = ", ".join(f"{k} x{v}" for k, v in lv["errors"].items()) or "-"
        md.append(
            f"| {r['trace']} | {r['policy']} | {lv['sent']} | "
            f"{lv['goodput_rps']} ({lv.get('goodput_span_rps', '-')}) | {sm['goodput_rps']} | "
            f"{lv['p1_attainment']} | {sm['p1_attainment']} | {lv['p1_p99_ms']} | {sm['p1_p99_ms']} | "
            f"{lv['p2_p99_ms']} | {lv['p3_p99_ms']} | "
            f"{r['profile']['base_ms']} + {r['profile']['per_item_ms']}·B | {errs} |"
        )
    md += ["", "## Goodput of EDF+PID over the best fixed_delay setting, per trace (medians of rounds)", ""]
    md += ["The ceiling is the offered load (requests sent / seconds of trace) over the best fixed delay's "
           "goodput: what a policy answering every request within its SLO would reach.", ""]  # fmt: skip
    for trace in dict.fromkeys(r["trace"] for r in rows):

        def med(policy: str, key: str, trace: str = trace) -> float | None:
            vals = [r["live"][key] for r in rows if (r["trace"], r["policy"]) == (trace, policy)]
            vals = [v for v in vals if v is not None]
            return statistics.median(vals) if vals else None

        ours = med("edf_pid", "goodput_rps")
        fixed = [g for p in dict.fromkeys(r["policy"] for r in rows) if p.startswith("fixed")
                 if (g := med(p, "goodput_rps")) is not None]  # fmt: skip
        sent, span = med("edf_pid", "sent"), med("edf_pid", "duration_s")
        if ours is not None and fixed and max(fixed) > 0:
            # a policy that answered every request in time has goodput = offered: no ratio exceeds this
            ceiling = f", ceiling {sent / span / max(fixed):.2f}x" if sent and span else ""
            md.append(f"- {trace}: {ours / max(fixed):.2f}x{ceiling}")
    if any(r.get("round", 0) for r in rows):
        md += ["", "## Per policy over the rounds (median, min-max)", ""]
        md += [
            "| trace | policy | rounds | goodput | p1 attainment | p1 p99 ms | p3 p99 ms |",
            "|" + "---|" * 7,
        ]
        for trace in dict.fromkeys(r["trace"] for r in rows):
            for policy in dict.fromkeys(r["policy"] for r in rows):
                sel = [r["live"] for r in rows if (r["trace"], r["policy"]) == (trace, policy)]
                cells = []
                for key in ("goodput_rps", "p1_attainment", "p1_p99_ms", "p3_p99_ms"):
                    vals = [v[key] for v in sel if v[key] is not None]
                    cells.append(
                        f"{statistics.median(vals):g} ({min(vals):g}-{max(vals):g})" if vals else "-"
                    )
                md.append(f"| {trace} | {policy} | {len(sel)} | " + " | ".join(cells) + " |")
    md += ["", "## Where the time goes (EDF+PID, ms p50 / p99 per hop, from the gateway's header)", ""]
    md += [
        "| trace | priority | gateway_in | scheduler_queue | compute | transit | outside |",
        "|" + "---|" * 7,
    ]
    for r in rows:
        if r["policy"] != "edf_pid":
            continue
        for p, hops in sorted(r["live"]["hops_ms"].items()):
            cells = [f"{hops[h]['p50']} / {hops[h]['p99']}" if h in hops else "-" for h in
                     ("gateway_in", "scheduler_queue", "compute", "transit", "outside")]  # fmt: skip
            md.append(f"| {r['trace']} | {p} | " + " | ".join(cells) + " |")
    md += ["", "## Behind the gateway (EDF+PID, mean ms per priority, from the services' hop histograms)", ""]
    md += ["executor_round_trip: the scheduler's dispatch -> result; executor queued: received -> compute "
           "starts (by the batch's most urgent priority).", ""]  # fmt: skip
    names = ("scheduler.queue", "scheduler.executor_round_trip", "executor.queued", "executor.compute")
    md += ["| trace | priority | " + " | ".join(names) + " |", "|" + "---|" * (2 + len(names))]
    for r in rows:
        if r["policy"] == "edf_pid":
            for p, hops in sorted(r.get("service_hops_mean_ms", {}).items()):
                md.append(
                    f"| {r['trace']} | {p} | " + " | ".join(str(hops.get(n, "-")) for n in names) + " |"
                )
    md += [
        "",
        "## CPU per request sent (µs, from /proc: user + system over the run), and the machine's load",
        "",
    ]
    md += [
        "| trace | policy | gateway | scheduler | executor | 1-min load average after |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        c = r.get("cpu_us_per_request", {})
        cells = " | ".join(str(c.get(k, "-")) for k in ("gateway", "scheduler", "executor"))
        md.append(f"| {r['trace']} | {r['policy']} | {cells} | {r.get('load_average_1m', '-')} |")
    md += ["", "## Lone request (identity, 1 KB binary, closed loop, concurrency 1)", ""]
    md += ["| policy | requests | p50 ms | p99 ms | gateway_in p50 | queue p50 | compute p50 | transit p50 | "
           "outside p50 |", "|" + "---|" * 9]  # fmt: skip
    for label, d in c1.items():
        h = d["hops_ms"]
        cells = [str(h[k]["p50"]) if k in h else "-" for k in
                 ("gateway_in", "scheduler_queue", "compute", "transit", "outside")]  # fmt: skip
        md.append(f"| {label} | {d['requests']} | {d['latency_ms']['p50']} | {d['latency_ms']['p99']} | "
                  + " | ".join(cells) + " |")  # fmt: skip
    if prod is None:
        md += ["", "(production rows left out: no --production-trace / ANVIL_PRODUCTION_TRACE given)"]
    (RESULTS / f"{args.name}.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
