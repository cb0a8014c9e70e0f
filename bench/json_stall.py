"""Event-loop stall of the gateway while it takes a large JSON body (issue #18).

A gateway process (uvicorn + uvloop + httptools, as `python -m anvil_gateway` runs it; no scheduler,
the models set by hand) receives a ~20 MiB KServe JSON body (FP32, `--elements` numbers) while a
second connection probes `GET /v2/health/live` every 5 ms (and for 1 s before it, with nothing
in flight: the machine's own floor, "idle probe"). The probe's worst and p99 latency during
the request are the loop's stall; the request's own time is the parse (the answer is a 503: no
scheduler). Two gateways are measured in the same run with the same body: `inline` parses on the
event loop in one piece as before #18 (ANVIL_PARSE_OFFLOAD_BYTES above the body size) and `stepped`
is the default (json_bulk steps of ~1 ms on the event loop, other tasks run between them). Medians
over the runs, and the worst probe of all runs. Writes bench/results/json_stall.{json,md}.

    uv run python bench/json_stall.py [--elements 1000000] [--repeats 10]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"


def serve(port: int) -> None:
    import uvicorn

    from anvil_core.model_spec import ModelSpec, TensorSpec
    from anvil_gateway.app import create_app
    from anvil_gateway.http_protocol import CoalescingHttpToolsProtocol
    from anvil_gateway.settings import GatewaySettings

    # no lifespan below and no scheduler: the link is never used, so it needs no CURVE keys
    app = create_app(GatewaySettings(redis_url="redis://127.0.0.1:1/0", zmq_curve=False))
    app.state.gw.discovery.models = {
        "big": ModelSpec("big", max_batch=0, inputs=(TensorSpec("x", "FP32", (-1,)),), outputs=())
    }
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=port,
        loop="uvloop",
        http=CoalescingHttpToolsProtocol,
        lifespan="off",
        log_config=None,
        access_log=False,
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def measure(port: int, body: bytes, repeats: int) -> list[dict[str, float]]:
    url = f"http://127.0.0.1:{port}"
    runs = []
    with httpx.Client(base_url=url, timeout=60) as probe, httpx.Client(base_url=url, timeout=60) as big:
        for _ in range(repeats):
            lat: list[float] = []
            done = threading.Event()
            took: list[float] = []

            def post(done: threading.Event = done, took: list[float] = took) -> None:
                t0 = time.perf_counter()
                r = big.post("/v2/models/big/infer", content=body)
                took.append(time.perf_counter() - t0)
                assert r.status_code == 503, r.text[:200]
                done.set()

            idle: list[float] = []  # the same probe with no request in flight: the machine's floor
            until = time.perf_counter() + 1.0
            while time.perf_counter() < until:
                t = time.perf_counter()
                probe.get("/v2/health/live")
                idle.append(time.perf_counter() - t)
                time.sleep(0.005)
            thread = threading.Thread(target=post)
            thread.start()
            while not done.is_set():
                t = time.perf_counter()
                probe.get("/v2/health/live")
                lat.append(time.perf_counter() - t)
                time.sleep(0.005)
            thread.join()
            runs.append(
                {
                    "request_ms": took[0] * 1e3,
                    "probe_max_ms": max(lat) * 1e3,
                    "probe_p99_ms": float(np.percentile(lat, 99)) * 1e3,
                    "probe_median_ms": statistics.median(lat) * 1e3,
                    "probes": len(lat),
                    "idle_probe_max_ms": max(idle) * 1e3,
                    "idle_probe_p99_ms": float(np.percentile(idle, 99)) * 1e3,
                }
            )
    return runs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--elements", type=int, default=1_000_000)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--serve", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        return serve(args.serve)
    load_start = os.getloadavg()[0]
    data = np.random.default_rng(0).standard_normal(args.elements).tolist()
    body = json.dumps(
        {"inputs": [{"name": "x", "datatype": "FP32", "shape": [args.elements], "data": data}]}
    ).encode()
    results: dict[str, Any] = {}
    for label, offload in [("inline", str(len(body) * 2)), ("stepped", "65536")]:
        port = _free_port()
        env = {**os.environ, "ANVIL_PARSE_OFFLOAD_BYTES": offload, "ANVIL_MAX_BODY_BYTES": str(256 << 20)}
        proc = subprocess.Popen([sys.executable, __file__, "--serve", str(port)], env=env)
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    httpx.get(f"http://127.0.0.1:{port}/v2/health/live", timeout=1)
                    break
                except httpx.HTTPError:
                    if proc.poll() is not None:
                        raise SystemExit(f"the {label} gateway exited with code {proc.returncode}") from None
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
            measure(port, body, 1)  # warm-up: FastAPI builds its route models on first use
            results[label] = measure(port, body, args.repeats)
        finally:
            proc.terminate()
            proc.wait(10)
    summary = {
        label: {
            k: statistics.median(r[k] for r in runs)
            for k in ("request_ms", "probe_max_ms", "probe_p99_ms", "probe_median_ms", "idle_probe_max_ms")
        }
        for label, runs in results.items()
    }
    for label, runs in results.items():
        summary[label]["probe_max_ms_worst_run"] = max(r["probe_max_ms"] for r in runs)
        summary[label]["runs_over_50ms"] = sum(r["probe_max_ms"] >= 50 for r in runs)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    doc = {
        "command": " ".join(
            ["flock /tmp/anvil-timing.lock uv run python bench/json_stall.py", *sys.argv[1:]]
        ),
        "commit": commit,
        "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cpus, "
        f"load average {load_start:.1f} at the start, {os.getloadavg()[0]:.1f} at the end "
        "(other work shared the machine)",
        "body_mib": round(len(body) / 2**20, 2),
        "runs": results,
        "medians": summary,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "json_stall.json").write_text(json.dumps(doc, indent=2))
    lines = [
        f"# JSON body stall ({doc['body_mib']} MiB FP32 body, {args.repeats} runs, medians)",
        "",
        f"`{doc['command']}` at {commit}; {doc['machine']}",
        "",
        "| gateway | request ms | probe max ms | worst run's probe max ms | runs with a probe >= 50 ms "
        "| probe p99 ms | probe median ms | idle probe max ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, s in summary.items():
        lines.append(
            f"| {label} | {s['request_ms']:.0f} | {s['probe_max_ms']:.1f} "
            f"| {s['probe_max_ms_worst_run']:.1f} | {s['runs_over_50ms']} of {args.repeats} "
            f"| {s['probe_p99_ms']:.1f} "
            f"| {s['probe_median_ms']:.2f} | {s['idle_probe_max_ms']:.1f} |"
        )
    ratio = summary["inline"]["probe_max_ms"] / max(summary["stepped"]["probe_max_ms"], 1e-3)
    worst = summary["stepped"]["probe_max_ms"]
    lines += [
        "",
        f"worst probe, inline / stepped: {ratio:.1f}x (medians of runs)",
        f"stepped: the loop answered the probe within {worst:.1f} ms at worst (median of runs; "
        f"{summary['stepped']['probe_max_ms_worst_run']:.1f} ms in the worst run) while taking the body; "
        f"target < 50 ms: {'met' if worst < 50 else 'missed'} in the median, "
        f"{summary['stepped']['runs_over_50ms']} of {args.repeats} runs over (the idle probe's worst, "
        f"{summary['stepped']['idle_probe_max_ms']:.1f} ms, is the machine's own floor)",
    ]
    (RESULTS / "json_stall.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
