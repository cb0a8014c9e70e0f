"""What the eBPF probes cost the processes they watch (and those they don't). Needs root + bcc.

    uv run python services/qos/bench/probe_overhead.py [--reps 7]

- scheduler probe: two processes ping-pong one byte over pipes, pinned to one core; every round trip
  is 2 wakeups + 2 context switches, i.e. 4 events through the run-queue programs. Cases: no probe;
  probe loaded, processes not targeted (each event: a hash lookup, then out); targeted (timestamps,
  histogram and totals updated).
- uprobe: a process calls libc getpid() in a loop; each call traps into the kernel's uprobe handler
  when attached, whether or not the process is a target (the target check is inside the program).
- TCP probe: connect + accept + close on a loopback listener (~6 state changes each).
Prints a table of medians and writes services/qos/bench/results/probe_overhead.json.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from anvil_qos.probes.cuda import CudaProbe
from anvil_qos.probes.runqueue import RunQueueProbe
from anvil_qos.probes.tcp import TcpProbe
from anvil_qos.targets import Target

RESULTS = Path(__file__).parent / "results" / "probe_overhead.json"
CPU = max(os.sched_getaffinity(0))


def pingpong(rounds: int, on_start: Callable[[int], None] = lambda pid: None) -> float:
    """ns per round trip between this process and a forked child, both on one core."""
    a_r, a_w = os.pipe()
    b_r, b_w = os.pipe()
    os.sched_setaffinity(0, {CPU})
    child = os.fork()
    if child == 0:
        for _ in range(rounds + 100):
            os.read(a_r, 1)
            os.write(b_w, b"x")
        os._exit(0)
    on_start(child)
    for _ in range(100):  # warm-up
        os.write(a_w, b"x")
        os.read(b_r, 1)
    t0 = time.perf_counter_ns()
    for _ in range(rounds):
        os.write(a_w, b"x")
        os.read(b_r, 1)
    elapsed = time.perf_counter_ns() - t0
    os.waitpid(child, 0)
    for fd in (a_r, a_w, b_r, b_w):
        os.close(fd)
    os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))
    return elapsed / rounds


CALLER = """
import os, sys, time
n = int(sys.argv[1])
sys.stdin.readline()
t0 = time.perf_counter_ns()
for _ in range(n):
    os.getpid()
print((time.perf_counter_ns() - t0) / n, flush=True)
"""


def getpid_loop(n: int, probe: CudaProbe | None, targeted: bool) -> float:
    """ns per os.getpid() call in a fresh process."""
    proc = subprocess.Popen(
        [sys.executable, "-c", CALLER, str(n)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    if probe is not None:
        probe.set_targets([Target("executor", "bench", proc.pid)] if targeted else [])
    out, _ = proc.communicate("go\n")
    return float(out)


def connect_loop(n: int, probe: TcpProbe | None = None) -> float:
    """ns per connect + accept + close on loopback; the listener's port is watched when probed."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    port = srv.getsockname()[1]
    if probe is not None:
        probe.set_ports([port])
    t0 = time.perf_counter_ns()
    for _ in range(n):
        c = socket.create_connection(("127.0.0.1", port))
        s, _ = srv.accept()
        c.close()
        s.close()
    elapsed = time.perf_counter_ns() - t0
    srv.close()
    return elapsed / n


def _some_pids(n: int) -> list[int]:
    return sorted(int(p) for p in os.listdir("/proc") if p.isdigit())[:n]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--rounds", type=int, default=20000)
    args = parser.parse_args()
    libc = next(
        line.split(maxsplit=5)[-1]
        for line in Path("/proc/self/maps").read_text().splitlines()
        if "/libc.so" in line
    )
    runs: dict[str, list[float]] = {}

    def add(name: str, value: float) -> None:
        runs.setdefault(name, []).append(value)

    for _ in range(args.reps):
        add("sched: no probe", pingpong(args.rounds))
        rq = RunQueueProbe()
        add("sched: probe, not targeted", pingpong(args.rounds))
        me = os.getpid()

        def target_both(child: int, rq: RunQueueProbe = rq, me: int = me) -> None:
            rq.set_targets([Target("x", "parent", me), Target("x", "child", child)])

        add("sched: probe, targeted", pingpong(args.rounds, target_both))
        rq.close()

        add("getpid: no probe", getpid_loop(200_000, None, False))
        up = CudaProbe(libc, launch=("getpid",), sync=())
        up.set_targets([])
        add("getpid: uprobe, not targeted", getpid_loop(200_000, up, False))
        add("getpid: uprobe, targeted", getpid_loop(200_000, up, True))
        up.close()

        add("tcp connect+close: no probe", connect_loop(2000))
        tcp = TcpProbe()
        add("tcp connect+close: probe, port watched", connect_loop(2000, tcp))
        tcp.close()

        # What one qos tick costs in user space: reading every map of the observer.
        from anvil_qos.observer import EbpfObserver

        obs = EbpfObserver()
        obs.set_targets([Target("x", str(i), pid) for i, pid in enumerate(_some_pids(5))], [8000])
        obs.sample()
        t0 = time.perf_counter_ns()
        for _ in range(20):
            obs.sample()
        add("qos tick: sample() with 5 targets", (time.perf_counter_ns() - t0) / 20)
        obs.close()

    # Medians, and minimums: on a shared machine the minimum is the least disturbed estimate.
    med = {k: statistics.median(v) for k, v in runs.items()}
    low = {k: min(v) for k, v in runs.items()}
    bases = {"sched": "sched: no probe", "getpid": "getpid: no probe", "tcp": "tcp connect+close: no probe"}
    print(f"{'case':<40}{'median ns':>12}{'added':>10}{'min ns':>12}{'added':>10}")
    for name in runs:
        base = bases.get(name.split(" ")[0].rstrip(":"))
        add_med = med[name] - med[base] if base else 0.0
        add_min = low[name] - low[base] if base else 0.0
        print(f"{name:<40}{med[name]:>12.0f}{add_med:>10.0f}{low[name]:>12.0f}{add_min:>10.0f}")
    print("sched: 4 events per round trip (2 wakeups, 2 switches): added / 4 = ns per event")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "median_ns_per_op": med,
                "min_ns_per_op": low,
                "runs": runs,
                "reps": args.reps,
                "kernel": os.uname().release,
                "loadavg_at_end": os.getloadavg(),
            },
            indent=2,
        )
    )
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
