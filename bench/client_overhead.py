"""What the GPU benches' HTTP client adds to a lone request's latency: stdlib ``http.client`` (the
load generator until the twenty-eighth session) against ``http_load.Wire`` (since), same requests.

A canned server in another process (asyncio, TCP on loopback: it reads one whole request
and writes the same prepared MiniLM-sized ``/v1/embeddings`` answer, base64, with the gateway's hop
header) answers both clients; one client at a time posts the same one-sentence body closed-loop,
``--gap-ms`` apart (so every thread sleeps between requests, as at c1), and the round trip is timed
exactly as ``http_load`` times it (send to body read, headers parsed, before the answer's check).
Rounds alternate the clients; medians over rounds. With ``--url`` the clients post to that server
instead (a running stack's gateway), the same way: the embeddings body of ``--model``, or with
``--kserve MODEL`` a KServe v2 JSON infer of one 16-float row to ``/v2/models/MODEL/infer`` (the
built-in ``identity`` answers in microseconds on the CPU stack, where MiniLM's milliseconds of CPU
compute would bury the client's share).

    python bench/client_overhead.py [--requests 3000] [--rounds 3] [--url http://127.0.0.1:8000
        [--kserve identity]]

Writes bench/results/client_overhead.{json,md} (``--out-dir``, ``--out-name``). On the GPU host,
``CLIENT_AB=1 bash bench/h200_gpu.sh`` runs it against the stack's MiniLM after the MiniLM bench.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import http.client
import json
import multiprocessing as mp
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from http_load import HOPS_HEADER, Wire  # noqa: E402
from run_meta import run_meta  # noqa: E402

RESULTS = ROOT / "bench" / "results"
CLIENTS = ("http_client", "wire")
_ANSWER_VEC = base64.b64encode(np.linspace(-1, 1, 384, dtype="<f4").tobytes()).decode()
_ANSWER = json.dumps(
    {
        "object": "list",
        "data": [{"object": "embedding", "index": 0, "embedding": _ANSWER_VEC}],
        "model": "minilm-gpu",
        "usage": {"prompt_tokens": 12, "total_tokens": 12},
    }
).encode()


def _canned_answer() -> bytes:
    head = (
        "HTTP/1.1 200 OK\r\ndate: Mon, 07 Dec 2026 05:00:00 GMT\r\nserver: uvicorn\r\n"
        f"content-type: application/json\r\ncontent-length: {len(_ANSWER)}\r\n"
        f"{HOPS_HEADER}: in=100,queue=0,compute=500,transit=300\r\n\r\n"
    )
    return head.encode() + _ANSWER


class _Canned(asyncio.Protocol):
    """Answers each whole request (headers + Content-Length body) with the canned answer."""

    answer = _canned_answer()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.buf = bytearray()

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while (end := self.buf.find(b"\r\n\r\n")) >= 0:
            length = 0
            for line in bytes(self.buf[:end]).split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if len(self.buf) < end + 4 + length:
                return
            del self.buf[: end + 4 + length]
            self.transport.write(self.answer)


def _serve(port_out: Any) -> None:
    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(_Canned, "127.0.0.1", 0)
        port_out.put(server.sockets[0].getsockname()[1])
        await server.serve_forever()

    asyncio.run(main())


def _timed(one: Any, n: int, gap_s: float) -> list[float]:
    """`n` round trips of `one()` (status, hop header, body), `gap_s` apart; raises on a bad answer."""
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        status, _hops, data = one()
        out.append(time.perf_counter() - t0)
        if status != 200 or not data:
            raise RuntimeError(f"status {status}")
        time.sleep(gap_s)
    return out


def _time_http_client(host: str, port: int, path: str, body: bytes, n: int, gap_s: float) -> list[float]:
    conn = http.client.HTTPConnection(host, port, timeout=60)
    conn.connect()
    conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    headers = {"Content-Type": "application/json"}

    def one() -> tuple[int, str | None, bytes]:
        conn.request("POST", path, body, headers)
        resp = conn.getresponse()
        data = resp.read()
        return resp.status, resp.getheader(HOPS_HEADER), data

    try:
        return _timed(one, n, gap_s)
    finally:
        conn.close()


def _time_wire(host: str, port: int, path: str, body: bytes, n: int, gap_s: float) -> list[float]:
    wire = Wire(host, port)
    data = wire.prepare(path, body, (("Content-Type", "application/json"),))

    def one() -> tuple[int, str | None, bytes]:
        status, headers, answer = wire.request(data)
        return status, headers.get(HOPS_HEADER), answer

    try:
        return _timed(one, n, gap_s)
    finally:
        wire.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=3000, help="requests per client and round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--gap-ms", type=float, default=0.5, help="sleep between requests, ms")
    ap.add_argument("--url", default="", help="a running server instead of the canned one")
    ap.add_argument("--path", default="/v1/embeddings")
    ap.add_argument("--model", default="minilm-gpu", help="the embeddings body's model (with --url)")
    ap.add_argument("--kserve", default="", metavar="MODEL", help="a KServe JSON infer of this model instead")
    ap.add_argument("--out-name", default="client_overhead")
    ap.add_argument("--out-dir", default=str(RESULTS))
    args = ap.parse_args()
    body = json.dumps(
        {"model": args.model, "input": ["A lone sentence of about a dozen tokens, as at c1."],
         "encoding_format": "base64"}
    ).encode()  # fmt: skip
    if args.kserve:
        row = {"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": [0.5] * 16}
        body = json.dumps({"inputs": [row]}).encode()
        args.path = f"/v2/models/{args.kserve}/infer"
    server = None
    if args.url:
        split = urlsplit(args.url)
        host, port = split.hostname or "127.0.0.1", split.port or 80
    else:
        ports: Any = mp.get_context("spawn").Queue()
        server = mp.get_context("spawn").Process(target=_serve, args=(ports,), daemon=True)
        server.start()
        host, port = "127.0.0.1", ports.get(timeout=30)
    timers = {"http_client": _time_http_client, "wire": _time_wire}
    per: dict[str, list[dict[str, float]]] = {c: [] for c in CLIENTS}
    try:
        for rnd in range(args.rounds):
            order = CLIENTS if rnd % 2 == 0 else CLIENTS[::-1]
            for name in order:
                took = np.asarray(timers[name](host, port, args.path, body, args.requests, args.gap_ms / 1e3))
                row = {q: float(np.percentile(took, p)) * 1e6 for q, p in (("p50_us", 50), ("p99_us", 99))}
                per[name].append(row)
                print(f"round {rnd + 1} {name:12s} p50 {row['p50_us']:7.1f} µs  p99 {row['p99_us']:7.1f} µs")
    finally:
        if server is not None:
            server.terminate()
    rows = []
    for name in CLIENTS:
        med = {k: round(statistics.median(r[k] for r in per[name]), 1) for k in ("p50_us", "p99_us")}
        rows.append({"client": name, **med})
    by = {r["client"]: r for r in rows}
    saved = round(by["http_client"]["p50_us"] - by["wire"]["p50_us"], 1)
    ratio = round(by["http_client"]["p50_us"] / by["wire"]["p50_us"], 2)
    meta = {
        **run_meta("bench/client_overhead.py"),
        "server": args.url or "canned asyncio server, another process",
        "requests": args.requests,
        "rounds": args.rounds,
        "gap_ms": args.gap_ms,
        "answer_bytes": len(_ANSWER) if not args.url else None,
    }
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    out = {"meta": meta, "rows": rows, "p50_saved_us": saved, "p50_ratio": ratio, "rounds": per}
    (out_dir / f"{args.out_name}.json").write_text(json.dumps(out, indent=1))
    lines = [
        "# A lone request's round trip by HTTP client (`bench/client_overhead.py`)",
        "",
        f"- Command: `{meta['command']}`; commit {meta['commit']}; {meta['date']}",
        f"- Machine: {meta['machine']}; 1-min load at the end {meta['load_1min_at_end']}",
        f"- Server: {meta['server']}; "
        + (
            f"KServe JSON, one row of 16 floats to `{args.path}`; "
            if args.kserve
            else "one-sentence `/v1/embeddings` body, base64 answer; "
        )
        + f"{args.requests} requests per client and round, {args.gap_ms} ms apart; medians over "
        f"{args.rounds} rounds, the clients alternated",
        "",
        "| client | p50 µs | p99 µs |",
        "|---|---:|---:|",
        *(f"| {r['client']} | {r['p50_us']} | {r['p99_us']} |" for r in rows),
        "",
        f"http.client / Wire at p50: {ratio}x ({saved} µs a request that a c1 latency counted as the "
        "server's).",
    ]
    (out_dir / f"{args.out_name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
