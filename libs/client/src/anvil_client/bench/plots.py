"""PNG plots of a run (matplotlib, Agg backend; optional: without it the report says so)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from anvil_client.bench.engine import RunResult
from anvil_client.bench.report import SLO_MS
from anvil_client.bench.scrape import BatchSamples

__all__ = ["plot_all"]


def plot_all(
    out_dir: Path, name: str, r: RunResult, ts: dict[str, list[float]], batches: BatchSamples | None
) -> tuple[list[Path], str | None]:
    """Latency CDF per priority, throughput + p99 over time, batch size over time."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return [], "matplotlib is not installed (pip install 'anvil-client[bench]')"
    paths = [
        _cdf(plt, out_dir / f"{name}_latency_cdf.png", r),
        _timeline(plt, out_dir / f"{name}_timeline.png", ts),
    ]
    if batches is not None and len(batches.t_s) > 1:
        paths.append(_batches(plt, out_dir / f"{name}_batch.png", batches))
    return paths, None


def _cdf(plt: Any, path: Path, r: RunResult) -> Path:
    fig, ax = plt.subplots(figsize=(8, 4.5))
    lat_ms = r.latency_s * 1e3
    for p in sorted({int(x) for x in r.priority}):
        x = np.sort(lat_ms[(r.priority == p) & (r.status == 200)])
        if x.size:
            line = ax.plot(x, np.arange(1, x.size + 1) / (r.priority == p).sum(), label=f"priority {p}")
            ax.axvline(SLO_MS[p], ls=":", color=line[0].get_color(), label=f"SLO p{p} {SLO_MS[p]:g} ms")
    ax.set_xscale("log")
    ax.set_xlabel("latency from intended send time (ms, log)")
    ax.set_ylabel("share of sent requests answered 200")
    ax.set_ylim(0, 1.01)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("Latency CDF per priority")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _timeline(plt: Any, path: Path, ts: dict[str, list[float]]) -> Path:
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(ts["t_s"], ts["offered_rps"], label="offered (req/s)", color="0.6")
    ax.plot(ts["t_s"], ts["ok_rps"], label="answered 200 (req/s)", color="C0")
    ax.set_xlabel("intended send time (s)")
    ax.set_ylabel("req/s")
    ax2 = ax.twinx()
    ax2.plot(ts["t_s"], ts["p99_ms"], label="p99 (ms)", color="C3")
    ax2.set_ylabel("p99 latency (ms)")
    ax2.set_yscale("log")
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], fontsize=8, loc="upper left")
    ax.grid(True, alpha=0.3)
    ax.set_title("Throughput and p99 per second")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _batches(plt: Any, path: Path, b: BatchSamples) -> Path:
    fig, ax = plt.subplots(figsize=(8, 4.5))
    mean = b.mean_batch()
    if mean:
        ax.plot([t for t, _ in mean], [v for _, v in mean], label="mean batch dispatched", color="C0")
    ax.plot(b.t_s, b.target, label="PID target B*", color="C1", ls="--")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("requests per batch")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("Scheduler batch size (from its /metrics)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
