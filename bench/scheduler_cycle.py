"""The scheduler's own Python per lone request (issue #19): a real `Scheduler` in process, one executor
registered (2 lanes), and for each request: `handle` of the gateway's message (decode, admit), the
`_poll_core` that dispatches it (place, form, encode the Batch), `handle` of the executor's result
(decode, complete, forward) and the `_poll_core` after it. No sockets: the sends are captured, so what
is timed is the Python a lone request costs in the scheduler's loop, not links or wake-ups. The
requests are built before the clock starts; each result is built between the timed calls.

    uv run python bench/scheduler_cycle.py [--n 6000] [--rounds 5]
    uv run python bench/scheduler_cycle.py --baseline TREE   # also TREE's scheduler (its .venv), alternating

Prints µs per request per phase (median of the rounds) and writes bench/results/scheduler_cycle.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
PHASES = ("admit", "dispatch", "complete", "poll_after")


def measure(n: int) -> dict[str, float]:
    """µs per lone request per phase over `n` requests, after 2,000 of warm-up."""
    from anvil_core import codec
    from anvil_core.codec import pb
    from anvil_scheduler.service import Scheduler
    from anvil_scheduler.settings import SchedulerSettings

    tmp = tempfile.mkdtemp(prefix="anvil-sched-cycle-")
    settings = SchedulerSettings(
        gateway_port=0, executor_port=0, link_bind_host="127.0.0.1", zmq_curve=False,
        link_ipc_dir=f"{tmp}/links", metrics_port=0,
    )  # fmt: skip
    s = Scheduler(settings)
    sent: list[list[Any]] = []

    def capture(ident: bytes, parts: list[Any]) -> bool:
        sent.append(parts)
        return True

    s._send_executor = capture  # type: ignore[method-assign]
    s._send_to = lambda gateway, parts: None  # type: ignore[method-assign]
    reg = pb.RegisterT(kind=pb.ServiceKind.EXECUTOR, serviceId="ex-1", device="cuda:0", maxBatch=64)
    reg.credits, reg.lanes = 4, 2
    reg.models = [pb.ModelSpecT(name="m", version="1", maxBatch=64)]
    s.handle(s._on_executor, [b"ex-1", *codec.pack(reg)])
    warm = 2000
    deadline = time.time_ns() + 10**12
    requests = [
        codec.build_request(
            request_id=f"r{i}",
            trace_id="t",
            model="m",
            version="",
            priority=2,
            deadline_unix_ns=deadline,
            tenant="",
        )
        for i in range(warm + n)
    ]
    totals = dict.fromkeys(PHASES, 0.0)
    clock = time.perf_counter
    for i, envelope in enumerate(requests):
        t0 = clock()
        s.handle(s._on_gateway, [b"gw-1", envelope])
        t1 = clock()
        s._poll_core(time.monotonic())
        t2 = clock()
        batch, _ = codec.unpack(sent.pop())
        result = pb.BatchResultT(batchId=batch.batchId, executorId="ex-1", computeUs=300, frameCounts=[1])
        answer = codec.build_response(request_id=f"r{i}", trace_id="t", model="m", outputs=[])
        message = [b"ex-1", *codec.pack(result, [answer])]
        t3 = clock()
        s.handle(s._on_executor, message)
        t4 = clock()
        s._poll_core(time.monotonic())
        t5 = clock()
        if i >= warm:
            for phase, dt in zip(PHASES, (t1 - t0, t2 - t1, t4 - t3, t5 - t4), strict=True):
                totals[phase] += dt
    s.gw.close()
    s.ex.close()
    if s.links is not None:
        s.links.close()
    s.ctx.term()
    s.bg.stop()
    out = {phase: round(total / n * 1e6, 1) for phase, total in totals.items()}
    out["total"] = round(sum(out[p] for p in PHASES), 1)
    return out


def _tree_commit(tree: Path) -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tree, capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=6000, help="requests timed per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--baseline", type=Path, help="another checkout (with its .venv) to measure alike")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)  # one round, JSON out
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(args.n)))
        return
    trees = {"now": (ROOT, sys.executable)}
    if args.baseline is not None:
        trees["base"] = (args.baseline, str(args.baseline / ".venv/bin/python"))
    rows: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for rnd in range(args.rounds):
        for name in list(trees)[:: 1 if rnd % 2 == 0 else -1]:  # alternate: drift hits both alike
            tree, python = trees[name]
            cmd = [python, str(Path(__file__).resolve()), "--child", "--n", str(args.n)]
            done = subprocess.run(cmd, cwd=tree, capture_output=True, text=True, check=True)
            rows[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(name, rnd, rows[name][-1], flush=True)
    sys.path.insert(0, str(ROOT / "bench"))
    from run_meta import run_meta

    meta = run_meta("bench/scheduler_cycle.py")
    medians = {
        name: {k: statistics.median(r[k] for r in rs) for k in (*PHASES, "total")}
        for name, rs in rows.items()
    }
    doc: dict[str, Any] = {
        "meta": meta,
        "n": args.n,
        "rounds": args.rounds,
        "median_us": medians,
        "rounds_us": rows,
    }
    if args.baseline is not None:
        doc["baseline_commit"] = _tree_commit(args.baseline)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "scheduler_cycle.json").write_text(json.dumps(doc, indent=1) + "\n")
    head = "| tree | " + " | ".join(PHASES) + " | total |"
    lines = [
        "# The scheduler's Python per lone request (`bench/scheduler_cycle.py`)",
        "",
        f"`{meta['command']}` · commit {meta['commit']}"
        + (f" (`now`) vs {doc['baseline_commit']} (`base`)" if args.baseline else "")
        + f" · {meta['machine']} · {meta['date']} · load {meta['load_1min_at_end']}",
        "",
        f"µs per request, median of {args.rounds} rounds of {args.n} requests (each round a fresh process):",
        "",
        head,
        "|---|" + "---:|" * (len(PHASES) + 1),
    ]
    for name, med in medians.items():
        lines.append(f"| {name} | " + " | ".join(f"{med[k]:.1f}" for k in (*PHASES, "total")) + " |")
    if args.baseline is not None:
        ratio = {k: medians["now"][k] / medians["base"][k] for k in (*PHASES, "total")}
        lines.append("| now / base | " + " | ".join(f"{ratio[k]:.2f}" for k in (*PHASES, "total")) + " |")
    (RESULTS / "scheduler_cycle.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
