"""bench/http_load.py against a real local HTTP server: every answer is checked (a 200 that holds
fewer vectors than sentences sent, or a short binary output, is an error, not throughput), failures
are counted by kind, the gateway's hop header is kept, and clients spread over processes add up."""

from __future__ import annotations

import base64
import json
import socket
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import http_load


class _Handler(BaseHTTPRequestHandler):
    """/v1/embeddings answers one vector per input, except: "short" -> one vector fewer, "fail" -> 503;
    /kserve answers a binary output of `rows` float32 values, `rows` from the request's header."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.path in ("/chunked", "/close"):  # an embeddings answer chunked, or closing the connection
            return self._other(self.path, json.loads(body))
        if self.path == "/v1/embeddings":
            doc = json.loads(body)
            items = doc["input"] if isinstance(doc["input"], list) else [doc["input"]]
            if items[0] == "fail":
                return self._send(503, b'{"error": "busy"}', {})
            n = len(items) - (1 if items[0] == "short" else 0)
            vec = np.arange(4, dtype="<f4")
            emb: Any = (
                base64.b64encode(vec.tobytes()).decode()
                if doc["encoding_format"] == "base64"
                else vec.tolist()
            )
            data = [{"object": "embedding", "index": i, "embedding": emb} for i in range(n)]
            out = json.dumps({"object": "list", "data": data}).encode()
            return self._send(200, out, {"x-anvil-hops-us": "in=1,queue=2,compute=3,transit=4"})
        rows = int(self.headers["X-Rows"])
        head = json.dumps(
            {"outputs": [{"name": "y", "parameters": {"binary_data_size": rows * 16}}]}
        ).encode()
        payload = head + np.zeros(rows * 4, np.float32).tobytes()
        return self._send(200, payload, {"Inference-Header-Content-Length": str(len(head))})

    def _send(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def _other(self, path: str, doc: dict[str, Any]) -> None:
        n = len(doc["input"])
        data = [{"object": "embedding", "index": i, "embedding": [1.0, 2.0]} for i in range(n)]
        out = json.dumps({"object": "list", "data": data}).encode()
        self.send_response(200)
        if path == "/close":
            self.send_header("Content-Length", str(len(out)))
            self.send_header("Connection", "close")
            self.close_connection = True
            self.end_headers()
            self.wfile.write(out)
            return
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for piece in (out[:7], out[7:]):  # two chunks, then the last (with an extension) and a trailer
            self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
        self.wfile.write(b"0;ext=1\r\nX-Trailer: t\r\n\r\n")

    def log_message(self, *args: Any) -> None:
        return None


@pytest.fixture
def url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _embed(
    url: str, inputs: list[list[str]], conc: int, procs: int = 1, fmt: str = "base64"
) -> http_load.Load:
    bodies = tuple(json.dumps({"model": "m", "input": i, "encoding_format": fmt}).encode() for i in inputs)
    return http_load.Load(
        url=url,
        path="/v1/embeddings",
        bodies=bodies,
        headers=(("Content-Type", "application/json"),),
        concurrency=conc,
        seconds=0.4,
        check="embeddings",
        expect=2,
        procs=procs,
    )


@pytest.mark.parametrize("fmt", ["base64", "float"])
def test_answers_are_counted_only_when_they_hold_every_vector(url: str, fmt: str) -> None:
    got = http_load.summary(
        http_load.run(_embed(url, [["a", "b"], ["short", "b"], ["fail", "b"]], 1, fmt=fmt)), 2
    )
    assert got["answers"] > 0 and got["items_per_s"] > 0
    kinds = got["error_kinds"]
    assert set(kinds) == {"bad answer", "503"}  # one of three bodies is short, one refused
    # one client posts the three bodies in turn: a third of its requests each way (+-1 at the stop)
    assert abs(kinds["bad answer"] - got["answers"]) <= 1
    assert abs(kinds["503"] - got["answers"]) <= 1
    assert got["errors"] == kinds["bad answer"] + kinds["503"]
    assert got["hops_p50_us"] == {"in": 1, "queue": 2, "compute": 3, "transit": 4}


def test_clients_in_several_processes_add_up(url: str) -> None:
    part = http_load.run(_embed(url, [["a", "b"]], 4, procs=2))
    assert part.errors == {} and len(part.lat_ms) == len(part.hops) > 0
    assert part.wall_s >= 0.4


def test_a_kserve_binary_output_is_checked_for_its_size(url: str) -> None:
    def job(rows: int, expect: int) -> http_load.Load:
        return http_load.Load(
            url=url,
            path="/kserve",
            bodies=(b"{}",),
            headers=(("X-Rows", str(rows)),),
            concurrency=1,
            seconds=0.2,
            check="kserve_binary",
            expect=expect,
        )

    whole = http_load.summary(http_load.run(job(2, 8)))
    assert whole["answers"] > 0 and whole["errors"] == 0
    short = http_load.summary(http_load.run(job(1, 8)))
    assert short["answers"] == 0 and set(short["error_kinds"]) == {"bad answer"}


@pytest.mark.parametrize("path", ["/chunked", "/close"])
def test_chunked_answers_and_closed_connections_are_read_whole(url: str, path: str) -> None:
    """A chunked body is joined (extensions and trailers skipped); a ``Connection: close`` answer
    counts and the next request reconnects."""
    load = http_load.Load(
        url=url, path=path, bodies=(json.dumps({"input": ["a", "b"]}).encode(),), headers=(),
        concurrency=1, seconds=0.3, check="embeddings", expect=2,
    )  # fmt: skip
    got = http_load.summary(http_load.run(load), 2)
    assert got["answers"] > 1 and got["errors"] == 0


def _raw_server(answer: bytes) -> tuple[socket.socket, threading.Thread]:
    """A TCP server that reads each request's first bytes and writes ``answer`` (then closes, if it
    does not look like a whole HTTP answer: a cut or garbage)."""
    srv = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn:
                if conn.recv(65536):
                    conn.sendall(answer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return srv, thread


@pytest.mark.parametrize(
    ("answer", "kinds"),
    [  # a cut: the end of the stream, or a reset where the kernel had more to say
        (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{", {"ConnectionError", "ConnectionResetError"}),
        (b"SSH-2.0-OpenSSH\r\n\r\n", {"BadResponse"}),  # no HTTP status line
        (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", {"BadResponse"}),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", {"BadResponse"}),
    ],
)
def test_a_broken_answer_is_an_error_of_its_kind_and_the_client_reconnects(
    answer: bytes, kinds: set[str]
) -> None:
    srv, _ = _raw_server(answer)
    try:
        load = http_load.Load(
            url=f"http://127.0.0.1:{srv.getsockname()[1]}", path="/v1/embeddings", bodies=(b"{}",),
            headers=(), concurrency=1, seconds=0.3, check="embeddings", expect=1,
        )  # fmt: skip
        got = http_load.summary(http_load.run(load))
    finally:
        srv.close()
    assert got["answers"] == 0 and set(got["error_kinds"]) <= kinds
    assert got["errors"] > 1  # it reconnected and failed again


def test_the_request_is_one_prepared_http11_post() -> None:
    wire = http_load.Wire("example.test", 8080)
    data = wire.prepare("/v1/embeddings", b'{"a": 1}', (("Content-Type", "application/json"),))
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0] == "POST /v1/embeddings HTTP/1.1" and body == b'{"a": 1}'
    assert {"Host: example.test:8080", "Content-Type: application/json", "Content-Length: 8"} <= set(lines)
