"""Executor scaling on the GPU host (issue #21): one command, several stack configurations, one table.

For each configuration (`gpus=0,epg=1` = ANVIL_GPUS=0 and ANVIL_EXECUTORS_PER_GPU=1, `,lanes=4` adds
ANVIL_LANES=4: four CUDA streams in each executor; `gpus=0+1` =
ANVIL_GPUS=0,1) it starts the stack (`anvil up --no-restart`, `gpu` profile, a fresh run root on
private ports), deploys all-MiniLM-L6-v2 from --model-dir the way bench/minilm_gpu.py does (its
functions), waits until every executor serves it (each executor's registry record lists it), runs
the same closed-loop load (32 sentences per request, concurrency 16 and 64, 4 client processes) and,
with --int4, the weight-bound INT4 model of bench/int4_gpu.py (1-row requests: batch <= 16), then
stops the stack. Per load phase it records items/s, p50/p99, errors, the scheduler's mean batch
size, batches per executor (each executor's anvil_executor_batches_total), GPU utilisation
(nvidia-smi sampled during the phase), each service's CPU seconds (/proc, with its child processes)
and the host's busy cores.

A configuration that needs a GPU the host does not show is skipped with the reason; one that does
not fit the rest of --budget-s is skipped and said so. Output: bench/results/gpu_scale.{json,md},
each row's ratio to the first configuration's same phase, and issue #21's check (2 GPUs >= 1.8x one,
MiniLM c16 p99 <= 50 ms) when a 2-GPU configuration ran.

    python bench/gpu_scale.py --model-dir DIR --configs "gpus=0,epg=1;gpus=0,epg=2;gpus=0+1,epg=1"
    python bench/gpu_scale.py --profile cpu --model identity --configs "gpus=0;gpus=0+1"  # no GPU
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import int4_gpu  # noqa: E402
import minilm_gpu  # noqa: E402
from scale_probe import GpuSampler, cpu_seconds, delta, host_busy, scrape  # noqa: E402
from scale_report import markdown, ratios  # noqa: E402
from scale_stack import ScaleConfig, ScaleStack, StackFailed  # noqa: E402

from anvil_client.gpus import Visible, executors_per_gpu, visible_gpus  # noqa: E402
from anvil_core import keys  # noqa: E402
from anvil_core.redis_conn import load_redis_auth, sync_redis  # noqa: E402

__all__ = ["parse_configs", "unavailable"]

FIRST_CONFIG_ESTIMATE_S = 120.0  # stack start + deploy + warm-up + phases, before one was measured
INT4_COMPILE_ESTIMATE_S = 150.0  # the 1 GiB weight-bound model: upload + INT4 pack (~64 s measured)
INT4_CACHED_ESTIMATE_S = 45.0  # upload again; the compiled artifact is reused (shared artifact dir)
PHASE_MARGIN_S = 15.0  # a phase's own overhead (client processes, scrapes) and the stack's stop
SERVE_TIMEOUT_S = 300.0  # every executor lists a deployed model within this long
REPORTED_SETTINGS = (  # the stack's settings from the environment that move these numbers
    "ANVIL_GPU_PRECISION",
    "ANVIL_HTTP_WORKERS",
    "ANVIL_MAX_BATCH",
    "ANVIL_CREDITS",
    "ANVIL_SLO_P2_MS",
    "ANVIL_GPU_GEMM",
)


def parse_configs(text: str) -> list[ScaleConfig]:
    """`gpus=0,epg=1;gpus=0+1,epg=1` -> configurations, in order. `gpus`: `+`-separated distinct
    visible-GPU indices (required); `epg`: executors per GPU, 1..8 (default 1); `lanes`: compute
    lanes (CUDA streams) per executor, 1..16 (default 1). Raises ValueError naming the bad item."""
    out: list[ScaleConfig] = []
    for item in (part.strip() for part in text.split(";")):
        if not item:
            continue
        fields: dict[str, str] = {}
        for kv in item.split(","):
            key, eq, value = (s.strip() for s in kv.partition("="))
            if not eq or key not in ("gpus", "epg", "lanes") or key in fields:
                want = "gpus=I[+J...][,epg=N][,lanes=L]"
                raise ValueError(f"config {item!r}: expected {want}, got {kv.strip()!r}")
            fields[key] = value
        if "gpus" not in fields:
            raise ValueError(f"config {item!r}: gpus=... is required (e.g. gpus=0 or gpus=0+1)")
        gpus: list[int] = []
        for g in fields["gpus"].split("+"):
            if not (g.strip().isascii() and g.strip().isdigit()):
                raise ValueError(f"config {item!r}: GPU {g!r} is not an index (0, 1, ...)")
            if int(g) in gpus:
                raise ValueError(f"config {item!r}: GPU {int(g)} is listed twice")
            gpus.append(int(g))
        # a configuration names its count (1 when left out), not the launcher's host-dependent `auto`
        epg = executors_per_gpu(fields.get("epg") or "1")  # GpuSelectionError (a ValueError) outside 1..8
        lanes_text = fields.get("lanes") or "1"
        if not (lanes_text.isascii() and lanes_text.isdigit() and 1 <= int(lanes_text) <= 16):
            raise ValueError(f"config {item!r}: lanes={lanes_text!r} is not a whole number in 1..16")
        cfg = ScaleConfig(tuple(sorted(gpus)), epg, int(lanes_text))
        if cfg in out:
            raise ValueError(f"config {item!r}: {cfg.label} is listed twice")
        out.append(cfg)
    if not out:
        raise ValueError(f"--configs {text!r}: no configuration")
    return out


def unavailable(cfg: ScaleConfig, visible: Visible) -> str | None:
    """Why `cfg` cannot run on this host's GPUs, or None. Unknown visibility (no nvidia-smi, no
    CUDA_VISIBLE_DEVICES) trusts the indices, as the launcher does."""
    if visible.count is None or max(cfg.gpus) < visible.count:
        return None
    return f"needs GPU {max(cfg.gpus)}, {visible.count} visible ({visible.source})"


def wait_served(stack: ScaleStack, model: str, timeout_s: float) -> float:
    """Until every executor's registry record lists `model`; returns the seconds it took."""
    state = stack.state()
    r = sync_redis(state["redis_url"], load_redis_auth(secrets_dir=Path(state["secrets_dir"])))
    t0 = time.perf_counter()
    try:
        while True:
            serving = 0
            for key in r.scan_iter(keys.svc_pattern("executor")):
                models = r.hget(key, "models")
                serving += bool(models and model in json.loads(models))
            if serving >= stack.cfg.executors:
                return time.perf_counter() - t0
            if time.perf_counter() - t0 > timeout_s:
                raise StackFailed(
                    f"{model}: {serving} of {stack.cfg.executors} executors serve it after {timeout_s:.0f} s"
                )
            time.sleep(0.5)
    finally:
        r.close()


def measure(stack: ScaleStack, model: str, phase: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Runs one load phase and adds what the services and the host did during it."""
    sched, execs = stack.scheduler_port(), stack.executor_ports()
    s0, e0 = scrape(sched), {n: scrape(p) for n, p in execs.items()}
    pids = stack.pids()
    cpu0, h0 = cpu_seconds(pids), host_busy()
    gpu = GpuSampler()
    gpu.start()
    t0 = time.perf_counter()
    row = phase()
    wall = time.perf_counter() - t0
    row["gpu"] = gpu.stop()
    cpu1, h1 = cpu_seconds(pids), host_busy()
    s1, e1 = scrape(sched), {n: scrape(p) for n, p in execs.items()}
    count = delta(s0, s1, "anvil_scheduler_batch_size_count", model=model)
    row["batches"] = int(count)
    row["mean_batch"] = (
        round(delta(s0, s1, "anvil_scheduler_batch_size_sum", model=model) / count, 2) if count else None
    )
    row["batches_per_executor"] = {
        n: int(delta(e0[n], e1[n], "anvil_executor_batches_total", model=model)) for n in execs
    }
    row["cpu_s"] = {n: round(cpu1.get(n, 0.0) - cpu0.get(n, 0.0), 2) for n in pids}
    busy, total = h1[0] - h0[0], h1[1] - h0[1]
    row["host_busy_cores"] = round(busy / total * (os.cpu_count() or 1), 2) if total else None
    row["phase_s"] = round(wall, 2)
    return row


def _items(row: dict[str, Any], per_req: int) -> dict[str, Any]:
    """minilm_gpu.load and int4_gpu.closed_loop rows in one shape: items/s (sentences or rows)."""
    if "sentences_per_s" in row:
        row["items_per_s"] = row.pop("sentences_per_s")
    else:
        row["items_per_s"] = round(row["requests_per_s"] * per_req, 1)
        if isinstance(row["errors"], dict):  # int4_gpu.closed_loop: {"<status>: <text>": count}
            row["error_examples"] = dict(list(row["errors"].items())[:3])
            row["errors"] = sum(row["errors"].values())
    return row


class Workloads:
    """The load phases of one configuration, each a row: MiniLM (text, 32 sentences per request),
    identity (the CPU smoke: 1-row KServe binary requests), the weight-bound INT4 model."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.texts = minilm_gpu.sentences(args.sentences) if args.model == "minilm" else []
        self.int4_onnx: Path | None = None
        self.int4_compiled = False
        self.left_s: Callable[[], float] = lambda: float("inf")

    def run(self, stack: ScaleStack, left_s: Callable[[], float]) -> list[dict[str, Any]]:
        a = self.args
        self.left_s = left_s
        os.environ.update(stack.client_env())  # `anvil deploy` subprocesses find this stack
        rows = self._minilm(stack, left_s) if a.model == "minilm" else self._identity(stack, left_s)
        if a.int4:
            need = INT4_CACHED_ESTIMATE_S if self.int4_compiled else INT4_COMPILE_ESTIMATE_S
            if left_s() < need + a.seconds * len(a.int4_concurrency):
                why = f"budget: {left_s():.0f} s left, INT4 needs ~{need:.0f} s + its phases"
                rows.append({"workload": "int4", "skipped": why})
            else:
                rows += self._int4(stack, left_s)
        return rows

    def _minilm(self, stack: ScaleStack, left_s: Callable[[], float]) -> list[dict[str, Any]]:
        a = self.args
        t0 = time.perf_counter()
        minilm_gpu.deploy(a.model_dir, a.name, a.max_batch, a.max_seq, a.gpu_precision)
        minilm_gpu.wait_text_model(stack.url, a.name)
        served_s = wait_served(stack, a.name, min(SERVE_TIMEOUT_S, left_s()))
        print(
            f"  {a.name}: every executor serves it {time.perf_counter() - t0:.1f} s after deploy", flush=True
        )

        def phase(conc: int, seconds: float = a.seconds) -> dict[str, Any]:
            load = minilm_gpu.load(stack.url, a.name, self.texts, 32, conc, seconds, procs=a.client_procs)
            row = _items(load, 32)
            if row["errors"]:  # minilm_gpu.load counts them; one more request says what they were
                body = {"model": a.name, "input": self.texts[:32]}
                r = httpx.post(stack.url + "/v1/embeddings", json=body, timeout=30)
                seen = r.text[:300] if r.status_code != 200 else "200: not reproduced by a request after it"
                row["error_examples"] = {str(r.status_code): seen}
            return row

        phase(64, a.warmup_s)  # every batch and length bucket the phases reach
        what = "minilm 32 sentences/request"
        return self._phases(stack, a.name, what, served_s, a.concurrency, phase)

    def _identity(self, stack: ScaleStack, left_s: Callable[[], float]) -> list[dict[str, Any]]:
        a = self.args
        served_s = wait_served(stack, "identity", min(SERVE_TIMEOUT_S, left_s()))  # built in
        x = np.full((1, 256), 0.5, np.float32)  # (1, 256) fp32, perf_analyzer's identity shape

        def phase(conc: int, seconds: float = a.seconds) -> dict[str, Any]:
            row = int4_gpu.closed_loop(stack.url, "identity", x, conc, seconds, "INPUT0", "OUTPUT0")
            return _items(row, 1)

        phase(16, a.warmup_s)
        return self._phases(stack, "identity", "identity 1 row/request", served_s, a.concurrency, phase)

    def _int4(self, stack: ScaleStack, left_s: Callable[[], float]) -> list[dict[str, Any]]:
        a, name = self.args, "wb_int4"
        if self.int4_onnx is None:
            from onnx_models import weight_bound_bytes  # services/compiler/tests, on int4_gpu's path

            self.int4_onnx = Path(tempfile.mkdtemp(prefix="anvil_scale_int4_")) / "weight_bound.onnx"
            self.int4_onnx.write_bytes(weight_bound_bytes(a.int4_dim, 4, seed=0))
        int4_gpu._deploy(self.int4_onnx, name, int4_gpu.variants("fp16")[name], 16)  # max_batch 16
        self.int4_compiled = True
        with httpx.Client(base_url=stack.url, timeout=60) as client:
            int4_gpu._wait_ready(client, name, a.int4_platform)
        served_s = wait_served(stack, name, min(SERVE_TIMEOUT_S, left_s()))
        x = np.random.default_rng(1).standard_normal((1, a.int4_dim)).astype(np.float32)  # (1, dim)

        def phase(conc: int, seconds: float = a.seconds) -> dict[str, Any]:
            return _items(int4_gpu.closed_loop(stack.url, name, x, conc, seconds), 1)

        for c in a.int4_concurrency:
            phase(c, 1.0)  # every batch bucket this concurrency reaches
        what = "int4 weight-bound 1 row/request"
        return self._phases(stack, name, what, served_s, a.int4_concurrency, phase)

    def _phases(
        self,
        stack: ScaleStack,
        model: str,
        what: str,
        served_s: float,
        concurrency: list[int],
        phase: Callable[[int], dict[str, Any]],
    ) -> list[dict[str, Any]]:
        rows = []
        for conc in concurrency:
            if self.left_s() < self.args.seconds + PHASE_MARGIN_S:
                need = self.args.seconds + PHASE_MARGIN_S
                why = f"budget: {self.left_s():.0f} s left, a phase takes ~{need:.0f} s"
                rows.append({"workload": what, "concurrency": conc, "skipped": why})
                continue
            row: dict[str, Any] = {
                "workload": what,
                "concurrency": conc,
                "served_by_all_s": round(served_s, 1),
            }
            row.update(measure(stack, model, functools.partial(phase, conc)))
            row.pop("what", None)
            print(
                f"  {what} c{conc}: {row['items_per_s']:,} items/s,"
                f" p50 {row['p50_ms']} p99 {row['p99_ms']} ms, errors {row['errors']},"
                f" mean batch {row['mean_batch']},"
                f" batches per executor {row['batches_per_executor']}",
                flush=True,
            )
            rows.append(row)
        return rows


def _git_head() -> str:
    """This checkout's HEAD, said to be that: on a device copy git is stale (pass --commit there)."""
    git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    head = git.stdout.strip()
    return f"{head} (git HEAD of the tree that ran; no --commit given)" if head else "unknown (pass --commit)"


def machine() -> dict[str, Any]:
    gpus: list[str] = []
    if shutil.which("nvidia-smi"):
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10).stdout
        gpus = [line.strip() for line in out.splitlines() if line.startswith("GPU ")]
    return {"host": platform.node(), "cpus": os.cpu_count(), "gpus": gpus or "none visible"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--configs", default="gpus=0,epg=1;gpus=0,epg=2;gpus=0,epg=4;gpus=0+1,epg=1")
    ap.add_argument("--profile", choices=("gpu", "cpu"), default="gpu", help="cpu: CPU executors stand in")
    ap.add_argument("--model", choices=("minilm", "identity"), default="minilm")
    ap.add_argument("--model-dir", type=Path, help="MiniLM checkpoint dir (with tokenizer.json)")
    ap.add_argument("--name", default="minilm-gpu")
    ap.add_argument("--max-batch", type=int, default=512)
    ap.add_argument("--max-seq", type=int, default=128)
    ap.add_argument("--gpu-precision", choices=("fp16", "bf16", "fp32"), default="fp16")
    ap.add_argument("--sentences", type=int, default=1000)
    ap.add_argument("--concurrency", type=lambda s: [int(v) for v in s.split(",")], default=[16, 64])
    ap.add_argument("--seconds", type=float, default=6.0, help="each load phase, s")
    ap.add_argument("--warmup-s", type=float, default=2.0, help="load before the measured phases, s")
    ap.add_argument("--client-procs", type=int, default=minilm_gpu.CLIENT_PROCS)
    ap.add_argument("--int4", action="store_true", help="also the weight-bound INT4 model (batch <= 16)")
    ap.add_argument("--int4-dim", type=int, default=8192)
    ap.add_argument("--int4-concurrency", type=lambda s: [int(v) for v in s.split(",")], default=[16])
    ap.add_argument("--int4-platform", help="served as (default: anvil_plan_cuda, cpu: anvil_plan_cpu)")
    ap.add_argument("--budget-s", type=float, default=420.0, help="skip what does not fit in this, s")
    ap.add_argument("--up-timeout-s", type=float, default=180.0)
    ap.add_argument("--commit", default=os.environ.get("ANVIL_COMMIT", ""), help="the tree measured")
    ap.add_argument("--out-dir", type=Path, default=ROOT / "bench" / "results")
    ap.add_argument("--out-name", default="gpu_scale")
    ap.add_argument(
        "--work-dir", type=Path, help="run roots and the shared artifact dir (default: a temp dir)"
    )
    args = ap.parse_args()
    t_start = time.perf_counter()
    try:
        configs = parse_configs(args.configs)
    except ValueError as exc:
        ap.error(str(exc))
    if args.model == "minilm" and args.model_dir is None:
        ap.error("--model minilm needs --model-dir (or --model identity for the smoke)")
    if args.profile == "cpu" and args.int4 and args.int4_dim > 1024:
        ap.error("--int4 on CPU executors: a smoke of the path only, --int4-dim <= 1024 (8192 is 1 GiB)")
    args.int4_platform = args.int4_platform or (
        "anvil_plan_cpu" if args.profile == "cpu" else "anvil_plan_cuda"
    )
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="anvil_gpu_scale_"))
    visible = visible_gpus(os.environ)
    res: dict[str, Any] = {
        "command": " ".join(["python", *sys.argv]),
        "commit": args.commit or _git_head(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": machine(),
        "profile": args.profile,
        "model": args.model,
        "load": {
            "concurrency": args.concurrency,
            "seconds": args.seconds,
            "client_processes": args.client_procs,
            "per_request": 32 if args.model == "minilm" else 1,
        },
        "settings": {k: os.environ[k] for k in REPORTED_SETTINGS if k in os.environ},
        "budget_s": args.budget_s,
        "configs": [],
    }
    workloads = Workloads(args)
    took: list[float] = []
    left = lambda: args.budget_s - (time.perf_counter() - t_start)  # noqa: E731
    for cfg in configs:
        entry: dict[str, Any] = {"config": cfg.label, "executors": cfg.executors}
        res["configs"].append(entry)
        why = unavailable(cfg, visible) if args.profile == "gpu" else None
        need = max(took, default=FIRST_CONFIG_ESTIMATE_S)
        if why is None and left() < need:
            why = f"budget: {left():.0f} s of {args.budget_s:.0f} s left, a configuration takes ~{need:.0f} s"
        if why:
            entry["skipped"] = why
            print(f"== {cfg.label}: skipped ({why})", flush=True)
            continue
        print(f"== {cfg.label}: {cfg.executors} executor(s), {left():.0f} s of budget left", flush=True)
        t0 = time.perf_counter()
        stack = ScaleStack(
            cfg, args.profile, work / cfg.label.replace(",", "_").replace("=", ""), work / "artifacts"
        )
        try:
            entry["start_s"] = round(stack.start(min(args.up_timeout_s, max(left(), 10))), 1)
            entry["rows"] = workloads.run(stack, left)
        except (Exception, SystemExit) as exc:  # the next configuration still runs
            entry["failed"] = f"{type(exc).__name__}: {exc}"[-2000:]
            print(f"   failed: {entry['failed']}", flush=True)
        finally:
            entry["stop_s"] = round(stack.stop(), 1)
        took.append(time.perf_counter() - t0)
        entry["config_s"] = round(took[-1], 1)
        write(res, args, t_start)  # after each configuration: a run cut short still leaves its rows
    print(write(res, args, t_start), flush=True)


def write(res: dict[str, Any], args: argparse.Namespace, t_start: float) -> str:
    """Ratios and the two-GPU check over what ran so far, written as JSON and markdown."""
    res["ratios"], res["x2_check"] = ratios(res["configs"])
    res["total_s"] = round(time.perf_counter() - t_start, 1)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / f"{args.out_name}.json").write_text(json.dumps(res, indent=2) + "\n")
    text = markdown(res)
    (args.out_dir / f"{args.out_name}.md").write_text(text)
    return text


if __name__ == "__main__":
    main()
