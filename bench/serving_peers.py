"""Side-by-side serving benchmark: mlp4x1024 on Anvil, KServe, MLServer and Ray Serve.

Each peer is installed from pip into its own venv (.anvil/peers/<name>), started on a free port with
its own dynamic batching (32 requests or 2 ms), checked for the right answer, warmed up, then driven by
the `anvil bench` engine (closed loop, KServe v2 JSON, one row per request) at concurrency 1, 16, 64.
Writes bench/results/serving_peers.{json,md}.

    uv run python bench/serving_peers.py [--duration 15] [--only anvil,kserve] [--concurrency 1,16,64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from anvil_client.bench.engine import Engine
from anvil_client.bench.report import summarize
from anvil_client.bench.scrape import parse_batch_metrics
from anvil_client.bench.workload import Workload

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run_meta

ROOT = Path(__file__).resolve().parents[1]
PEERS_DIR = ROOT / ".anvil" / "peers"
SRC = ROOT / "bench" / "peers"
RESULTS = ROOT / "bench" / "results"
MODEL = "mlp4x1024"
PINS = {"kserve": "kserve==0.21.0", "mlserver": "mlserver==1.7.1", "rayserve": "ray[serve]==2.60.0"}
# mlserver 1.7.1's inference workers call asyncio.get_event_loop() at start, which uvloop >= 0.21
# refuses ("no current event loop"): every worker dies and the model is never loaded.
EXTRA = {"mlserver": ["uvloop<0.21"]}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def venv(name: str) -> Path:
    """The peer's venv with its pinned package (created and pip-installed on first use)."""
    py = PEERS_DIR / name / "bin" / "python"
    if not py.exists():
        subprocess.run(
            [sys.executable.replace("python", "python3"), "-m", "venv", str(py.parents[1])], check=False
        )
        if not py.exists():
            subprocess.run(["python3", "-m", "venv", str(py.parents[1])], check=True)
    probe = {"kserve": "kserve", "mlserver": "mlserver", "rayserve": "ray.serve"}[name]
    if subprocess.run([str(py), "-c", f"import {probe}, numpy"], capture_output=True).returncode != 0:
        print(f"installing {PINS[name]} into {py.parents[1]} ...", flush=True)
        subprocess.run(
            [str(py), "-m", "pip", "install", "-q", PINS[name], "numpy", *EXTRA.get(name, [])], check=True
        )
    return py


def start_peer(name: str, port: int, log: Path, blas_threads: int | None) -> subprocess.Popen[bytes]:
    # Not uv's environment: Ray's uv hook would try to ship the workspace to its workers.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UV_", "VIRTUAL_ENV"))}
    env.update({"PYTHONPATH": str(SRC), "RAY_USAGE_STATS_ENABLED": "0", "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0"})
    if blas_threads is not None:  # the setting Anvil's executor applies itself (ANVIL_BLAS_THREADS)
        env["OPENBLAS_NUM_THREADS"] = str(blas_threads)
    if name == "mlserver":
        model_dir = PEERS_DIR / "mlserver-models" / MODEL
        model_dir.mkdir(parents=True, exist_ok=True)
        (model_dir / "model-settings.json").write_text(
            json.dumps(
                {
                    "name": MODEL,
                    "implementation": "mlserver_mlp.Mlp",
                    "max_batch_size": 32,
                    "max_batch_time": 0.002,
                }
            )
        )
        settings = {"http_port": port, "grpc_port": free_port(), "metrics_port": free_port()}
        (model_dir.parent / "settings.json").write_text(json.dumps(settings))
        bin_dir = venv(name).parent
        argv = [str(bin_dir / "mlserver"), "start", str(model_dir.parent)]
    else:
        script = {"kserve": "kserve_mlp.py", "rayserve": "rayserve_mlp.py"}[name]
        argv = [str(venv(name)), str(SRC / script), str(port)]
    out = open(log, "wb")  # noqa: SIM115
    return subprocess.Popen(
        argv, cwd=SRC, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
    )


def start_anvil(log: Path) -> tuple[subprocess.Popen[bytes], str, str]:
    names = ["HTTP", "GATEWAY_METRICS", "SCHEDULER_GATEWAY", "SCHEDULER_EXECUTOR", "SCHEDULER_METRICS",
             "EXECUTOR_METRICS", "COMPILER", "COMPILER_METRICS", "QOS_METRICS", "REDIS"]  # fmt: skip
    ports = {f"ANVIL_{n}_PORT": str(free_port()) for n in names}
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANVIL_")}
    env.update(ports)
    env.update(
        {"ANVIL_RUN_ROOT": str(PEERS_DIR / "anvil-run"), "ANVIL_PROFILES": "cpu", "ANVIL_MODELS": MODEL}
    )
    # Restarts on: a service that crashes (e.g. the compiler, unused here) must not stop the stack.
    argv = [sys.executable, "-m", "anvil_client.cli", "up", "--timeout", "120"]
    out = open(log, "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
    )
    metrics = f"http://127.0.0.1:{ports['ANVIL_SCHEDULER_METRICS_PORT']}/metrics"
    return proc, f"http://127.0.0.1:{ports['ANVIL_HTTP_PORT']}", metrics


def batch_totals(metrics_url: str | None) -> tuple[float, float]:
    """(requests batched, batches) so far, from the scheduler's batch-size histogram; (0, 0) if unknown."""
    if metrics_url is None:
        return 0.0, 0.0
    try:
        row = parse_batch_metrics(httpx.get(metrics_url, timeout=5).text, MODEL)
    except httpx.HTTPError:
        return 0.0, 0.0
    return (row[0], row[1]) if row is not None else (0.0, 0.0)


def reference(x: np.ndarray) -> np.ndarray:
    sys.path.insert(0, str(SRC))
    from weights import forward, layers  # the same recipe the peers use

    return forward(layers(), x)


def wait_and_check(url: str, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    """Poll until one inference answers, then check it against numpy."""
    x = np.random.default_rng(5).standard_normal((1, 1024)).astype(np.float32)
    body = {
        "id": "check",
        "inputs": [
            {"name": "INPUT0", "datatype": "FP32", "shape": [1, 1024], "data": x.reshape(-1).tolist()}
        ],
    }
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            r = httpx.post(f"{url}/v2/models/{MODEL}/infer", json=body, timeout=10)
            if r.status_code == 200:
                got = np.asarray(r.json()["outputs"][0]["data"], np.float32).reshape(1, 1024)
                np.testing.assert_allclose(got, reference(x), rtol=1e-3, atol=1e-3)
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"no correct answer from {url} within {timeout_s} s")
        time.sleep(0.5)


async def drive(
    url: str, concurrency: list[int], duration_s: float, metrics_url: str | None
) -> list[dict[str, Any]]:
    anvil = metrics_url is not None
    wl = Workload(model=MODEL, width=1024, priorities={3: 1.0}, send_priority=anvil)
    rows = []
    await Engine(url, wl, request_timeout_s=30).run_closed(16, 3.0)  # warm-up, not reported
    for c in concurrency:
        rows0, batches0 = batch_totals(metrics_url)
        res = await Engine(url, wl, request_timeout_s=30).run_closed(c, duration_s)
        rows1, batches1 = batch_totals(metrics_url)
        s = summarize(res, slo_ms={3: 2000.0})
        lat = s["latency_ms"]
        rows.append(
            {"concurrency": c, "throughput_rps": s["throughput_rps"], "p50_ms": lat["p50"],
             "p99_ms": lat["p99"], "sent": s["sent"], "ok": s["ok"], "errors": s["errors"]}
        )  # fmt: skip
        if batches1 > batches0:  # Anvil: mean batch the scheduler formed at this level
            rows[-1]["mean_batch"] = round((rows1 - rows0) / (batches1 - batches0), 2)
        print(f"  c={c}: {rows[-1]}", flush=True)
    return rows


def stop(proc: subprocess.Popen[bytes]) -> None:
    import signal

    try:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(10)


def run_one(
    name: str, conc: list[int], duration_s: float, logs: Path, blas_threads: int | None
) -> dict[str, Any]:
    print(f"== {name}", flush=True)
    log = logs / f"{name}.log"
    metrics: str | None = None
    if name == "anvil":
        proc, url, metrics = start_anvil(log)
    else:
        port = free_port()
        proc, url = start_peer(name, port, log, blas_threads), f"http://127.0.0.1:{port}"
    try:
        wait_and_check(url, proc, 180)
        return {"rows": asyncio.run(drive(url, conc, duration_s, metrics))}
    except Exception as exc:  # one peer failing must not lose the others' numbers
        print(f"  {name} failed: {exc}", flush=True)
        return {"rows": [], "error": str(exc), "log_tail": log.read_text(errors="replace")[-2000:]}
    finally:
        stop(proc)


def median_rows(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One server's rounds as one row per concurrency: the median of each number, errors summed,
    and every round's throughput under "runs_rps"."""
    ok = [run for run in runs if run["rows"]]
    if not ok:
        return runs[-1]
    out: list[dict[str, Any]] = []
    for c in [row["concurrency"] for row in ok[0]["rows"]]:
        rows = [row for run in ok for row in run["rows"] if row["concurrency"] == c]
        med = {k: float(np.median([row[k] for row in rows])) for k in ("throughput_rps", "p50_ms", "p99_ms")}
        errors: dict[str, int] = {}
        for row in rows:
            for k, v in row["errors"].items():
                errors[k] = errors.get(k, 0) + v
        merged = {"concurrency": c, **{k: round(v, 3) for k, v in med.items()}, "errors": errors}
        merged["runs_rps"] = [row["throughput_rps"] for row in rows]
        if any("mean_batch" in row for row in rows):
            merged["mean_batch"] = [row.get("mean_batch") for row in rows]
        out.append(merged)
    result: dict[str, Any] = {"rows": out}
    failed = [run.get("error") for run in runs if not run["rows"]]
    if failed:
        result["failed_rounds"] = failed
    return result


def write_md(doc: dict[str, Any], path: Path) -> None:
    sys.path.insert(0, str(SRC))
    from report_md import render  # bench/peers/report_md.py: the table and the verdict

    path.write_text(render(doc))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=15.0, help="seconds per concurrency level")
    ap.add_argument("--concurrency", default="1,16,64")
    ap.add_argument("--only", default="anvil,kserve,mlserver,rayserve")
    ap.add_argument("--merge", action="store_true", help="keep other servers' rows from the last JSON")
    ap.add_argument(
        "--peer-blas-threads",
        type=int,
        default=None,
        help="OPENBLAS_NUM_THREADS for the peers (default: theirs, all cores; Anvil's executor uses 1)",
    )
    ap.add_argument("--out", default="serving_peers", help="results file stem under bench/results")
    ap.add_argument(
        "--repeat", type=int, default=1, help="rounds over all servers; the table gives each cell's median"
    )
    args = ap.parse_args()
    conc = [int(c) for c in args.concurrency.split(",")]
    logs = PEERS_DIR / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {
        "model": f"{MODEL}: 4 x (1024x1024 FP32 matmul + bias), ReLU between; 1 row per request",
        "protocol": "KServe v2 HTTP/1.1 JSON (Ray Serve: the same JSON on its HTTP proxy)",
        "batching": "every peer: up to 32 requests or 2 ms; Anvil: its adaptive (PID + slack) batcher",
        "blas": "Anvil's executor: OpenBLAS at 1 thread (ANVIL_BLAS_THREADS default); peers: "
        + (
            "OpenBLAS's default (all cores)"
            if args.peer_blas_threads is None
            else f"OPENBLAS_NUM_THREADS={args.peer_blas_threads}, the same setting"
        ),
        "duration_s": args.duration,
        "rounds": args.repeat,
        "machine": f"{platform.platform()}, {os.cpu_count()} cores; generator and server share them",
        "load_before": os.getloadavg(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "command": "uv run python bench/serving_peers.py " + " ".join(sys.argv[1:]),
        "commit": run_meta.commit(),
        "servers": {},
    }
    last = RESULTS / f"{args.out}.json"
    if args.merge and last.exists():
        doc["servers"] = json.loads(last.read_text())["servers"]
        doc["note"] = f"servers not in --only {args.only} are from an earlier run"
    names = args.only.split(",")
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for r in range(args.repeat):  # servers interleaved, so slow drifts of the machine hit all alike
        for name in names:
            print(f"-- round {r + 1} of {args.repeat}", flush=True)
            rounds[name].append(run_one(name, conc, args.duration, logs, args.peer_blas_threads))
    for name in names:
        doc["servers"][name] = median_rows(rounds[name])
    doc["load_after"] = os.getloadavg()
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.out}.json").write_text(json.dumps(doc, indent=1))
    write_md(doc, RESULTS / f"{args.out}.md")
    print((RESULTS / f"{args.out}.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
