"""anvil bench: schedules, request bodies, the open-loop engine (no coordinated omission), reports."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest

from anvil_client.bench.arrivals import schedule
from anvil_client.bench.engine import Engine, parse_hops
from anvil_client.bench.report import summarize, write_reports
from anvil_client.bench.scrape import parse_batch_metrics
from anvil_client.bench.workload import Workload, parse_mix, response_id


@pytest.mark.parametrize("pattern", ["poisson", "constant", "step", "onoff"])
def test_schedules_are_sorted_and_near_the_rate(pattern: str) -> None:
    s = schedule(pattern, 1000.0, 6.0, seed=3)
    assert (np.diff(s.offsets_s) >= 0).all() and s.offsets_s[-1] < 6.0
    expected = {"poisson": 6000, "constant": 6000, "step": 12000, "onoff": 3000}[pattern]
    assert abs(len(s) - expected) < 0.1 * expected


def test_trace_schedule_reads_offsets(tmp_path: Path) -> None:
    trace = tmp_path / "t.txt"
    trace.write_text("0.5\n0.1  # first\n\n2.0\n9\n")
    s = schedule("trace", 0, 5.0, trace=trace)
    assert s.offsets_s.tolist() == [0.1, 0.5, 2.0]


def test_a_trace_is_rescaled_to_a_mean_rate_keeping_its_shape(tmp_path: Path) -> None:
    trace = tmp_path / "t.txt"
    trace.write_text("\n".join(str(x) for x in (0.0, 0.1, 0.2, 1.0, 3.0)))  # 4 gaps in 3 s
    s = schedule("trace", 0, 0.0, trace=trace, trace_rate_rps=40.0)
    assert s.offsets_s.size == 5 and (s.offsets_s.size - 1) / s.offsets_s[-1] == pytest.approx(40.0)
    gaps = np.diff(s.offsets_s)
    assert gaps.tolist() == pytest.approx((np.diff([0.0, 0.1, 0.2, 1.0, 3.0]) * gaps[0] / 0.1).tolist())


def test_a_trace_carries_priorities_through_sorting_rescaling_and_the_cut(tmp_path: Path) -> None:
    trace = tmp_path / "t.txt"
    trace.write_text("0.3 3\n0.0 1  # the first\n0.1 2\n\n0.6 1\n")
    s = schedule("trace", 0, 0.0, trace=trace, trace_rate_rps=10.0)  # 3 gaps in 0.6 s -> in 0.3 s
    assert s.offsets_s.tolist() == pytest.approx([0.0, 0.05, 0.15, 0.3])
    assert s.priorities is not None and s.priorities.tolist() == [1, 2, 3, 1]
    s = schedule("trace", 0, 0.2, trace=trace)
    assert s.offsets_s.tolist() == [0.0, 0.1] and s.priorities is not None and s.priorities.tolist() == [1, 2]
    assert schedule("trace", 0, 0.0, trace=_write(tmp_path, "0.1\n0.2\n")).priorities is None
    for text, why in (
        ("0.1 1\n0.2\n", "1 of 2 lines give a priority"),
        ("0.1 4\n", "priority must be 1, 2 or 3"),
        ("0.1 1 x\n", "expected 'offset_s \\[priority\\]'"),
        ("0.1 high\n", "expected 'offset_s"),
    ):
        with pytest.raises(ValueError, match=why):
            schedule("trace", 0, 0.0, trace=_write(tmp_path, text))


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "w.txt"
    path.write_text(text)
    return path


def test_an_open_loop_run_sends_the_priorities_a_trace_carries(tmp_path: Path) -> None:
    trace = _write(tmp_path, "\n".join(f"{i * 0.01:.2f} {p}" for i, p in enumerate([3, 1, 2, 1, 3, 3])))

    async def main() -> object:
        server, port, _ = await _server(stall_s=0.0)
        wl = Workload(priorities={2: 1.0})  # the mix the trace's priorities replace
        r = await Engine(f"http://127.0.0.1:{port}", wl, max_connections=1).run_open(
            schedule("trace", 0, 0.0, trace=trace)
        )
        server.close()
        return r

    r = asyncio.run(main())
    assert r.priority.tolist() == [3, 1, 2, 1, 3, 3] and (r.status == 200).all()  # type: ignore[attr-defined]
    assert sent_priorities == [3, 1, 2, 1, 3, 3]  # one connection: sent in order


def test_a_trace_file_implies_the_trace_pattern_and_refuses_another(tmp_path: Path) -> None:
    import argparse

    from anvil_client.bench.cli import resolve_arrivals

    trace = tmp_path / "t.txt"
    args = argparse.Namespace(trace=trace, pattern=None, rate=None)
    resolve_arrivals(args)
    assert (args.pattern, args.trace_rate) == ("trace", None)  # as recorded (it ran Poisson before)
    args = argparse.Namespace(trace=trace, pattern=None, rate=300.0)
    resolve_arrivals(args)
    assert (args.pattern, args.trace_rate) == ("trace", 300.0)
    with pytest.raises(ValueError, match="cannot be combined with --pattern poisson"):
        resolve_arrivals(argparse.Namespace(trace=trace, pattern="poisson", rate=None))
    with pytest.raises(ValueError, match="needs --trace"):
        resolve_arrivals(argparse.Namespace(trace=None, pattern="trace", rate=None))
    args = argparse.Namespace(trace=None, pattern=None, rate=None)
    resolve_arrivals(args)
    assert (args.pattern, args.rate) == ("poisson", 200.0)


def test_priority_mix_and_bodies() -> None:
    assert parse_mix("1:1,3:3") == {1: 0.25, 3: 0.75}
    with pytest.raises(ValueError):
        parse_mix("4")
    wl = Workload(model="mlp", rows=2, priorities={1: 1.0}, tenant_keys=["k1"], timeout_us=5000)
    before, after, headers = wl.parts(1, 0)
    doc = json.loads(before + b"0000000042" + after)
    assert doc["id"] == "0000000042" and doc["parameters"] == {"priority": 1, "timeout": 5000}
    assert doc["inputs"][0]["shape"] == [2, 16] and len(doc["inputs"][0]["data"]) == 32
    assert headers["Authorization"] == "Bearer k1"
    wb = Workload(binary=True)
    before, after, headers = wb.parts(2, 0)
    n = int(headers["Inference-Header-Content-Length"])
    body = before + b"0000000007" + after
    assert json.loads(body[:n])["inputs"][0]["parameters"]["binary_data_size"] == 64 and len(body) == n + 64
    assert response_id(b'{"id":"0000000007","outputs":[]}', None) == b"0000000007"


sent_priorities: list[int | None] = []  # parameters.priority of each request the echo server got


async def _server(stall_s: float, hops: bytes = b"") -> tuple[asyncio.AbstractServer, int, list[float]]:
    """A KServe-ish echo server that stalls every request for its first `stall_s` seconds (and sends
    `hops` as the gateway's x-anvil-hops-us header when given)."""
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    seen: list[float] = []
    sent_priorities.clear()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            body = await reader.readexactly(length)
            seen.append(loop.time() - t0)
            if loop.time() - t0 < stall_s:
                await asyncio.sleep(stall_s - (loop.time() - t0))
            doc = json.loads(body)
            rid = doc["id"]
            sent_priorities.append(doc.get("parameters", {}).get("priority"))
            out = json.dumps({"id": rid, "outputs": []}).encode()
            extra = b"x-anvil-hops-us: %s\r\n" % hops if hops else b""
            writer.write(b"HTTP/1.1 200 OK\r\n%sContent-Length: %d\r\n\r\n%s" % (extra, len(out), out))

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], seen


def test_open_loop_charges_a_stall_to_every_request_it_delayed(tmp_path: Path) -> None:
    async def main() -> tuple[object, ...]:
        server, port, _ = await _server(stall_s=0.3)
        eng = Engine(
            f"http://127.0.0.1:{port}", Workload(), max_connections=1
        )  # one connection: requests queue
        r = await eng.run_open(schedule("constant", 200.0, 1.0))
        server.close()
        return (r,)

    (r,) = asyncio.run(main())
    assert (r.status == 200).all() and (r.answers == 1).all() and r.id_mismatches == 0  # type: ignore[attr-defined]
    lat = r.latency_s  # type: ignore[attr-defined]
    early = r.intended_s < 0.1  # type: ignore[attr-defined]
    # sent during the stall (the server starts ~0.05 s before the run): each waited out the rest of it
    assert (lat[early] >= 0.3 - 0.08 - r.intended_s[early]).all()  # type: ignore[attr-defined]
    s = summarize(r, slo_ms={2: 100.0})  # type: ignore[arg-type]
    assert s["sent"] == 200 and s["unanswered"] == 0 and 0 < s["priorities"]["2"]["slo_attainment"] < 1
    paths = write_reports(tmp_path, "t", s, r, None)  # type: ignore[arg-type]
    assert (tmp_path / "t.md").read_text().count("|") > 20 and all(p.exists() for p in paths)


def test_closed_loop_keeps_n_in_flight() -> None:
    async def main() -> object:
        server, port, _ = await _server(stall_s=0.0)
        r = await Engine(f"http://127.0.0.1:{port}", Workload()).run_closed(4, 0.5)
        server.close()
        return r

    r = asyncio.run(main())
    assert r.status.size > 20 and (r.status == 200).all() and r.meta["concurrency"] == 4  # type: ignore[attr-defined]


def test_the_gateway_hop_header_is_broken_down_per_priority(tmp_path: Path) -> None:
    async def main() -> object:
        hops = b"in=300,queue=1500,compute=2000,transit=700," + (
            b"to_scheduler=200,to_executor=100,executor_queue=50,back=350,x=9"
        )
        server, port, _ = await _server(stall_s=0.0, hops=hops)
        r = await Engine(f"http://127.0.0.1:{port}", Workload(priorities={1: 0.5, 3: 0.5})).run_closed(2, 0.3)
        server.close()
        return r

    r = asyncio.run(main())
    s = summarize(r)  # type: ignore[arg-type]
    for p in ("1", "3"):
        hops = s["priorities"][p]["hops_ms"]
        assert hops["requests"] == s["priorities"][p]["ok"] > 0
        assert (hops["gateway_in"]["p50"], hops["scheduler_queue"]["p99"], hops["transit"]["mean"]) == (
            0.3,
            1.5,
            0.7,
        )
        # the echo server answers at once: the 4.5 ms the header claims exceed the latency measured
        # (transit's parts are not added again: outside = latency - the four hops)
        assert hops["outside"]["p50"] < 0 and hops["outside"]["p50"] > -4.5
        assert [hops[k]["p50"] for k in ("to_scheduler", "to_executor", "executor_queue", "back")] == [
            0.2, 0.1, 0.05, 0.35,
        ]  # fmt: skip
    assert parse_hops_row("queue=12,compute=oops") == [None, 12.0, None, None]
    # a four-hop row (bench/http_load.py's minimum) ignores transit's parts
    assert parse_hops_row("in=1,back=3,queue=2") == [1.0, 2.0, None, None]
    paths = write_reports(tmp_path, "h", s, r, None)  # type: ignore[arg-type]
    assert "scheduler_queue" in (tmp_path / "h.md").read_text() and all(p.exists() for p in paths)


def parse_hops_row(value: str) -> list[float | None]:
    row = np.full(4, np.nan)
    parse_hops(value, row)
    return [None if np.isnan(x) else float(x) for x in row]


def test_parse_scheduler_metrics() -> None:
    text = (
        'anvil_scheduler_batch_size_sum{model="mlp"} 40.0\n'
        'anvil_scheduler_batch_size_count{model="mlp"} 10.0\n'
        'anvil_scheduler_batch_size_count{model="busy"} 3.0\n'
        'anvil_scheduler_target_batch{model="mlp"} 8.0\n'
    )
    assert parse_batch_metrics(text, "mlp") == (40.0, 10.0, 8.0)
    assert parse_batch_metrics(text, "identity") is None


def test_a_waiter_cancelled_after_a_release_skipped_it_raises_its_cancellation() -> None:
    """A request waiting for a connection is cancelled (its timeout) and, before it runs again, a
    release skips its cancelled future: it must end in CancelledError (not ValueError from removing
    a future no longer queued), and the slot must go to the next waiter."""
    from anvil_client.bench.http1 import Endpoint, Pool

    async def main() -> tuple[str, int]:
        pool = Pool(Endpoint.parse("http://127.0.0.1:9"), size=1)
        pool.free = 0  # the one slot is taken
        first = asyncio.ensure_future(pool.request(b"", b""))
        await asyncio.sleep(0)  # queued as a waiter
        (fut,) = pool.waiters
        first.cancel()  # cancels its waiter future now; the task itself runs on the next turn
        assert fut.cancelled()
        pool._release()  # in between: skips the cancelled waiter, so the slot is free again
        outcome = "cancelled"
        try:
            await first
        except asyncio.CancelledError:
            pass
        except ValueError as exc:
            outcome = f"ValueError: {exc}"
        return outcome, pool.free

    outcome, free = asyncio.run(main())
    assert outcome == "cancelled" and free == 1


def test_latencies_are_not_quantized_by_uvloops_clock() -> None:
    """`anvil bench` runs on uvloop, whose loop.time() is in whole (cached) milliseconds: recorded
    with it, every latency was a whole number of ms (a c1 p50 of 1.2 ms read as 1.0)."""
    import uvloop

    async def main() -> object:
        server, port, _ = await _server(stall_s=0.0)
        r = await Engine(f"http://127.0.0.1:{port}", Workload()).run_closed(1, 0.3)
        server.close()
        return r

    r = uvloop.run(main())
    lat_ms = r.latency_s[r.status == 200] * 1e3  # type: ignore[attr-defined]
    assert lat_ms.size > 20
    off_whole_ms = np.abs(lat_ms - np.round(lat_ms)) > 0.01
    assert off_whole_ms.mean() > 0.5 and float(np.median(lat_ms)) > 0


def test_a_response_head_is_read_strictly_and_a_request_head_built_whole() -> None:
    """parse_head (the bench engine's client and bench/http_load.py's Wire): lower-case names, a
    three-digit status; no HTTP/1.x status line, or a header line without a colon, is ValueError."""
    from anvil_client.bench.http1 import parse_head, request_head

    status, headers = parse_head(b"HTTP/1.1 503 Busy\r\nContent-Length: 2\r\nX-A:  b \r\n\r\n")
    assert status == 503 and headers == {"content-length": "2", "x-a": "b"}
    for bad in (b"SSH-2.0-OpenSSH", b"HTTP/1.1 2x0 OK", b"HTTP/1.1 200 OK\r\nno colon"):
        with pytest.raises(ValueError):
            parse_head(bad)
    head = request_head("h", 8, "/p", [("A", "1")], 5, method="PUT")
    assert head == b"PUT /p HTTP/1.1\r\nHost: h:8\r\nA: 1\r\nContent-Length: 5\r\n\r\n"
