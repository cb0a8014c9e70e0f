"""What OpenTelemetry tracing costs (issue #20): CPU per request of the request path (gateway +
scheduler + executor processes), in the same run, on `bench/gateway_overhead.py`'s machinery (as
`bench/auth_overhead.py`): three stacks (`anvil up`, free ports) side by side, wrk driving HTTP
binary `identity` requests (1 KB), the order of the stacks rotating every round.

- `off`: no OTEL_* variable: the default (anvil_core.tracing: no SDK, one shared no-op);
- `on`: OTEL_EXPORTER_OTLP_ENDPOINT set, every request sampled (the SDK's default sampler,
  parentbased_always_on), spans exported over OTLP/HTTP to a sink in this script that answers 200;
- `unsampled`: the endpoint set with OTEL_TRACES_SAMPLER=always_off: contexts still travel, spans
  are created non-recording and nothing is exported (the cost floor of sampling a small share).

CPU per request = (utime + stime of the three processes over a round, from /proc/<pid>/stat) /
requests completed in the round (wrk's count; any non-2xx fails the run). Medians over rounds.
The off path's own work per request (four no-op span contexts, one traceparent() call) is timed
alone with timeit and reported beside.

    flock /tmp/anvil-timing.lock uv run python bench/tracing_cost.py [--seconds 5] [--rounds 3]

Writes bench/results/tracing_cost.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import timeit
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from auth_overhead import cpu_per_request_ab  # noqa: E402
from gateway_overhead import RESULTS  # noqa: E402

LOADS = (("1KB", 256, 1), ("1KB", 256, 16))  # size, FP32 elements, conns


class _Sink(BaseHTTPRequestHandler):
    """An OTLP/HTTP endpoint that takes every export and answers 200 (nothing decoded)."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", "0")))
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def off_path_ns() -> float:
    """ns per request of what the gateway's request path does for tracing when it is off."""
    from anvil_core import tracing

    def request() -> None:
        for _ in range(4):  # gateway.parse, .admit, .dispatch, .answer
            with tracing.span("gateway.x"):
                pass
        tracing.traceparent()

    n = 200_000
    return min(timeit.repeat(request, number=n, repeat=5)) / n * 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is required (apt-get install wrk)")
    sink = ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{sink.server_address[1]}"
    modes = {
        "off": {},
        "on": {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint},
        "unsampled": {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_TRACES_SAMPLER": "always_off"},
    }
    tmp = Path(tempfile.mkdtemp(prefix="anvil-trace-bench-"))
    try:
        rows = cpu_per_request_ab(modes, "tracing", tmp, args.rounds, args.seconds, LOADS)
    finally:
        sink.shutdown()
    write(rows, list(modes), off_path_ns(), args)


def write(rows: list[dict[str, Any]], modes: list[str], off_ns: float, args: argparse.Namespace) -> None:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    meta = {
        "command": "flock /tmp/anvil-timing.lock uv run python bench/tracing_cost.py "
        f"--seconds {args.seconds} --rounds {args.rounds}",
        "commit": commit.stdout.strip(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.node()}",
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "off_path_ns_per_request": off_ns,
    }
    summary = []
    for size, _, conns in LOADS:

        def med(mode: str, key: str, size: str = size, conns: int = conns) -> float:
            return statistics.median(
                r[key] for r in rows if (r["size"], r["conns"], r["tracing"]) == (size, conns, mode)
            )

        row: dict[str, Any] = {"size": size, "conns": conns}
        for mode in modes:
            row[f"cpu_us_{mode}"] = med(mode, "cpu_us_per_request")
            row[f"rps_{mode}"] = med(mode, "rps")
        for mode in ("on", "unsampled"):
            row[f"cpu_ratio_{mode}"] = row[f"cpu_us_{mode}"] / row["cpu_us_off"]
        summary.append(row)
    RESULTS.mkdir(parents=True, exist_ok=True)
    doc = {"meta": meta, "summary": summary, "rows": rows}
    (RESULTS / "tracing_cost.json").write_text(json.dumps(doc, indent=1))
    lines = [
        "# CPU per request with OpenTelemetry tracing",
        "",
        f"{meta['date']}, commit {meta['commit']}, {meta['machine']}, Python {meta['python']}. "
        f"`{meta['command']}`. The three stacks, wrk, the OTLP sink and any other work on the machine "
        "shared its cores; the order rotates every round. CPU = gateway + scheduler + executor "
        "processes, HTTP binary `identity` requests (1 KB); medians of the rounds. `off`: no OTEL_* "
        "variable; `on`: exported over OTLP/HTTP, every request sampled; `unsampled`: the endpoint "
        "set with OTEL_TRACES_SAMPLER=always_off.",
        "",
        "| size | conns | CPU us/req off | on | unsampled | on / off | unsampled / off "
        "| req/s off | on | unsampled |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in summary:
        lines.append(
            f"| {s['size']} | {s['conns']} | {s['cpu_us_off']:.0f} | {s['cpu_us_on']:.0f} | "
            f"{s['cpu_us_unsampled']:.0f} | {s['cpu_ratio_on']:.3f} | {s['cpu_ratio_unsampled']:.3f} | "
            f"{s['rps_off']:.0f} | {s['rps_on']:.0f} | {s['rps_unsampled']:.0f} |"
        )
    lines += [
        "",
        f"Tracing off, the gateway's request path does {off_ns:.0f} ns of tracing work per request "
        "(four no-op span contexts and one traceparent() call, timed alone with timeit, best of 5).",
    ]
    (RESULTS / "tracing_cost.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
