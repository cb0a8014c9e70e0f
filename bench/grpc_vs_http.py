"""gRPC vs HTTP at the gateway: the `identity` model, a 1 KB FP32 input (1 x 256), concurrency 1 and
16, over KServe v2 gRPC (raw_input_contents) and KServe v2 HTTP (binary tensor extension), measured
in the same run against the same stack, alternating the two in rounds so that drift on a shared
machine hits both alike.

Both clients are Python asyncio in one process and pre-encode their request once: HTTP on
`anvil_client.rawhttp` (16 keep-alive connections at c16), gRPC on a grpc.aio channel with
tritonclient's generated messages (one HTTP/2 connection, 16 calls in flight at c16: how
tritonclient.grpc and perf_analyzer use a channel). The script starts its own stack (`anvil up` on
free ports) and writes bench/results/grpc_vs_http.{json,md}. A second stack with the gRPC endpoint
off (ANVIL_GRPC_PORT=0) runs beside it, its HTTP measured in the same rounds ("http_nogrpc"): what
serving gRPC costs the HTTP path (the grpc.aio server shares the gateway's loop and process).

    flock /tmp/anvil-timing.lock uv run python bench/grpc_vs_http.py [--seconds 4] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
from gateway_overhead import start_stack  # same directory: the bench scripts' stack starter

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
ELEMENTS = 256  # FP32: 1 KB
CONCURRENCY = (1, 16)


def http_request() -> tuple[bytes, dict[str, str]]:
    x = np.random.default_rng(0).standard_normal((1, ELEMENTS)).astype(np.float32)
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "datatype": "FP32",
                    "shape": [1, ELEMENTS],
                    "parameters": {"binary_data_size": x.nbytes},
                }
            ],
            "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
            "parameters": {"priority": 3},  # batch class: its SLO is 30 s in start_stack's stack
        }
    ).encode()
    headers = {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(len(head))}
    return head + x.tobytes(), headers


def grpc_request() -> Any:
    from tritonclient.grpc import service_pb2

    x = np.random.default_rng(0).standard_normal((1, ELEMENTS)).astype(np.float32)
    req = service_pb2.ModelInferRequest(model_name="identity")
    req.inputs.add(name="INPUT0", datatype="FP32", shape=[1, ELEMENTS])
    req.outputs.add(name="OUTPUT0")
    req.raw_input_contents.append(x.tobytes())
    req.parameters["priority"].int64_param = 3
    return req


async def drive(call: Callable[[], Awaitable[bool]], conns: int, seconds: float) -> dict[str, float]:
    """`conns` loops calling `call` (True: answered) for `seconds`; latencies of answered calls."""
    lat: list[float] = []
    failed = 0
    stop = time.monotonic() + seconds

    async def worker() -> None:
        nonlocal failed
        while time.monotonic() < stop:
            t0 = time.perf_counter()
            if await call():
                lat.append(time.perf_counter() - t0)
            else:
                failed += 1

    for _ in range(20):  # warm-up: connections, first batches
        await call()
    t0 = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(conns)))
    elapsed = time.monotonic() - t0
    a = np.sort(np.array(lat)) * 1e3
    return {
        "p50_ms": float(np.percentile(a, 50)),
        "p99_ms": float(np.percentile(a, 99)),
        "rps": len(a) / elapsed,
        "failed": failed,
    }


async def http_point(url: str, conns: int, seconds: float) -> dict[str, float]:
    from anvil_client.rawhttp import RawHttpPool

    body, headers = http_request()
    pool = RawHttpPool(url, size=conns)

    async def call() -> bool:
        r = await pool.request("POST", "/v2/models/identity/infer", body, headers)
        return r.status == 200

    try:
        return await drive(call, conns, seconds)
    finally:
        await pool.close()


async def grpc_point(target: str, conns: int, seconds: float) -> dict[str, float]:
    import grpc
    from tritonclient.grpc import service_pb2_grpc

    req = grpc_request()
    async with grpc.aio.insecure_channel(target) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)

        async def call() -> bool:
            try:
                resp = await stub.ModelInfer(req, timeout=30)
            except grpc.aio.AioRpcError:
                return False
            return len(resp.raw_output_contents[0]) == ELEMENTS * 4

        return await drive(call, conns, seconds)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="anvil-grpc-bench-"))
    proc, env, url = start_stack(tmp / "a")
    target = f"127.0.0.1:{env['ANVIL_GRPC_PORT']}"
    peer, _, peer_url = start_stack(tmp / "b", {"ANVIL_GRPC_PORT": "0"})
    load = [os.getloadavg()[0]]
    rows: list[dict[str, Any]] = []
    try:
        for rnd in range(args.rounds):
            for c in CONCURRENCY:
                for transport in ("http", "grpc", "http_nogrpc"):
                    if transport == "grpc":
                        point = grpc_point(target, c, args.seconds)
                    else:
                        point = http_point(url if transport == "http" else peer_url, c, args.seconds)
                    r = asyncio.run(point)
                    rows.append({"round": rnd, "transport": transport, "concurrency": c, **r})
                    print(rows[-1], flush=True)
    finally:
        for p in (proc, peer):
            p.send_signal(signal.SIGINT)
        for p in (proc, peer):
            p.wait(30)
    load.append(os.getloadavg()[0])
    write(rows, args, load)


def _median(rows: list[dict[str, Any]], transport: str, c: int, key: str) -> float:
    return float(np.median([r[key] for r in rows if r["transport"] == transport and r["concurrency"] == c]))


def write(rows: list[dict[str, Any]], args: argparse.Namespace, load: list[float]) -> None:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    meta = {
        "command": "flock /tmp/anvil-timing.lock uv run python bench/grpc_vs_http.py "
        f"--seconds {args.seconds:g} --rounds {args.rounds}",
        "commit": commit.stdout.strip(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "load_average_1min_start_end": load,  # other work on the machine (flock serialises benches only)
    }
    summary = []
    for c in CONCURRENCY:
        s: dict[str, Any] = {"concurrency": c}
        s["failed"] = sum(r["failed"] for r in rows if r["concurrency"] == c)
        for key in ("p50_ms", "p99_ms", "rps"):
            h, g = _median(rows, "http", c, key), _median(rows, "grpc", c, key)
            s[f"http_{key}"], s[f"grpc_{key}"], s[f"grpc_over_http_{key}"] = h, g, g / h
            off = _median(rows, "http_nogrpc", c, key)
            s[f"http_nogrpc_{key}"], s[f"http_over_nogrpc_{key}"] = off, h / off
        summary.append(s)
    RESULTS.mkdir(parents=True, exist_ok=True)
    doc = {"meta": meta, "summary": summary, "rows": rows}
    (RESULTS / "grpc_vs_http.json").write_text(json.dumps(doc, indent=1))
    lines = [
        "# gRPC vs HTTP at the gateway (identity, 1 KB FP32)",
        "",
        f"{meta['date']}, {meta['machine']}, Python {meta['python']}, commit {meta['commit']}; the stack "
        "and the Python client share these cores. Medians over rounds that alternate the transports.",
        f"`{meta['command']}`; 1-min load average {load[0]:.1f} at the start, {load[1]:.1f} at the end.",
        "",
        "| conc. | HTTP p50 ms | gRPC p50 ms | gRPC/HTTP p50 | HTTP p99 ms | gRPC p99 ms | HTTP req/s | "
        "gRPC req/s | gRPC/HTTP req/s | failed |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in summary:
        lines.append(
            f"| {s['concurrency']} | {s['http_p50_ms']:.2f} | {s['grpc_p50_ms']:.2f} | "
            f"{s['grpc_over_http_p50_ms']:.2f} | {s['http_p99_ms']:.2f} | {s['grpc_p99_ms']:.2f} | "
            f"{s['http_rps']:.0f} | {s['grpc_rps']:.0f} | {s['grpc_over_http_rps']:.2f} | {s['failed']} |"
        )
    lines += [
        "",
        "HTTP on the stack that also serves gRPC vs HTTP on a stack with it off (ANVIL_GRPC_PORT=0), "
        "same rounds:",
        "",
        "| conc. | HTTP p50 ms (gRPC on) | HTTP p50 ms (gRPC off) | on/off p50 | on/off req/s |",
        "|---:|---:|---:|---:|---:|",
    ]
    for s in summary:
        lines.append(
            f"| {s['concurrency']} | {s['http_p50_ms']:.2f} | {s['http_nogrpc_p50_ms']:.2f} | "
            f"{s['http_over_nogrpc_p50_ms']:.2f} | {s['http_over_nogrpc_rps']:.2f} |"
        )
    (RESULTS / "grpc_vs_http.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
