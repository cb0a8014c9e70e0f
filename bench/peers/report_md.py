"""Renders bench/results/serving_peers.md from the run's JSON (table, ratios, verdict, caveats)."""

from __future__ import annotations

from typing import Any

PERF_ANALYZER_NOTE = (
    "perf_analyzer was not used: the pip `perf-analyzer` 2.60 wheel needs glibc 2.38 and this "
    "machine (Debian 12) has glibc 2.36; every server is driven by the `anvil bench` engine instead "
    "(closed loop, latency from send to last byte, KServe v2 JSON)."
)


_ROUNDS = (
    "- {} rounds, servers interleaved; each cell is the median over rounds; runs (req/s) lists every "
    "round's throughput"
)


def _row(rows: list[dict[str, Any]], c: int) -> dict[str, Any] | None:
    return next((r for r in rows if r["concurrency"] == c), None)


def render(doc: dict[str, Any]) -> str:
    servers: dict[str, Any] = doc["servers"]
    conc = sorted({r["concurrency"] for s in servers.values() for r in s["rows"]})
    out = [
        "# Serving peers: mlp4x1024",
        "",
        *([f"- command: `{doc['command']}` at {doc.get('commit') or '?'}"] if "command" in doc else []),
        f"- model: {doc['model']}",
        f"- protocol: {doc['protocol']}",
        f"- batching: {doc['batching']}",
        *([f"- BLAS threads: {doc['blas']}"] if "blas" in doc else []),
        f"- {doc['duration_s']:g} s per concurrency level after a 3 s warm-up; started {doc['started']}",
        *([_ROUNDS.format(doc["rounds"])] if doc.get("rounds", 1) > 1 else []),
        f"- machine: {doc['machine']}; load average before {doc['load_before'][0]:.1f}, "
        f"after {doc['load_after'][0]:.1f}"
        + (" (other work shared the machine: numbers are noisy)" if doc["load_before"][0] > 1.5 else ""),
        f"- {PERF_ANALYZER_NOTE}",
        "",
        "| server | concurrency | throughput (req/s) | p50 (ms) | p99 (ms) | errors | runs (req/s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, s in servers.items():
        if not s["rows"]:
            out.append(f"| {name} | - | failed: {s.get('error', '?')[:120]} | | | | |")
        for r in s["rows"]:
            errs = sum(r["errors"].values())
            runs = ", ".join(f"{v:g}" for v in r.get("runs_rps", []))
            cells = (name, r["concurrency"], r["throughput_rps"], r["p50_ms"], r["p99_ms"], errs, runs)
            out.append("| " + " | ".join(str(c) for c in cells) + " |")
    out += ["", "## Anvil against the best peer", ""]
    anvil = servers.get("anvil", {"rows": []})["rows"]
    for c in conc:
        a = _row(anvil, c)
        peers: list[tuple[str, dict[str, Any]]] = []
        for n, s in servers.items():
            r = _row(s["rows"], c)
            if n != "anvil" and r is not None:
                peers.append((n, r))
        if a is None or not peers:
            continue
        best_name, best = max(peers, key=lambda nr: nr[1]["throughput_rps"])
        ratio = a["throughput_rps"] / max(best["throughput_rps"], 1e-9)
        out.append(
            f"- concurrency {c}: Anvil {a['throughput_rps']} req/s (p99 {a['p99_ms']} ms) vs best peer "
            f"{best_name} {best['throughput_rps']} req/s (p99 {best['p99_ms']} ms): {ratio:.2f}x throughput, "
            f"p99 {'at or below' if a['p99_ms'] <= best['p99_ms'] else 'above'} the peer's"
        )
    a_runs = (_row(anvil, 64) or {}).get("runs_rps", [])
    if len(a_runs) > 1:  # the same round's peers ran minutes apart from Anvil, not days
        per_round = []
        for i, a_rps in enumerate(a_runs):
            best_rps = max(
                (r["runs_rps"][i] for n, s in servers.items() if n != "anvil"
                 for r in [_row(s["rows"], 64)] if r is not None and len(r.get("runs_rps", [])) > i),
                default=0.0,
            )  # fmt: skip
            if best_rps:
                per_round.append(f"{a_rps / best_rps:.2f}x")
        out.append(f"- concurrency 64, round by round: Anvil / best peer = {', '.join(per_round)}")
    a64 = _row(anvil, 64)
    peers64 = [r for n, s in servers.items() if n != "anvil" for r in [_row(s["rows"], 64)] if r is not None]
    if a64 and peers64:
        best64 = max(peers64, key=lambda r: r["throughput_rps"])
        met = a64["throughput_rps"] >= 2 * best64["throughput_rps"] and a64["p99_ms"] <= best64["p99_ms"]
        out += ["", f"Target (Anvil >= 2x the best peer's throughput at equal or lower p99, concurrency 64): "
                f"**{'met' if met else 'not met'}**."]  # fmt: skip
    return "\n".join(out) + "\n"
