"""What binding batches early to a busy executor costs, in the simulator (issue #19).

    uv run python bench/sim_credits.py --production-trace PATH

The live executor grants 2 credits (a batch queued behind the running one keeps the device busy across
the round trip) plus 1 reserved for priority 1; the simulator's comparison of policies
(bench/batching_sim.py) grants 1. EDF+PID releases a full batch as soon as a credit is free, so with 2
credits the next batch is formed, and bound, while the previous one still runs: a priority-1 request
arriving meanwhile cannot ride in it. This replays the live comparison's arrivals
(bench/live_scheduling.py: the same traces and priority mix) on the `busy` stand-in's service
model (t(B) = 4.5 + 1.1·B ms, as the live stack learned it) with credits 1, 2 and 3 per executor,
each with late binding off (the default) and on (ANVIL_LATE_BINDING: a full batch leaves for a busy
executor only as it is about to free up).
Writes bench/results/sim_credits.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import batching_sim as sim
import live_scheduling as live
from run_meta import run_meta

from anvil_client.bench.workload import Workload

RESULTS = Path(__file__).resolve().parent / "results"


def replay(name: str, times: Any, credits: int, late: bool, svc: sim.ServiceModel) -> dict[str, Any]:
    prios, _ = Workload(model="busy", priorities=dict(live.MIX), seed=0).pick(len(times))
    arrivals = live.Arrivals(name, tuple((float(t), int(p)) for t, p in zip(times, prios, strict=True)),
                             float(times.max()))  # fmt: skip
    res = sim.simulate("edf_pid", {}, arrivals, svc, False, {"late_binding": late}, credits)  # type: ignore[arg-type]
    return {
        "trace": name,
        "credits": credits,
        "late_binding": late,
        "goodput_rps": round(res.goodput_rps, 1),
        "p1_attainment": round(res.attainment.get(1, float("nan")), 4),
        "p1_p99_ms": round(res.p1_p99_ms, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--production-trace", type=Path, default=os.environ.get("ANVIL_PRODUCTION_TRACE"))
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--service-ms", default="4.5,1.1", help="BASE,PER_ROW ms of the service model")
    args = ap.parse_args()
    base, _, per_row = args.service_ms.partition(",")
    svc = sim.ServiceModel(base_ms=float(base), per_item_ms=float(per_row), max_batch=64)
    prod = Path(args.production_trace) if args.production_trace else None
    rows = [
        replay(name, sched.offsets_s, credits, late, svc)
        for name, sched in live.traces(args.seconds, prod)
        for credits in (1, 2, 3)
        for late in (False, True)
    ]
    meta = run_meta("bench/sim_credits.py") | {"service_model_ms": args.service_ms}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "sim_credits.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    md = ["# EDF+PID in the simulator: credits per executor, early and late binding", ""]
    md += [f"- {k}: {v}" for k, v in meta.items()] + [""]
    md += ["| trace | credits | late binding | goodput req/s | p1 attainment | p1 p99 ms |", "|" + "---|" * 6]
    md += [f"| {r['trace']} | {r['credits']} | {'on' if r['late_binding'] else 'off'} | {r['goodput_rps']} | "
           f"{r['p1_attainment']} | {r['p1_p99_ms']} |" for r in rows]  # fmt: skip
    (RESULTS / "sim_credits.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
