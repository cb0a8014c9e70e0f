"""Scrapes the scheduler's Prometheus endpoint during a run: batch size and PID target over time."""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field

from anvil_client.bench.http1 import Conn, Endpoint, HttpError

__all__ = ["BatchSamples", "parse_batch_metrics", "scrape_loop"]

_LINE = re.compile(r"^(anvil_scheduler_(?:batch_size_sum|batch_size_count|target_batch))\{([^}]*)\} (\S+)$")


@dataclass
class BatchSamples:
    """One row per scrape: t (s from run start), cumulative batch-size sum and count, target B*."""

    t_s: list[float] = field(default_factory=list)
    size_sum: list[float] = field(default_factory=list)
    size_count: list[float] = field(default_factory=list)
    target: list[float] = field(default_factory=list)
    errors: int = 0

    def mean_batch(self) -> list[tuple[float, float]]:
        """(t, mean requests per batch dispatched since the previous scrape), where any were."""
        out = []
        for k in range(1, len(self.t_s)):
            dc = self.size_count[k] - self.size_count[k - 1]
            if dc > 0:
                out.append((self.t_s[k], (self.size_sum[k] - self.size_sum[k - 1]) / dc))
        return out


def parse_batch_metrics(text: str, model: str) -> tuple[float, float, float] | None:
    """(batch_size_sum, batch_size_count, target_batch) of `model`, or None if it has no series yet."""
    got: dict[str, float] = {}
    for line in text.splitlines():
        m = _LINE.match(line)
        if m and f'model="{model}"' in m.group(2):
            got[m.group(1)] = float(m.group(3))
    if "anvil_scheduler_batch_size_count" not in got:
        return None
    return (
        got.get("anvil_scheduler_batch_size_sum", 0.0),
        got["anvil_scheduler_batch_size_count"],
        got.get("anvil_scheduler_target_batch", float("nan")),
    )


async def scrape_loop(url: str, model: str, t0: float, out: BatchSamples, every_s: float = 0.5) -> None:
    """GET `url` every `every_s` until cancelled; a failed scrape is counted, not fatal."""
    ep = Endpoint.parse(url)
    loop = asyncio.get_running_loop()
    head = f"GET {ep.base_path or '/metrics'} HTTP/1.1\r\nHost: {ep.host}:{ep.port}\r\n\r\n".encode()
    conn: Conn | None = None
    while True:
        try:
            if conn is None or conn.closed:
                conn = await Conn.open(ep)
            resp = await conn.request(head, b"")
            row = parse_batch_metrics(resp.body.decode("utf-8", "replace"), model)
            if row is not None:
                out.t_s.append(loop.time() - t0)
                out.size_sum.append(row[0])
                out.size_count.append(row[1])
                out.target.append(row[2])
        except HttpError:
            out.errors += 1
            conn = None
        await asyncio.sleep(every_s)
