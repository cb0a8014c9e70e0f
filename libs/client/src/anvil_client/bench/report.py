"""Turns a run into numbers: latency per priority, SLO attainment, goodput, time series, lag.

SLO attainment of a priority = requests of that priority answered 200 within its SLO / requests of
that priority sent (errors and timeouts count as misses). Goodput = such requests per second.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

import numpy as np

from anvil_client.bench.engine import HOPS, TRANSIT_HOPS, RunResult
from anvil_client.bench.scrape import BatchSamples
from anvil_core.priorities import DEFAULT_SLO_MS

__all__ = ["SLO_MS", "summarize", "write_reports"]

SLO_MS = {p: float(ms) for p, ms in DEFAULT_SLO_MS.items()}  # the defaults of ANVIL_SLO_P{1,2,3}_MS
_Q = (50, 90, 99, 99.9)


def _pct(x: np.ndarray) -> dict[str, float | None]:
    if x.size == 0:
        empty: dict[str, float | None] = {f"p{q:g}": None for q in _Q}
        return empty | {"max": None, "mean": None}
    vals = np.percentile(x, _Q)
    out: dict[str, float | None] = {f"p{q:g}": round(float(v), 3) for q, v in zip(_Q, vals, strict=True)}
    return out | {"max": round(float(x.max()), 3), "mean": round(float(x.mean()), 3)}


def _reason_class(status: int, text: str) -> str:
    if status <= 0:
        return "timeout (client)" if status < 0 else "transport error"
    try:
        msg = str(json.loads(text).get("error", ""))
    except (ValueError, AttributeError):
        msg = text
    return f"{status} {msg.split(':')[0][:60]}"


def summarize(
    r: RunResult, slo_ms: dict[int, float] | None = None, timeout_us: int | None = None
) -> dict[str, Any]:
    slo = dict(SLO_MS if slo_ms is None else slo_ms)
    if timeout_us:
        slo = {p: min(v, timeout_us / 1000) for p, v in slo.items()}
    lat_ms = r.latency_s * 1e3
    ok = r.status == 200
    span = max(float(np.nanmax(r.done_s)) if np.isfinite(r.done_s).any() else r.wall_s, 1e-9)
    per_prio: dict[str, Any] = {}
    good_total = 0
    for p in sorted({int(x) for x in r.priority}):
        sel = r.priority == p
        good = sel & ok & (lat_ms <= slo[p])
        good_total += int(good.sum())
        per_prio[str(p)] = {
            "slo_ms": slo[p],
            "sent": int(sel.sum()),
            "ok": int((sel & ok).sum()),
            "latency_ms": _pct(lat_ms[sel & ok]),
            "slo_attainment": round(float(good.sum() / max(1, sel.sum())), 5),
            "hops_ms": hop_breakdown(r, sel & ok, lat_ms),
        }
    errors: dict[str, int] = {}
    for i, text in r.reasons.items():
        key = _reason_class(int(r.status[i]), text)
        errors[key] = errors.get(key, 0) + 1
    lag_ms = r.lag_s[np.isfinite(r.lag_s)] * 1e3
    return {
        "mode": r.mode,
        **r.meta,
        "started_unix": r.started_unix,
        "wall_s": round(r.wall_s, 3),
        "sent": int(r.status.size),
        "ok": int(ok.sum()),
        "errors": dict(sorted(errors.items(), key=lambda kv: -kv[1])),
        "offered_rps": round(r.status.size / max(r.wall_s, 1e-9), 1),
        "throughput_rps": round(float(ok.sum()) / span, 1),
        "goodput_rps": round(good_total / span, 1),
        "slo_attainment": round(good_total / max(1, r.status.size), 5),
        "latency_ms": _pct(lat_ms[ok]),
        "priorities": per_prio,
        "answered_exactly_once": int((r.answers == 1).sum()),
        "unanswered": int((r.answers == 0).sum()),
        "duplicated": int((r.answers > 1).sum()),
        "id_mismatches": r.id_mismatches,
        "generator": {"lag_ms": _pct(lag_ms), "connections_opened": r.connections_opened},
    }


def hop_breakdown(r: RunResult, sel: np.ndarray, lat_ms: np.ndarray) -> dict[str, Any]:
    """Per hop, p50/p99/mean in ms over the selected requests that carried the gateway's hop header,
    plus ``outside`` = latency - the reported hops (HTTP accept and parse before the handler, the
    response's encoding and write, the client, the generator's lag); then transit's parts
    (TRANSIT_HOPS) over the requests whose header carried them."""
    if r.hops_us is None:
        return {}
    n = len(HOPS)
    has = sel & np.isfinite(r.hops_us[:, :n]).all(axis=1)
    if not has.any():
        return {}
    hops_ms = r.hops_us[has, :n] / 1e3
    cols = {name: hops_ms[:, j] for j, name in enumerate(HOPS)}
    cols["outside"] = lat_ms[has] - hops_ms.sum(axis=1)
    split = r.hops_us[has, n:] / 1e3
    split = split[np.isfinite(split).all(axis=1)] if split.shape[1] else split[:0]
    if len(split):
        cols |= {name: split[:, j] for j, name in enumerate(TRANSIT_HOPS)}
    out: dict[str, Any] = {"requests": int(has.sum())}
    for name, x in cols.items():
        p50, p99 = np.percentile(x, (50, 99))
        out[name] = {"p50": round(float(p50), 3), "p99": round(float(p99), 3)}
        out[name]["mean"] = round(float(x.mean()), 3)
    return out


def series(r: RunResult, bin_s: float = 1.0) -> dict[str, list[float]]:
    """Per `bin_s` of intended send time: offered and answered-ok rates, and p99 of the ok latencies."""
    if r.status.size == 0:
        return {"t_s": [], "offered_rps": [], "ok_rps": [], "p99_ms": []}
    bins = np.floor(r.intended_s / bin_s).astype(np.int64)
    t, offered, okr, p99 = [], [], [], []
    lat_ms = r.latency_s * 1e3
    for b in range(int(bins.max()) + 1):
        sel = bins == b
        oks = sel & (r.status == 200)
        t.append((b + 0.5) * bin_s)
        offered.append(float(sel.sum()) / bin_s)
        okr.append(float(oks.sum()) / bin_s)
        p99.append(float(np.percentile(lat_ms[oks], 99)) if oks.any() else float("nan"))
    return {"t_s": t, "offered_rps": offered, "ok_rps": okr, "p99_ms": p99}


def _md_table(header: list[str], rows: list[list[object]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return out + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]


def _sections(s: dict[str, Any]) -> list[tuple[str, list[str], list[list[object]]]]:
    head = [
        ["mode", s["mode"]],
        ["requests sent", s["sent"]],
        ["answered 200", s["ok"]],
        ["offered load (req/s)", s["offered_rps"]],
        ["throughput (req/s)", s["throughput_rps"]],
        ["goodput, 200 within SLO (req/s)", s["goodput_rps"]],
        ["SLO attainment (all priorities)", s["slo_attainment"]],
        [
            "answered exactly once / unanswered / duplicated",
            f"{s['answered_exactly_once']} / {s['unanswered']} / {s['duplicated']}",
        ],
        ["generator lag p50 / p99 / max (ms)", "{p50} / {p99} / {max}".format(**s["generator"]["lag_ms"])],
    ]
    prio_rows = [
        [
            p,
            d["slo_ms"],
            d["sent"],
            d["ok"],
            d["latency_ms"]["p50"],
            d["latency_ms"]["p99"],
            d["latency_ms"]["p99.9"],
            d["slo_attainment"],
        ]
        for p, d in s["priorities"].items()
    ]
    err_rows: list[list[object]] = [[k, v] for k, v in s["errors"].items()] or [["none", 0]]
    hop_rows = [
        [p, hop, h["mean"], h["p50"], h["p99"]]
        for p, d in s["priorities"].items()
        for hop, h in d.get("hops_ms", {}).items()
        if hop != "requests"
    ]
    return [
        ("Summary", ["metric", "value"], head),
        ("Per priority (latency of 200s, ms, from the intended send time)",
         ["priority", "SLO ms", "sent", "ok", "p50", "p99", "p99.9", "SLO attainment"], prio_rows),
        ("Errors by reason", ["reason", "count"], err_rows),
        ("Per priority and hop (ms; from the gateway's x-anvil-hops-us header; outside = the rest)",
         ["priority", "hop", "mean", "p50", "p99"], hop_rows or [["-", "no hop header", "", "", ""]]),
    ]  # fmt: skip


def write_reports(
    out_dir: Path, name: str, summary: dict[str, Any], r: RunResult, batches: BatchSamples | None
) -> list[Path]:
    """`<name>.json`, `<name>.md`, `<name>.html` and PNG plots (when matplotlib is importable)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    ts = series(r)
    doc = {"summary": summary, "series": ts, "batches": batches.mean_batch() if batches else []}
    paths = [out_dir / f"{name}.json"]
    paths[0].write_text(json.dumps(doc, indent=1, default=float))
    from anvil_client.bench.plots import plot_all  # matplotlib is imported only here

    pngs, why_not = plot_all(out_dir, name, r, ts, batches)
    md = [f"# anvil bench: {name}", ""]
    body = [
        "<html><head><meta charset='utf-8'><title>anvil bench</title></head><body>",
        f"<h1>anvil bench: {html.escape(name)}</h1>",
    ]
    for title, header, rows in _sections(summary):
        md += [f"## {title}", "", *_md_table(header, rows), ""]
        body.append(f"<h2>{html.escape(title)}</h2><table border=1 cellpadding=4>")
        body.append("<tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in header) + "</tr>")
        body += ["<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows]
        body.append("</table>")
    md += ["## Plots", ""]
    for png in pngs:
        md.append(f"![{png.stem}]({png.name})")
        body.append(f"<p><img src='{html.escape(png.name)}' width=720></p>")
    if why_not:
        md.append(f"(no plots: {why_not})")
        body.append(f"<p>(no plots: {html.escape(why_not)})</p>")
    (out_dir / f"{name}.md").write_text("\n".join(md) + "\n")
    (out_dir / f"{name}.html").write_text("\n".join([*body, "</body></html>"]) + "\n")
    return [*paths, out_dir / f"{name}.md", out_dir / f"{name}.html", *pngs]
