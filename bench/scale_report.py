"""bench/gpu_scale.py's summary: each row's ratio to the first configuration's same phase, issue #21's
two-GPU check, and the markdown table."""

from __future__ import annotations

from typing import Any

__all__ = ["markdown", "ratios"]

X2_MIN_RATIO = 1.8  # issue #21: 2 GPUs >= 1.8x the items/s of 1 GPU
X2_MAX_P99_MS = 50.0  # issue #21: MiniLM at p99 <= 50 ms
X2_MINILM_CONC = 16


def _measured(entry: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in entry.get("rows", []) if "items_per_s" in r]


def _key(row: dict[str, Any]) -> tuple[str, int]:
    return row["workload"], int(row["concurrency"])


def ratios(configs: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Sets each row's `ratio_to_first` (items/s over the first measured configuration's row of the
    same workload and concurrency); returns those ratios and the two-GPU check."""
    measured = [c for c in configs if _measured(c)]
    out: list[dict[str, Any]] = []
    if measured:
        base = {_key(r): r for r in _measured(measured[0])}
        for entry in measured:
            for row in _measured(entry):
                ref = base.get(_key(row))
                if ref and ref["items_per_s"]:
                    row["ratio_to_first"] = round(row["items_per_s"] / ref["items_per_s"], 3)
                    out.append(
                        {
                            "config": entry["config"],
                            "workload": row["workload"],
                            "concurrency": row["concurrency"],
                            "ratio": row["ratio_to_first"],
                        }
                    )
    return out, _x2_check(configs)


def _x2_check(configs: list[dict[str, Any]]) -> dict[str, Any]:
    one = next((c for c in configs if c["config"].endswith(",epg=1") and "+" not in c["config"]), None)
    two = next((c for c in configs if c["config"].count("+") == 1 and c["config"].endswith(",epg=1")), None)
    if two is None:
        return {"status": "not run", "why": "no 2-GPU configuration (gpus=0+1,epg=1) was asked for"}
    if not _measured(two):
        return {"status": "not run", "why": f"{two['config']}: {two.get('skipped') or two.get('failed')}"}
    if one is None or not _measured(one):
        return {"status": "not run", "why": "no measured 1-GPU configuration (gpus=N,epg=1) to compare with"}
    base = {_key(r): r for r in _measured(one)}
    checks = []
    for row in _measured(two):
        ref = base.get(_key(row))
        workload, conc = _key(row)
        gated = (workload.startswith("minilm") and conc == X2_MINILM_CONC) or workload.startswith("int4")
        if ref is None or not gated or not ref["items_per_s"]:
            continue
        ratio = row["items_per_s"] / ref["items_per_s"]
        ok = ratio >= X2_MIN_RATIO
        if workload.startswith("minilm"):
            ok = ok and row["p99_ms"] <= X2_MAX_P99_MS
        checks.append(
            {
                "workload": workload,
                "concurrency": conc,
                "ratio": round(ratio, 3),
                "p99_ms": row["p99_ms"],
                "met": ok,
            }
        )
    if not checks:
        return {"status": "not run", "why": "no MiniLM c16 or INT4 row in both the 1- and the 2-GPU run"}
    return {
        "status": "met" if all(c["met"] for c in checks) else "not met",
        "vs": one["config"],
        "target": f">= {X2_MIN_RATIO}x; MiniLM c{X2_MINILM_CONC} p99 <= {X2_MAX_P99_MS} ms",
        "checks": checks,
    }


def _gpu(row: dict[str, Any]) -> str:
    g = row.get("gpu")
    if not isinstance(g, dict):
        return "n/a"
    return " / ".join(f"{i}: {v['util_mean_pct']}%" for i, v in g.items())


def _cpu(row: dict[str, Any]) -> str:
    """CPU seconds per second of the phase, the busiest services first (cores used)."""
    wall = row.get("phase_s") or 1.0
    top = sorted(row.get("cpu_s", {}).items(), key=lambda kv: -kv[1])[:4]
    return ", ".join(f"{n} {s / wall:.2f}" for n, s in top)


def markdown(res: dict[str, Any]) -> str:
    m = res["machine"]
    lines = [
        "# Executor scaling: configurations of GPUs and executors per GPU (`bench/gpu_scale.py`)",
        "",
        f"- Command: `{res['command']}`",
        f"- Commit: {res['commit']}; date: {res['date']}; profile: {res['profile']}; model: {res['model']}",
        f"- Machine: {m['host']}, {m['cpus']} CPUs; GPUs: {m['gpus']}",
        f"- Load: closed loop, {res['load']}; settings: {res['settings'] or 'defaults'}",
        f"- Total {res.get('total_s')} s of a {res['budget_s']:.0f} s budget",
        "",
        "| config | workload | conc | items/s | x first | p50 ms | p99 ms | errors | mean batch (requests) "
        "| batches per executor | GPU util | cores used (top services) | host busy cores |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    notes = []
    for entry in res["configs"]:
        for row in entry.get("rows", []):
            if "skipped" in row:
                at = f" c{row['concurrency']}" if "concurrency" in row else ""
                notes.append(f"- {entry['config']} {row['workload']}{at}: skipped ({row['skipped']})")
                continue
            per = ", ".join(f"{n} {b}" for n, b in row["batches_per_executor"].items())
            cells = [
                entry["config"],
                row["workload"],
                row["concurrency"],
                f"{row['items_per_s']:,}",
                row.get("ratio_to_first", ""),
                row["p50_ms"],
                row["p99_ms"],
                row["errors"],
                row["mean_batch"],
                per,
                _gpu(row),
                _cpu(row),
                row["host_busy_cores"],
            ]
            lines.append("| " + " | ".join(str(c) for c in cells) + " |")
            if row.get("error_examples"):
                notes.append(
                    f"- {entry['config']} {row['workload']} c{row['concurrency']}: errors, e.g. "
                    f"{row['error_examples']}"
                )
        for what in ("skipped", "failed"):
            if what in entry:
                notes.append(f"- {entry['config']}: {what}: {entry[what]}")
    lines += ["", *notes, ""]
    x2 = res["x2_check"]
    lines.append(f"Issue #21 check (2 GPUs vs 1): **{x2['status']}**")
    if "checks" in x2:
        lines += [f"- vs {x2['vs']}, target {x2['target']}"]
        lines += [
            f"- {c['workload']} c{c['concurrency']}: {c['ratio']}x, p99 {c['p99_ms']} ms: "
            f"{'met' if c['met'] else 'NOT met'}"
            for c in x2["checks"]
        ]
    else:
        lines.append(f"- {x2['why']}")
    return "\n".join(lines) + "\n"
