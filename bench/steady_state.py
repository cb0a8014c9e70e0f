"""Does a serving executor stay flat under sustained load? (issue #16: "executor RSS and device memory
flat over a 5-minute run").

Against a running stack (`make up`, or `bench/h200_gpu.sh`'s GPU stack), a closed loop of
`/v1/embeddings` requests (`--per-request` corpus-v2 sentences each, `--concurrency` clients,
bench/minilm_gpu.py's load generator) runs for `--minutes`, cut into windows of `--window-s`. After
each window: every executor process's resident memory (VmRSS from /proc, the processes whose command
line runs `anvil_executor`), the GPUs' memory in use (`nvidia-smi`, where present), and the
executors' own counters of device allocations and module loads after their last model load
(`anvil_executor_device_allocations_steady`, `anvil_executor_module_loads_steady`, from the metrics
ports 8004 + 100·k that answer). The report gives each series per window, and its drift: the median
of the last three windows minus the median of windows 2-4 (the first window is warm-up), in MiB and
percent, with sentences/s and errors per window beside them. Writes
bench/results/<out-name>.{json,md}.

    ANVIL_SLO_P2_MS=5000 make up &     # a closed loop above capacity is shed (429) at the default SLO
    python bench/steady_state.py --model minilm --minutes 5
    STEADY_MIN=5 SKIP_TESTS=1 SKIP_SMOKE=1 SKIP_INT4=1 bash bench/h200_gpu.sh   # on the H200: after
                                          # bench/minilm_gpu.py deployed minilm-gpu, with its settings
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from corpus import sentences  # noqa: E402
from minilm_gpu import load  # noqa: E402
from run_meta import run_meta  # noqa: E402
from scale_probe import label_sum, scrape  # noqa: E402

METRICS_PORTS = tuple(8004 + 100 * k for k in range(32))  # executor k of `anvil up` (gpus x per GPU)


def executor_pids(proc: Path = Path("/proc")) -> list[int]:
    """The processes whose command line runs the executor (`python -m anvil_executor`)."""
    out = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"anvil_executor" in cmd:
            out.append(int(entry.name))
    return sorted(out)


def rss_mib(pid: int, proc: Path = Path("/proc")) -> float | None:
    """VmRSS of a live process in MiB, None when it is gone."""
    try:
        for line in (proc / str(pid) / "status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024  # kB
    except (OSError, ValueError, IndexError):
        return None
    return None


def gpu_mem_mib() -> dict[str, float] | str:
    """{gpu index: memory used, MiB} from nvidia-smi, or why there is none."""
    if shutil.which("nvidia-smi") is None:
        return "no nvidia-smi on PATH"
    cmd = ["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"]
    try:
        text = subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"nvidia-smi failed: {exc}"
    out = {}
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit():
            try:
                out[parts[0]] = float(parts[1])
            except ValueError:
                continue
    return out or "nvidia-smi printed no memory"


def executor_counters(ports: tuple[int, ...] = METRICS_PORTS) -> dict[str, dict[str, float]]:
    """{metrics port: steady allocations and module loads} of the executors that answer."""
    out = {}
    for port in ports:
        series = scrape(port, timeout_s=1.0)
        if not series:
            continue
        out[str(port)] = {
            "device_allocations_steady": label_sum(series, "anvil_executor_device_allocations_steady"),
            "module_loads_steady": label_sum(series, "anvil_executor_module_loads_steady"),
        }
    return out


def drift(values: list[float]) -> dict[str, float] | None:
    """Median of the last three windows minus the median of windows 2-4 (the first is warm-up): MiB
    and percent; None with fewer than five windows."""
    if len(values) < 5:
        return None
    base = statistics.median(values[1:4])
    end = statistics.median(values[-3:])
    return {"from": round(base, 1), "to": round(end, 1), "mib": round(end - base, 1),
            "pct": round(100 * (end - base) / base, 2) if base else 0.0}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://localhost:8000")
    ap.add_argument("--model", default="minilm", help="a text-embedding model the stack serves")
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--window-s", type=float, default=15.0, help="one sample per window, s")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--per-request", type=int, default=32, help="sentences per request")
    ap.add_argument("--client-procs", type=int, default=4)
    ap.add_argument("--out-name", default="steady_state")
    ap.add_argument("--out-dir", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args()
    windows = int(args.minutes * 60 // args.window_s)
    if windows < 5 or args.concurrency < 1 or args.per_request < 1:
        ap.error(
            "need at least 5 windows (--minutes x 60 / --window-s), --concurrency and --per-request >= 1"
        )
    pids = executor_pids()
    if not pids:
        sys.exit("no executor process found (is the stack up on this host?)")
    texts = sentences(1000)
    rows: list[dict[str, Any]] = []
    for w in range(windows):
        r = load(args.url, args.model, texts, args.per_request, args.concurrency, args.window_s,
                 procs=args.client_procs)  # fmt: skip
        row = {
            "window": w + 1,
            "t_s": round((w + 1) * args.window_s, 1),
            "sentences_per_s": r["sentences_per_s"],
            "p99_ms": r["p99_ms"],
            "errors": r["errors"],
            "error_statuses": r.get("error_statuses", {}),
            "rss_mib": {str(p): (round(v, 1) if (v := rss_mib(p)) is not None else None) for p in pids},
            "gpu_mem_mib": gpu_mem_mib(),
            "counters": executor_counters(),
        }
        rows.append(row)
        rss = ", ".join(f"{p} {v} MiB" for p, v in row["rss_mib"].items())
        print(f"window {w + 1}/{windows}: {r['sentences_per_s']} sentences/s, p99 {r['p99_ms']} ms, "
              f"errors {r['errors']}; RSS {rss}; GPU {row['gpu_mem_mib']}", flush=True)  # fmt: skip
    series: dict[str, list[float]] = {}
    for p in pids:
        vals = [row["rss_mib"][str(p)] for row in rows]
        if all(v is not None for v in vals):
            series[f"executor {p} RSS"] = vals
    if all(isinstance(row["gpu_mem_mib"], dict) for row in rows):
        for gpu in rows[0]["gpu_mem_mib"]:
            series[f"GPU {gpu} memory used"] = [row["gpu_mem_mib"].get(gpu, 0.0) for row in rows]
    drifts = {name: drift(vals) for name, vals in series.items()}
    first, last = rows[0]["counters"], rows[-1]["counters"]
    meta = {
        **run_meta("bench/steady_state.py"),
        "executors": pids,
    }
    args.out_dir.mkdir(parents=True, exist_ok=True)
    doc = {"meta": meta, "windows": rows, "drift": drifts, "counters_first": first, "counters_last": last}
    (args.out_dir / f"{args.out_name}.json").write_text(json.dumps(doc, indent=1))
    lines = [
        f"# Steady state under load: {args.model} for {args.minutes} min (`bench/steady_state.py`)",
        "",
        f"- Command: `{meta['command']}`; commit {meta['commit']}; {meta['date']}",
        f"- Machine: {meta['machine']}; 1-min load at the end {meta['load_1min_at_end']}; "
        f"executors (pids): {pids}",
        f"- Load: {args.concurrency} closed-loop clients, {args.per_request} sentences a request, "
        f"{windows} windows of {args.window_s} s",
        "",
        "| series | windows 2-4 (median) | last 3 (median) | drift MiB | drift % |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, d in drifts.items():
        if d is not None:
            lines.append(f"| {name} | {d['from']} | {d['to']} | {d['mib']} | {d['pct']} |")
    gpu_note = rows[-1]["gpu_mem_mib"]
    if not isinstance(gpu_note, dict):
        lines += ["", f"GPU memory: not measured ({gpu_note})."]
    lines += [
        "",
        f"Executor counters after their last model load, first window -> last: {first} -> {last}",
        "",
        "| window | t s | sentences/s | p99 ms | errors | by HTTP status |",
        "|---:|---:|---:|---:|---:|---|",
    ]
    lines += [
        f"| {r['window']} | {r['t_s']} | {r['sentences_per_s']} | {r['p99_ms']} | {r['errors']} | "
        + (", ".join(f"{k}: {v}" for k, v in r["error_statuses"].items()) or "-")
        + " |"
        for r in rows
    ]
    (args.out_dir / f"{args.out_name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
