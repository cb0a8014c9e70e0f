"""Closed-loop HTTP load for the GPU benches (minilm_gpu.py, int4_gpu.py): lean keep-alive clients.

Each concurrent client is one thread with its own keep-alive HTTP/1.1 connection (``Wire``: one
TCP socket, Nagle off), posting prepared requests in turn and reading every answer whole; clients are
spread over ``procs`` processes so the generator's GIL is not what is measured. Why not httpx: on the
build machine one httpx.AsyncClient request costs ~900 µs of client CPU against ~150 µs for
http.client (same local server, same 32-sentence body), and the old generator's four httpx processes,
parsing ~135 KB of float JSON per answer, were a ceiling of every server they measured. Why not
http.client either (twenty-eighth session): per request it builds and validates the request line and
headers and parses the answer's headers with ``email.parser``, ~160-185 µs more than ``Wire`` per lone
request on the build machine against the same canned server (``bench/client_overhead.py``), time a
c1 latency counts as the server's. ``Wire`` sends each request as one prepared byte string and reads
the status line, the headers it needs and a Content-Length or chunked body: the request head and the
answer's head are built and parsed as `anvil bench`'s asyncio client does
(``anvil_client.bench.http1.request_head`` / ``parse_head``); a blocking socket per client thread,
where that client is a coroutine on a loop.

Every answer is checked by a named ``check`` (a function of this module, so spawned processes can
find it): a 200 whose body does not hold what was asked counts as an error ("bad answer"), so a
server cannot win by answering less. The gateway's ``x-anvil-hops-us`` header (in/queue/compute/
transit, µs), where present, is kept per answer; the report gives the hops' medians.
"""

from __future__ import annotations

import base64
import concurrent.futures
import json
import multiprocessing as mp
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from anvil_client.bench.engine import ALL_HOPS, HOPS, parse_hops
from anvil_client.bench.http1 import parse_head, request_head

HOPS_HEADER = "x-anvil-hops-us"


@dataclass(frozen=True)
class Load:
    """One closed-loop phase: ``bodies`` posted in turn to ``url`` + ``path`` by ``concurrency``
    clients for ``seconds``; every answer checked by ``check`` (a name in ``CHECKS``) against
    ``expect`` (what that check needs: vectors per answer, a dimension)."""

    url: str
    path: str
    bodies: tuple[bytes, ...]
    headers: tuple[tuple[str, str], ...]
    concurrency: int
    seconds: float
    check: str
    expect: int = 0
    procs: int = 4


@dataclass
class Part:
    """What one process measured: latencies (ms), hop splits, failures by status, wall (s)."""

    lat_ms: list[float] = field(default_factory=list)
    hops: list[tuple[float, ...]] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    wall_s: float = 0.0


def check_embeddings(body: bytes, expect: int) -> bool:
    """An OpenAI embeddings answer with ``expect`` vectors, each decoded as the OpenAI client does
    (base64 -> float32 array, or the float list), all of one non-zero length."""
    data = json.loads(body).get("data") or []
    if len(data) != expect:
        return False
    dims = set()
    for item in data:
        emb = item.get("embedding")
        vec = np.frombuffer(base64.b64decode(emb), "<f4") if isinstance(emb, str) else np.asarray(emb, "f4")
        dims.add(vec.shape[0])
    return len(dims) == 1 and dims.pop() > 0


def check_kserve_binary(body: bytes, expect: int, header_len: int) -> bool:
    """A KServe v2 answer whose first output is binary: ``expect`` float32 values after the JSON header."""
    if not header_len:
        return False
    head = json.loads(body[:header_len])
    size = int(head["outputs"][0]["parameters"]["binary_data_size"])
    return size == expect * 4 and len(body) - header_len >= size


def _ok(load: Load, headers: dict[str, str], body: bytes) -> bool:
    try:
        if load.check == "embeddings":
            return check_embeddings(body, load.expect)
        if load.check == "kserve_binary":
            header_len = int(headers.get("inference-header-content-length") or 0)
            return check_kserve_binary(body, load.expect, header_len)
    except (ValueError, KeyError, IndexError, TypeError):
        return False
    raise ValueError(f"unknown check {load.check!r}")


class BadResponse(Exception):
    """An answer that is not HTTP/1.x as sent by a server (counted by this name, then reconnect)."""


_MAX_HEAD = 64 * 1024  # a status line and headers larger than this are not an answer
# bytes a recv asks for: a larger request allocates (and faults in) a larger buffer each call, 1 MiB
# costing ~12 µs more a call than 64 KiB on the build machine for a 2 KB answer
_RECV = 64 * 1024


class Wire:
    """One keep-alive HTTP/1.1 connection (TCP, Nagle off) that posts prepared requests.

    ``request(data)`` sends ``data`` (a whole request: ``prepare`` builds one) in one write and
    returns (status, headers with lower-case names, body). The body is read by Content-Length or
    chunked transfer coding; an answer with neither ends with the connection (as HTTP/1.1 says), and
    a ``Connection: close`` answer closes it after its body: the next request reconnects. A peer that
    closes mid-answer raises ``ConnectionError``; one that sends no HTTP raises ``BadResponse``."""

    def __init__(self, host: str, port: int, timeout_s: float = 60.0) -> None:
        self.host, self.port, self.timeout_s = host, port, timeout_s
        self.sock: socket.socket | None = None
        self.buf = bytearray()

    def prepare(self, path: str, body: bytes, headers: tuple[tuple[str, str], ...]) -> bytes:
        extra = (("Accept-Encoding", "identity"), *headers)
        return request_head(self.host, self.port, path, extra, len(body)) + body

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
        self.sock = None
        self.buf.clear()

    def request(self, data: bytes) -> tuple[int, dict[str, str], bytes]:
        if self.sock is None:
            self.sock = socket.create_connection((self.host, self.port), timeout=self.timeout_s)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.sendall(data)
        status, headers = self._head()
        if headers.get("transfer-encoding", "").lower() == "chunked":
            body = self._chunked()
        elif "content-length" in headers:
            body = self._exactly(int(headers["content-length"]))
        elif status in (204, 304) or status < 200:
            body = b""
        else:  # delimited by the end of the connection
            body = self._until_closed()
        if headers.get("connection", "").lower() == "close":
            self.close()
        return status, headers, body

    def _fill(self) -> None:
        assert self.sock is not None
        chunk = self.sock.recv(_RECV)
        if not chunk:
            raise ConnectionError("the server closed the connection mid-answer")
        self.buf += chunk

    def _until(self, delimiter: bytes) -> bytes:
        """The bytes before the next `delimiter` (consumed with it), at most _MAX_HEAD of them."""
        while (end := self.buf.find(delimiter)) < 0:
            if len(self.buf) > _MAX_HEAD:
                raise BadResponse(f"no {delimiter!r} within {_MAX_HEAD} bytes")
            self._fill()
        out = bytes(self.buf[:end])
        del self.buf[: end + len(delimiter)]
        return out

    def _line(self) -> bytes:
        return self._until(b"\r\n")

    def _head(self) -> tuple[int, dict[str, str]]:
        try:
            return parse_head(self._until(b"\r\n\r\n"))
        except ValueError as exc:
            raise BadResponse(str(exc)) from None

    def _exactly(self, n: int) -> bytes:
        if n < 0:
            raise BadResponse("a negative Content-Length")
        while len(self.buf) < n:
            self._fill()
        body = bytes(self.buf[:n])
        del self.buf[:n]
        return body

    def _chunked(self) -> bytes:
        out = bytearray()
        while True:
            size_text = self._line().split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise BadResponse(f"a bad chunk size: {size_text[:20]!r}") from None
            if size == 0:
                while self._line():  # trailers, up to the empty line
                    pass
                return bytes(out)
            out += self._exactly(size)
            if self._line():
                raise BadResponse("a chunk not followed by CRLF")

    def _until_closed(self) -> bytes:
        assert self.sock is not None
        while chunk := self.sock.recv(_RECV):
            self.buf += chunk
        body = bytes(self.buf)
        self.close()
        return body


def _hops(value: str | None) -> tuple[float, ...] | None:
    """The header's hops (µs) in ALL_HOPS order, read as `anvil bench` reads them (transit's parts
    nan where the answer carried none); None unless the four of HOPS are there."""
    if not value:
        return None
    out = np.full(len(ALL_HOPS), np.nan)
    parse_hops(value, out)
    return tuple(float(v) for v in out) if np.isfinite(out[: len(HOPS)]).all() else None


def _client(load: Load, first: int, stride: int, stop: float, part: Part, lock: threading.Lock) -> None:
    split = urlsplit(load.url)
    conn = Wire(split.hostname or "127.0.0.1", split.port or 80)
    requests = [conn.prepare(load.path, body, load.headers) for body in load.bodies]
    i = first
    lat: list[float] = []
    hops: list[tuple[float, ...]] = []
    errors: dict[str, int] = {}
    try:
        while time.perf_counter() < stop:
            data = requests[i % len(requests)]
            i += stride
            t0 = time.perf_counter()
            try:
                status, headers, body = conn.request(data)
            except (OSError, BadResponse) as exc:
                errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
                conn.close()  # the next request reconnects
                continue
            took = (time.perf_counter() - t0) * 1e3
            if status != 200:
                errors[str(status)] = errors.get(str(status), 0) + 1
            elif not _ok(load, headers, body):
                errors["bad answer"] = errors.get("bad answer", 0) + 1
            else:
                lat.append(took)
                if (h := _hops(headers.get(HOPS_HEADER))) is not None:
                    hops.append(h)
    finally:
        conn.close()
        with lock:
            part.lat_ms += lat
            part.hops += hops
            for k, n in errors.items():
                part.errors[k] = part.errors.get(k, 0) + n


def run_part(load: Load, clients: list[int]) -> Part:
    """Clients ``clients`` (indices among ``load.concurrency``), one thread each, in this process."""
    part, lock = Part(), threading.Lock()
    t0 = time.perf_counter()
    stop = t0 + load.seconds
    threads = [
        threading.Thread(target=_client, args=(load, k, load.concurrency, stop, part, lock), daemon=True)
        for k in clients
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    part.wall_s = time.perf_counter() - t0
    return part


def _part_main(args: tuple[Load, list[int]]) -> Part:
    return run_part(*args)


def run(load: Load) -> Part:
    """The whole phase: ``min(procs, concurrency)`` processes (one: this process), merged."""
    procs = max(1, min(load.procs, load.concurrency))
    groups = [list(range(p, load.concurrency, procs)) for p in range(procs)]
    if procs == 1:
        return run_part(load, groups[0])
    with concurrent.futures.ProcessPoolExecutor(procs, mp_context=mp.get_context("spawn")) as pool:
        parts = list(pool.map(_part_main, [(load, g) for g in groups]))
    merged = Part(wall_s=max(p.wall_s for p in parts))
    for p in parts:
        merged.lat_ms += p.lat_ms
        merged.hops += p.hops
        for k, n in p.errors.items():
            merged.errors[k] = merged.errors.get(k, 0) + n
    return merged


def summary(part: Part, per_request: int = 1) -> dict[str, Any]:
    """Throughput (items = answers x ``per_request``), p50/p99 (ms), failures, hop medians (µs)."""
    lat = np.asarray(part.lat_ms) if part.lat_ms else np.asarray([np.nan])
    out: dict[str, Any] = {
        "answers": len(part.lat_ms),
        "items_per_s": round(len(part.lat_ms) * per_request / max(part.wall_s, 1e-9), 1),
        "p50_ms": round(float(np.percentile(lat, 50)), 3),
        "p99_ms": round(float(np.percentile(lat, 99)), 3),
        "errors": sum(part.errors.values()),
        "error_kinds": dict(sorted(part.errors.items())),
    }
    if part.hops:
        hops = np.asarray(part.hops)
        med = np.median(hops[:, : len(HOPS)], axis=0)
        out["hops_p50_us"] = dict(
            zip(("in", "queue", "compute", "transit"), (int(v) for v in med), strict=True)
        )
        split = hops[:, len(HOPS) :]
        split = split[np.isfinite(split).all(axis=1)]
        if len(split):  # transit's parts (to_scheduler, to_executor, executor_queue, back)
            med = np.median(split, axis=0)
            out["hops_p50_us"] |= dict(zip(ALL_HOPS[len(HOPS) :], (int(v) for v in med), strict=True))
    return out
