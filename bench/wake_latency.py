"""What waking a sleeping thread costs on this host (issue #19: a lone request crosses ~8 hand-offs
between threads and processes; on the H200 host its "transit" was ~1 ms against ~0.3 ms here).

Standard library only, so it runs anywhere (the H200 machine included) without wheels. Round trips of
one 64-byte message, ``--n`` times per case, with ``--gap-ms`` of sleep between round trips so every
thread involved has gone idle (as for a lone request), and the same with no gap (threads stay hot):

- ``proc_socket``: two processes over a Unix stream socket pair, blocking reads;
- ``proc_socket_spin``: the same, but the echo side polls its non-blocking socket for up to
  ``--spin-us`` before it blocks (the busy-poll a service could do between messages; the default
  covers the gap, so it shows what a poller that never sleeps would get, for one core's time);
- ``thread_queue``: two threads of one process over ``queue.Queue`` (the GIL and a condition variable).

Prints p50 / p90 / p99 µs per case and writes ``--out``/wake_latency.json.

    python3 bench/wake_latency.py [--n 3000] [--gap-ms 2] [--spin-us 3000] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import socket
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_meta import run_meta

MSG = b"x" * 64


def _echo(sock: socket.socket, spin_us: float) -> None:
    spin_ns = int(spin_us * 1000)
    while True:
        if spin_ns:
            sock.setblocking(False)
            end = time.perf_counter_ns() + spin_ns
            data = b""
            while time.perf_counter_ns() < end:
                try:
                    data = sock.recv(64)
                    break
                except BlockingIOError:
                    continue
            sock.setblocking(True)
            if not data:
                data = sock.recv(64)
        else:
            data = sock.recv(64)
        if not data:
            return
        sock.sendall(data)


def _timed(round_trip: Callable[[], None], n: int, gap_s: float) -> list[float]:
    """µs per call of round_trip, n times, sleeping gap_s before each (0: back to back)."""
    out = []
    for _ in range(n):
        if gap_s:
            time.sleep(gap_s)
        t = time.perf_counter_ns()
        round_trip()
        out.append((time.perf_counter_ns() - t) / 1000)
    return out


def _proc_rtts(n: int, gap_s: float, spin_us: float) -> list[float]:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:
        a.close()
        try:
            _echo(b, spin_us)
        finally:
            os._exit(0)
    b.close()

    def round_trip() -> None:
        a.sendall(MSG)
        got = 0
        while got < len(MSG):
            got += len(a.recv(64))

    out = _timed(round_trip, n, gap_s)
    a.close()
    os.waitpid(pid, 0)
    return out


def _thread_rtts(n: int, gap_s: float) -> list[float]:
    q_in: queue.Queue[bytes | None] = queue.Queue()
    q_out: queue.Queue[bytes] = queue.Queue()

    def echo() -> None:
        while (m := q_in.get()) is not None:
            q_out.put(m)

    th = threading.Thread(target=echo, daemon=True)
    th.start()

    def round_trip() -> None:
        q_in.put(MSG)
        q_out.get()

    out = _timed(round_trip, n, gap_s)
    q_in.put(None)
    th.join()
    return out


def _summary(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    return {
        "p50_us": round(statistics.median(xs), 1),
        "p90_us": round(xs[int(0.9 * (len(xs) - 1))], 1),
        "p99_us": round(xs[int(0.99 * (len(xs) - 1))], 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--gap-ms", type=float, default=2.0)
    ap.add_argument("--spin-us", type=float, default=3000.0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    gap = args.gap_ms / 1000
    cases = {
        "proc_socket idle": lambda: _proc_rtts(args.n, gap, 0),
        "proc_socket hot": lambda: _proc_rtts(args.n, 0, 0),
        "proc_socket_spin idle": lambda: _proc_rtts(args.n, gap, args.spin_us),
        "thread_queue idle": lambda: _thread_rtts(args.n, gap),
        "thread_queue hot": lambda: _thread_rtts(args.n, 0),
    }
    res = {}
    for name, fn in cases.items():
        res[name] = _summary(fn())
        print(f"{name:24s} {res[name]}", flush=True)
    meta = run_meta("bench/wake_latency.py")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "wake_latency.json").write_text(json.dumps({"meta": meta, "cases": res}, indent=1))


if __name__ == "__main__":
    main()
