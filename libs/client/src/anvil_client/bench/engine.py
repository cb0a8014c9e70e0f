"""The load generator: open loop (a fixed schedule of send times) or closed loop (N clients).

Open loop: a single dispatcher task wakes at each intended send time and starts the requests that
are due; latency runs from the *intended* time, so queueing anywhere (the server, the connection
pool, or this generator) is charged to the request. The dispatcher's own lateness is recorded per
request as `lag_s` and reported, so a run whose generator fell behind is visible as such.

Transport: HTTP/1.1 keep-alive connections (http1.py), or ZeroCopy (zerocopy.py) when the engine
is given a ZeroCopySender.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from anvil_client.bench.arrivals import Schedule
from anvil_client.bench.http1 import Endpoint, HttpError, Pool
from anvil_client.bench.workload import ID_WIDTH, Workload, request_id, response_id
from anvil_client.bench.zerocopy import ZeroCopySender

__all__ = ["ALL_HOPS", "HOPS", "TRANSIT_HOPS", "Engine", "Progress", "RunResult", "parse_hops"]

HOPS = ("gateway_in", "scheduler_queue", "compute", "transit")  # the gateway's x-anvil-hops-us header
# transit's split, where the answer carried the services' stamps (the gateway's hops.py); same names
# in the header
TRANSIT_HOPS = ("to_scheduler", "to_executor", "executor_queue", "back")
ALL_HOPS = HOPS + TRANSIT_HOPS
_HOP_KEYS = {"in": 0, "queue": 1, "compute": 2, "transit": 3} | {k: 4 + j for j, k in enumerate(TRANSIT_HOPS)}
TRANSPORT_ERROR = 0  # status recorded when no HTTP response came back
# Every time a run records (sends, answers, lag) is read from this clock, not from the event loop's:
# uvloop's loop.time() is in whole milliseconds and cached for a loop iteration, which quantized
# every latency to 1 ms (a c1 p50 of 1.2 ms read as 1.0). Timers and sleeps stay on the loop.
_clock = time.perf_counter
CLIENT_TIMEOUT = -1
_MIN_SLEEP_S = 0.001


@dataclass
class RunResult:
    """Per request (arrays of equal length, ordered by request index); times in s from run start."""

    intended_s: np.ndarray  # (n,) f64: when the request should have been sent
    lag_s: np.ndarray  # (n,) f64: how late the generator started it
    done_s: np.ndarray  # (n,) f64: when its answer was read (nan: never)
    status: np.ndarray  # (n,) i16: HTTP status, 0 transport error, -1 client timeout
    priority: np.ndarray  # (n,) i8
    tenant: np.ndarray  # (n,) i16
    answers: np.ndarray  # (n,) i16: answers received for the request's id (exactly 1 expected)
    reasons: dict[int, str]  # request index -> error text, for every non-200
    id_mismatches: int  # 200 answers whose echoed id was not the request's
    started_unix: float
    wall_s: float
    connections_opened: int
    mode: str
    meta: dict[str, object] = field(default_factory=dict)
    hops_us: np.ndarray | None = None  # (n, len(ALL_HOPS)) f64 µs from the gateway's header (nan: none)

    @property
    def latency_s(self) -> np.ndarray:
        return self.done_s - self.intended_s


@dataclass
class Progress:
    elapsed_s: float
    sent: int
    done: int
    ok: int
    errors: int
    inflight: int
    max_lag_ms: float


class Engine:
    def __init__(
        self,
        url: str,
        workload: Workload,
        *,
        max_connections: int = 512,
        request_timeout_s: float = 30.0,
        zerocopy: ZeroCopySender | None = None,
    ) -> None:
        self.ep = Endpoint.parse(url)
        self.wl = workload
        self.zerocopy = zerocopy  # requests go over ZeroCopy instead of HTTP (opened by the runs)
        self.max_connections = max_connections
        self.request_timeout_s = request_timeout_s
        self._heads: dict[tuple[int, int], tuple[bytes, bytes, bytes]] = {}

    async def run_open(self, sched: Schedule, on_tick: Callable[[Progress], None] | None = None) -> RunResult:
        if self.zerocopy is not None:
            await self.zerocopy.open()
        try:
            return await self._run_open(sched, on_tick)
        finally:
            if self.zerocopy is not None:
                await self.zerocopy.close()

    async def _run_open(self, sched: Schedule, on_tick: Callable[[Progress], None] | None) -> RunResult:
        n = len(sched)
        rec = _Recorder(n, self.wl)
        rec.intended[:] = sched.offsets_s
        if sched.priorities is not None:  # a trace that carries them replaces the priority mix
            rec.priority[:] = sched.priorities
        pool = Pool(self.ep, self.max_connections)
        loop = asyncio.get_running_loop()
        t0 = _clock() + 0.05
        rec.start(t0, time.time() + 0.05)
        ticker = asyncio.create_task(_tick(rec, on_tick)) if on_tick else None
        tasks: set[asyncio.Task[None]] = set()
        offs = sched.offsets_s.tolist()
        i = 0
        while i < n:
            now = _clock() - t0
            if offs[i] > now:
                # Never less than 1 ms: uvloop's timers have ms resolution, and a shorter sleep
                # spins the loop at 100% CPU. Sending up to ~1 ms late is counted (lag, latency).
                await asyncio.sleep(max(offs[i] - now, _MIN_SLEEP_S))
                continue
            while i < n and offs[i] <= now:
                task = loop.create_task(self._one(pool, rec, i, t0))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                i += 1
        if tasks:
            await asyncio.wait(set(tasks))
        if ticker:
            ticker.cancel()
        pool.close()
        return rec.result(_clock() - t0, pool.opened, "open", {"pattern": sched.pattern})

    async def run_closed(
        self, concurrency: int, duration_s: float, on_tick: Callable[[Progress], None] | None = None
    ) -> RunResult:
        """`concurrency` clients, each sending its next request as soon as the last is answered."""
        if self.zerocopy is not None:
            await self.zerocopy.open()
        try:
            return await self._run_closed(concurrency, duration_s, on_tick)
        finally:
            if self.zerocopy is not None:
                await self.zerocopy.close()

    async def _run_closed(
        self, concurrency: int, duration_s: float, on_tick: Callable[[Progress], None] | None
    ) -> RunResult:
        cap = max(1024, int(duration_s * 20_000))  # enough slots for 20k req/s
        rec = _Recorder(cap, self.wl)
        pool = Pool(self.ep, concurrency)
        t0 = _clock()
        rec.start(t0, time.time())
        ticker = asyncio.create_task(_tick(rec, on_tick)) if on_tick else None
        counter = iter(range(cap))

        async def client() -> None:
            while _clock() - t0 < duration_s:
                i = next(counter, None)
                if i is None:
                    return
                rec.intended[i] = _clock() - t0
                await self._one(pool, rec, i, t0)

        await asyncio.gather(*(client() for _ in range(concurrency)))
        if ticker:
            ticker.cancel()
        pool.close()
        return rec.result(_clock() - t0, pool.opened, "closed", {"concurrency": concurrency})

    async def _one(self, pool: Pool, rec: _Recorder, i: int, t0: float) -> None:
        loop = asyncio.get_running_loop()
        now = _clock()
        rec.lag[i] = now - t0 - rec.intended[i]
        rec.sent += 1
        kind = (int(rec.priority[i]), int(rec.tenant[i]))
        # A timer that cancels this task (cheaper than asyncio.timeout/wait_for at thousands per s).
        deadline = now + self.request_timeout_s
        timer = loop.call_later(self.request_timeout_s, _cancel, asyncio.current_task())
        try:
            if self.zerocopy is not None:
                status, reason = await self.zerocopy.send(*kind)
            else:
                status, reason = await self._http(pool, rec, i, kind)
        except asyncio.CancelledError:
            if _clock() < deadline:
                raise
            status, reason = CLIENT_TIMEOUT, f"no answer within {self.request_timeout_s} s"
        except (HttpError, OSError) as exc:  # the connection (or ZeroMQ / the region) failed
            status, reason = TRANSPORT_ERROR, str(exc)
        finally:
            timer.cancel()
        rec.finish(i, _clock() - t0, status, reason)

    async def _http(
        self, pool: Pool, rec: _Recorder, i: int, kind: tuple[int, int]
    ) -> tuple[int, str | None]:
        """One HTTP request: (status, reason or None); counts an answer that echoes another id."""
        parts = self._heads.get(kind)
        if parts is None:
            before, after, headers = self.wl.parts(*kind)
            parts = self._heads[kind] = (
                before,
                after,
                pool.head(self.wl.path, headers, len(before) + len(after) + ID_WIDTH),
            )
        head, before, after = parts[2], parts[0], parts[1]
        rid = request_id(i)
        resp = await pool.request(head, before + rid + after)
        if resp.status != 200:
            return resp.status, resp.body[:300].decode("utf-8", "replace")
        hops = resp.headers.get("x-anvil-hops-us")
        if hops is not None:
            parse_hops(hops, rec.hops[i])
        echoed = response_id(resp.body, resp.headers.get("inference-header-content-length"))
        if echoed is not None and echoed != rid:
            rec.id_mismatches += 1
        return 200, None


def parse_hops(value: str, out: np.ndarray) -> None:
    """Fill ``out`` (ALL_HOPS order; len(HOPS) or more) with the µs of ``in=..,queue=..,compute=..,
    transit=..`` and transit's parts (``to_scheduler=..``, ...) where present; unknown keys, keys past
    ``out`` and unreadable numbers are skipped (a gateway of another version may send others)."""
    for item in value.split(","):
        key, _, num = item.partition("=")
        j = _HOP_KEYS.get(key.strip())
        if j is not None and j < len(out):
            try:
                out[j] = float(num)
            except ValueError:
                continue


def _cancel(task: asyncio.Task[None] | None) -> None:
    if task is not None:
        task.cancel()


class _Recorder:
    def __init__(self, n: int, wl: Workload) -> None:
        self.intended = np.zeros(n)
        self.lag = np.full(n, np.nan)
        self.done = np.full(n, np.nan)
        self.status = np.full(n, -2, np.int16)  # -2: never sent
        self.answers = np.zeros(n, np.int16)
        self.hops = np.full((n, len(ALL_HOPS)), np.nan)
        self.priority, self.tenant = wl.pick(n)
        self.reasons: dict[int, str] = {}
        self.id_mismatches = 0
        self.sent = self.completed = self.ok = 0
        self.t0 = self.unix0 = 0.0

    def start(self, t0: float, unix0: float) -> None:
        self.t0, self.unix0 = t0, unix0

    def finish(self, i: int, done_s: float, status: int, reason: str | None) -> None:
        self.done[i] = done_s
        self.status[i] = status
        self.answers[i] += 1
        self.completed += 1
        if status == 200:
            self.ok += 1
        else:
            self.reasons[i] = reason or ""

    def progress(self, now_s: float) -> Progress:
        n = self.sent
        lag = self.lag[:n] if n else np.zeros(1)
        return Progress(
            now_s,
            n,
            self.completed,
            self.ok,
            self.completed - self.ok,
            n - self.completed,
            float(np.nanmax(lag) * 1e3) if n else 0.0,
        )

    def result(self, wall_s: float, opened: int, mode: str, meta: dict[str, object]) -> RunResult:
        n = len(self.status) if mode == "open" else self.sent
        return RunResult(
            self.intended[:n].copy(),
            self.lag[:n].copy(),
            self.done[:n].copy(),
            self.status[:n].copy(),
            self.priority[:n].copy(),
            self.tenant[:n].copy(),
            self.answers[:n].copy(),
            dict(self.reasons),
            self.id_mismatches,
            self.unix0,
            wall_s,
            opened,
            mode,
            meta,
            self.hops[:n].copy(),
        )


async def _tick(rec: _Recorder, on_tick: Callable[[Progress], None]) -> None:
    while True:
        await asyncio.sleep(0.5)
        on_tick(rec.progress(_clock() - rec.t0))
