"""`anvil bench`: open- or closed-loop load against a running stack, with a report and plots."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from anvil_client.bench.arrivals import PATTERNS, schedule
from anvil_client.bench.engine import Engine, Progress, RunResult
from anvil_client.bench.report import summarize, write_reports
from anvil_client.bench.scrape import BatchSamples, scrape_loop
from anvil_client.bench.workload import Workload, parse_mix
from anvil_client.bench.zerocopy import ZeroCopySender, discover_endpoint
from anvil_core.zerocopy import ZeroCopyError

__all__ = ["add_bench_command", "cmd_bench", "run_load"]


def _state() -> dict[str, Any]:
    root = Path(os.environ.get("ANVIL_RUN_ROOT", ".anvil/run")).resolve()
    try:
        doc = json.loads((root / "current.json").read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def default_urls(state: dict[str, Any]) -> tuple[str, str | None]:
    """Gateway URL and scheduler metrics URL from the launcher's state file (or the defaults)."""
    url = str(state.get("gateway") or "http://127.0.0.1:8000")
    for svc in state.get("services", []):
        if svc.get("name") == "scheduler" and svc.get("env", {}).get("ANVIL_METRICS_PORT"):
            return url, f"http://127.0.0.1:{svc['env']['ANVIL_METRICS_PORT']}/metrics"
    return url, None


def model_width(url: str, model: str) -> int:
    """The last input dimension the model declares (16 when it is variable, like identity's)."""
    import httpx

    try:
        meta = httpx.get(f"{url}/v2/models/{model}", timeout=5).json()
        dim = int(meta["inputs"][0]["shape"][-1])
    except (httpx.HTTPError, KeyError, IndexError, ValueError, TypeError):
        return 16
    return dim if dim > 0 else 16


def add_bench_command(sub: Any) -> None:
    p = sub.add_parser("bench", help="load a running stack; JSON + Markdown/HTML report with plots")
    p.add_argument("--url", help="gateway URL (default: the running stack's, else http://127.0.0.1:8000)")
    p.add_argument("--model", default="mlp")
    p.add_argument("--rows", type=int, default=1, help="rows per request")
    p.add_argument("--width", type=int, help="features per row (default: from the model's metadata)")
    p.add_argument(
        "--pattern", choices=PATTERNS, default=None, help="arrivals (default: poisson; trace with --trace)"
    )
    p.add_argument(
        "--rate",
        type=float,
        default=None,
        help="mean offered load, req/s (default 200; a trace: as recorded)",
    )
    p.add_argument("--duration", type=float, default=10.0, help="seconds of load")
    p.add_argument("--burst-factor", type=float, default=4.0, help="step: rate multiplier in the burst")
    p.add_argument("--period", type=float, default=2.0, help="onoff: seconds per on+off cycle")
    p.add_argument(
        "--trace",
        type=Path,
        help="replay this file of send offsets in s, one per line, each optionally followed by its "
        "priority 1-3 (which then replace --priority-mix); rescaled to a mean of --rate req/s when given",
    )
    p.add_argument("--concurrency", type=int, help="closed loop with N clients instead of open loop")
    p.add_argument("--priority-mix", default="2", help="e.g. 1:0.2,2:0.5,3:0.3 (weights)")
    p.add_argument("--tenant-key", action="append", default=[], help="API key (repeat: round-robin)")
    p.add_argument("--timeout-us", type=int, help="parameters.timeout of every request, µs")
    p.add_argument("--binary", action="store_true", help="binary tensor extension instead of JSON data")
    p.add_argument("--no-priority", action="store_true", help="send no parameters.priority (peers)")
    p.add_argument("--protocol", choices=("http", "zerocopy"), default="http")
    p.add_argument(
        "--zerocopy-endpoint",
        help="the gateway's ZeroCopy socket (default: the one the running stack's gateway registered)",
    )
    p.add_argument(
        "--max-connections", type=int, default=512, help="HTTP connections, or ZeroCopy slots per region"
    )
    p.add_argument("--request-timeout", type=float, default=30.0, help="client-side limit, s")
    p.add_argument("--scheduler-metrics", help="scheduler /metrics URL (default: from the state file)")
    p.add_argument("--out", type=Path, default=Path("bench/results"), help="report directory")
    p.add_argument("--name", help="report file stem (default: bench_<time>)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quiet", action="store_true", help="no live progress")
    p.set_defaults(fn=cmd_bench)


async def run_load(
    engine: Engine,
    args: argparse.Namespace,
    scheduler_metrics: str | None,
    on_tick: Any = None,
) -> tuple[RunResult, BatchSamples | None]:
    """One run (open loop unless args.concurrency), scraping the scheduler alongside."""
    loop = asyncio.get_running_loop()
    batches = BatchSamples() if scheduler_metrics else None
    scraper = None
    if scheduler_metrics and batches is not None:
        scraper = asyncio.create_task(scrape_loop(scheduler_metrics, engine.wl.model, loop.time(), batches))
    try:
        if args.concurrency:
            result = await engine.run_closed(args.concurrency, args.duration, on_tick)
        else:
            sched = schedule(
                args.pattern,
                args.rate,
                args.duration,
                seed=args.seed,
                burst_factor=args.burst_factor,
                period_s=args.period,
                trace=args.trace,
                trace_rate_rps=args.trace_rate,
            )
            result = await engine.run_open(sched, on_tick)
    finally:
        if scraper:
            scraper.cancel()
    return result, batches


def resolve_arrivals(args: argparse.Namespace) -> None:
    """Fill args.pattern, args.rate and args.trace_rate: a trace file implies the trace pattern (it
    was silently ignored under the default Poisson load), and --rate then rescales the trace."""
    if args.trace is not None:
        if args.pattern not in (None, "trace"):
            raise ValueError(f"--trace replays a file; it cannot be combined with --pattern {args.pattern}")
        args.pattern, args.trace_rate, args.rate = "trace", args.rate, args.rate or 0.0
        return
    if args.pattern == "trace":
        raise ValueError("--pattern trace needs --trace FILE")
    args.pattern = args.pattern or "poisson"
    args.rate = 200.0 if args.rate is None else args.rate
    args.trace_rate = None


def cmd_bench(args: argparse.Namespace) -> int:
    try:
        resolve_arrivals(args)
    except ValueError as exc:
        print(f"anvil bench: {exc}", file=sys.stderr)
        return 2
    state = _state()
    url, sched_metrics = default_urls(state)
    url = (args.url or url).rstrip("/")
    sched_metrics = args.scheduler_metrics or (None if args.url else sched_metrics)
    try:
        wl = Workload(
            model=args.model,
            rows=args.rows,
            width=args.width or model_width(url, args.model),
            priorities=parse_mix(args.priority_mix),
            tenant_keys=list(args.tenant_key),
            timeout_us=args.timeout_us,
            binary=args.binary,
            send_priority=not args.no_priority,
            seed=args.seed,
        )
        zc = _zerocopy(args, state, wl) if args.protocol == "zerocopy" else None
        engine = Engine(
            url, wl, max_connections=args.max_connections, request_timeout_s=args.request_timeout, zerocopy=zc
        )
    except ValueError as exc:
        print(f"anvil bench: {exc}", file=sys.stderr)
        return 2
    name = args.name or time.strftime("bench_%Y%m%d-%H%M%S")
    try:
        result, batches = _run_with_progress(engine, args, sched_metrics)
    except (ValueError, OSError, ZeroCopyError) as exc:
        print(f"anvil bench: {exc}", file=sys.stderr)
        return 2
    summary = summarize(result, timeout_us=args.timeout_us)
    summary.update(
        {"url": url, "protocol": args.protocol, "model": args.model, "rows": args.rows, "binary": args.binary}
    )
    if zc is not None:
        summary["zerocopy_endpoint"] = zc.endpoint
    paths = write_reports(args.out, name, summary, result, batches)
    _print_summary(summary)
    print("report: " + ", ".join(str(p) for p in paths))
    return 0


def _zerocopy(args: argparse.Namespace, state: dict[str, Any], wl: Workload) -> ZeroCopySender:
    endpoint = args.zerocopy_endpoint
    if endpoint is None and state.get("redis_url"):
        endpoint = discover_endpoint(str(state["redis_url"]))
    if not endpoint:
        raise ValueError("no ZeroCopy endpoint: pass --zerocopy-endpoint, or start the stack (`make up`)")
    return ZeroCopySender(endpoint, wl, args.max_connections, args.request_timeout)


def _run_with_progress(
    engine: Engine, args: argparse.Namespace, sched_metrics: str | None
) -> tuple[RunResult, BatchSamples | None]:
    try:
        import uvloop

        runner: Any = uvloop.run
    except ImportError:
        runner = asyncio.run
    if args.quiet or not sys.stdout.isatty():
        return runner(run_load(engine, args, sched_metrics))  # type: ignore[no-any-return]
    from rich.live import Live
    from rich.table import Table

    def render(p: Progress) -> Table:
        t = Table(title=f"anvil bench {engine.wl.model} ({args.duration:g} s)")
        for col in ("elapsed s", "sent", "answered", "200", "errors", "in flight", "max gen lag ms"):
            t.add_column(col, justify="right")
        t.add_row(
            f"{p.elapsed_s:.1f}",
            *map(str, (p.sent, p.done, p.ok, p.errors, p.inflight)),
            f"{p.max_lag_ms:.1f}",
        )
        return t

    with Live(render(Progress(0, 0, 0, 0, 0, 0, 0.0)), refresh_per_second=4) as live:
        return runner(run_load(engine, args, sched_metrics, lambda p: live.update(render(p))))  # type: ignore[no-any-return]


def _print_summary(s: dict[str, Any]) -> None:
    lat = s["latency_ms"]
    print(
        f"sent {s['sent']}  ok {s['ok']}  throughput {s['throughput_rps']} req/s  "
        f"goodput {s['goodput_rps']} req/s  p50 {lat['p50']} ms  p99 {lat['p99']} ms  "
        f"SLO attainment {s['slo_attainment']}"
    )
    for p, d in s["priorities"].items():
        print(
            f"  priority {p}: p99 {d['latency_ms']['p99']} ms, SLO {d['slo_ms']:g} ms, "
            f"attainment {d['slo_attainment']}"
        )
        hops = {k: v for k, v in d.get("hops_ms", {}).items() if k != "requests"}
        if hops:
            print("    hops ms p50/p99: " + ", ".join(f"{k} {v['p50']}/{v['p99']}" for k, v in hops.items()))
    if s["errors"]:
        print("  errors: " + ", ".join(f"{k} x{v}" for k, v in s["errors"].items()))
    print("  generator lag ms: p99 {p99} max {max}".format(**s["generator"]["lag_ms"]))
