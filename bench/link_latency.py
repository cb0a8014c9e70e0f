"""Round trip of one small message between two processes on this host, by transport (issue #19's lone
request: where the ~1 ms of "transit" in a c1 request goes).

A client process sends a `--bytes` message and waits for the echo, `--messages` times, sleeping
`--gap-ms` between round trips so that, as for a lone request, every thread involved has gone back to
sleep before the next message. Transports, each against a fresh echo process:

- `zmq_ipc_blocking`: DEALER -> ROUTER over ipc, blocking sockets at both ends (what the scheduler
  and the executor's I/O thread do);
- `zmq_ipc_curve_asyncio`: the same with CURVE on (the stack's links are authenticated) and the client
  on `zmq.asyncio` (what the gateway does);
- `unix_asyncio`: a Unix stream socket, asyncio streams at both ends (no ZeroMQ I/O threads);
- `unix_blocking`: a Unix stream socket, blocking reads at both ends.

Per transport: p50 / p90 / p99 round trip in µs, and the ratio of each p50 to `unix_asyncio`'s.
A lone request crosses two round trips (gateway <-> scheduler, scheduler <-> executor). Rounds
alternate the transports (`--rounds`), and the medians over rounds are reported.
Writes bench/results/link_latency.{json,md}.

    uv run python bench/link_latency.py [--messages 2000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq
import zmq.asyncio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from run_meta import run_meta  # noqa: E402

RESULTS = ROOT / "bench" / "results"
QUIT = b"q"


def _echo_zmq(endpoint: str, server_secret: bytes | None) -> None:
    ctx = zmq.Context()
    s = ctx.socket(zmq.ROUTER)
    if server_secret is not None:
        s.curve_server = True
        s.curve_secretkey = server_secret
    s.bind(endpoint)
    while True:
        frames = s.recv_multipart()
        if frames[-1] == QUIT:
            break
        s.send_multipart(frames)
    s.close(0)
    ctx.term()


def _echo_unix_asyncio(path: str, size: int) -> None:
    async def main() -> None:
        done = asyncio.Event()

        async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            while True:
                data = await r.readexactly(size)
                if data[:1] == QUIT:
                    break
                w.write(data)
            w.close()
            done.set()

        server = await asyncio.start_unix_server(handle, path)
        async with server:
            await done.wait()

    asyncio.run(main())


def _echo_unix_blocking(path: str, size: int) -> None:
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(1)
    conn, _ = srv.accept()
    while True:
        data = _read_exactly(conn, size)
        if data[:1] == QUIT:
            break
        conn.sendall(data)
    conn.close()
    srv.close()


def _read_exactly(conn: socket.socket, size: int) -> bytes:
    buf = bytearray()
    while len(buf) < size:
        chunk = conn.recv(size - len(buf))
        if not chunk:
            raise ConnectionError("peer closed")
        buf += chunk
    return bytes(buf)


def _client_zmq_blocking(endpoint: str, msg: bytes, n: int, gap_s: float) -> list[float]:
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.connect(endpoint)
    out = []
    for _ in range(n):
        t = time.perf_counter()
        s.send(msg)
        s.recv()
        out.append(time.perf_counter() - t)
        time.sleep(gap_s)
    s.send(QUIT)
    s.close(1000)
    ctx.term()
    return out


async def _client_zmq_asyncio(
    endpoint: str, msg: bytes, n: int, gap_s: float, server_public: bytes
) -> list[float]:
    ctx = zmq.asyncio.Context()
    s = ctx.socket(zmq.DEALER)
    public, secret = zmq.curve_keypair()
    s.curve_serverkey, s.curve_publickey, s.curve_secretkey = server_public, public, secret
    s.connect(endpoint)
    out = []
    for _ in range(n):
        t = time.perf_counter()
        await s.send(msg)
        await s.recv()
        out.append(time.perf_counter() - t)
        await asyncio.sleep(gap_s)
    await s.send(QUIT)
    s.close(1000)
    ctx.term()
    return out


async def _client_unix_asyncio(path: str, msg: bytes, n: int, gap_s: float) -> list[float]:
    r, w = await asyncio.open_unix_connection(path)
    out = []
    for _ in range(n):
        t = time.perf_counter()
        w.write(msg)
        await r.readexactly(len(msg))
        out.append(time.perf_counter() - t)
        await asyncio.sleep(gap_s)
    w.write(QUIT + msg[1:])
    await w.drain()
    w.close()
    return out


def _client_unix_blocking(path: str, msg: bytes, n: int, gap_s: float) -> list[float]:
    c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    c.connect(path)
    out = []
    for _ in range(n):
        t = time.perf_counter()
        c.sendall(msg)
        _read_exactly(c, len(msg))
        out.append(time.perf_counter() - t)
        time.sleep(gap_s)
    c.sendall(QUIT + msg[1:])
    c.close()
    return out


def _wait_for(path: str, timeout_s: float = 10.0) -> None:
    end = time.monotonic() + timeout_s
    while not os.path.exists(path):
        if time.monotonic() > end:
            raise TimeoutError(f"the echo process did not bind {path}")
        time.sleep(0.01)


def run_transport(name: str, size: int, n: int, gap_s: float, work: Path) -> list[float]:
    """One transport's round trips (seconds), against its own echo process."""
    path = str(work / f"{name}.sock")
    msg = b"x" * size
    client: Callable[[], list[float]]
    if name.startswith("zmq"):
        public, secret = zmq.curve_keypair()
        curve = "curve" in name
        proc = mp.Process(target=_echo_zmq, args=(f"ipc://{path}", secret if curve else None))
        proc.start()
        _wait_for(path)
        if name == "zmq_ipc_blocking":
            client = lambda: _client_zmq_blocking(f"ipc://{path}", msg, n, gap_s)  # noqa: E731
        else:
            client = lambda: asyncio.run(_client_zmq_asyncio(f"ipc://{path}", msg, n, gap_s, public))  # noqa: E731
    elif name == "unix_asyncio":
        proc = mp.Process(target=_echo_unix_asyncio, args=(path, size))
        proc.start()
        _wait_for(path)
        client = lambda: asyncio.run(_client_unix_asyncio(path, msg, n, gap_s))  # noqa: E731
    else:
        proc = mp.Process(target=_echo_unix_blocking, args=(path, size))
        proc.start()
        _wait_for(path)
        client = lambda: _client_unix_blocking(path, msg, n, gap_s)  # noqa: E731
    try:
        return client()
    finally:
        proc.join(10)
        if proc.is_alive():
            proc.kill()
        if os.path.exists(path):
            os.unlink(path)


TRANSPORTS = ("zmq_ipc_blocking", "zmq_ipc_curve_asyncio", "unix_asyncio", "unix_blocking")


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=2000, help="round trips per transport and round")
    ap.add_argument("--rounds", type=int, default=3, help="rounds, the transports in rotating order")
    ap.add_argument("--bytes", type=int, default=200, help="message size, bytes (a lone request's envelope)")
    ap.add_argument("--gap-ms", type=float, default=2.0, help="sleep between round trips, ms")
    ap.add_argument("--out-name", default="link_latency")
    args = ap.parse_args()
    if args.messages < 10 or args.rounds < 1 or args.bytes < 2:
        ap.error("--messages >= 10, --rounds >= 1, --bytes >= 2")
    per: dict[str, list[dict[str, float]]] = {t: [] for t in TRANSPORTS}
    with tempfile.TemporaryDirectory(prefix="anvil-link-") as tmp:
        for rnd in range(args.rounds):
            order = TRANSPORTS[rnd % len(TRANSPORTS) :] + TRANSPORTS[: rnd % len(TRANSPORTS)]
            for name in order:
                rtt = run_transport(name, args.bytes, args.messages, args.gap_ms / 1000, Path(tmp))
                row = {q: _pct(rtt, v) * 1e6 for q, v in (("p50_us", 0.5), ("p90_us", 0.9), ("p99_us", 0.99))}
                per[name].append(row)
                shown = "  ".join(f"{k} {v:7.1f}" for k, v in row.items())
                print(f"round {rnd + 1} {name:24s} {shown}", flush=True)
    rows: list[dict[str, Any]] = []
    for name in TRANSPORTS:
        med = {k: statistics.median(x[k] for x in per[name]) for k in ("p50_us", "p90_us", "p99_us")}
        rows.append({"transport": name, **{k: round(v, 1) for k, v in med.items()}})
    base = next(r["p50_us"] for r in rows if r["transport"] == "unix_asyncio")
    for r in rows:
        r["p50_vs_unix_asyncio"] = round(r["p50_us"] / base, 2)
    meta = {
        **run_meta("bench/link_latency.py"),
        "pyzmq": zmq.__version__,
        "libzmq": zmq.zmq_version(),
        "messages": args.messages,
        "rounds": args.rounds,
        "bytes": args.bytes,
        "gap_ms": args.gap_ms,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.out_name}.json").write_text(
        json.dumps({"meta": meta, "rows": rows, "rounds": per}, indent=1)
    )
    lines = [
        "# Round trip of one small message between two processes, by transport (`bench/link_latency.py`)",
        "",
        f"- Command: `{meta['command']}`; commit {meta['commit']}; {meta['date']}",
        f"- Machine: {meta['machine']}; 1-min load at the end {meta['load_1min_at_end']}; "
        f"pyzmq {meta['pyzmq']}, libzmq {meta['libzmq']}",
        f"- {args.messages} round trips of {args.bytes} B per transport and round, {args.gap_ms} ms apart "
        f"(the threads sleep between messages, as for a lone request); medians over {args.rounds} rounds",
        "",
        "| transport | p50 µs | p90 µs | p99 µs | p50 / unix_asyncio |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        cells = (r["transport"], r["p50_us"], r["p90_us"], r["p99_us"], f"{r['p50_vs_unix_asyncio']}x")
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    lines += [
        "",
        "A lone request crosses two such round trips (gateway <-> scheduler, scheduler <-> executor).",
    ]
    (RESULTS / f"{args.out_name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
