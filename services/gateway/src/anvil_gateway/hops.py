"""Where a request's time goes at the gateway and behind it, per hop and per priority (issue #19).

The gateway reports five hops of an HTTP infer request (µs):

* ``gateway_in``: handler entered -> request sent to the scheduler (body read, parse, validate,
  admit, encode); gateway clock.
* ``scheduler_queue``: admitted by the scheduler -> dispatched in a batch (``InferResponse.queue_us``).
* ``compute``: the executor's time for the batch the request rode in (``InferResponse.compute_us``).
* ``transit``: the rest of the round trip: both links, the scheduler's admission and forwarding, the
  executor's queue (round trip - queue - compute).
* ``gateway_out``: answer received -> response built (decode, encode JSON/binary); gateway clock.

Each is observed in ``anvil_gateway_hop_us{hop,priority}``; the first four also travel back to the
client in the ``x-anvil-hops-us`` response header (``in=..,queue=..,compute=..,transit=..``), which
``anvil bench`` breaks down per priority. What the messages would have to carry to split ``transit``
further (per link, the executor's queue) is in docs/scheduler.md ("Per-hop timing").
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from anvil_core.codec import pb
from anvil_gateway import metrics as m

__all__ = ["HOPS_HEADER", "Hops"]

HOPS_HEADER = "x-anvil-hops-us"


@dataclass(slots=True)
class Hops:
    """perf_counter_ns stamps of one request at the gateway (0: not reached)."""

    entered_ns: int
    sent_ns: int = 0
    answered_ns: int = 0

    def mark_sent(self) -> None:
        self.sent_ns = time.perf_counter_ns()

    def mark_answered(self) -> None:
        self.answered_ns = time.perf_counter_ns()

    def split_us(self, resp: pb.InferResponseT) -> tuple[int, int, int, int]:
        """(gateway_in, scheduler_queue, compute, transit) in µs for an answered request."""
        queue, compute = int(resp.queueUs), int(resp.computeUs)
        round_trip = (self.answered_ns - self.sent_ns) // 1000
        return (self.sent_ns - self.entered_ns) // 1000, queue, compute, max(0, round_trip - queue - compute)

    def header(self, resp: pb.InferResponseT) -> str:
        gw_in, queue, compute, transit = self.split_us(resp)
        return f"in={gw_in},queue={queue},compute={compute},transit={transit}"

    def record(self, resp: pb.InferResponseT, priority: int) -> None:
        """Observe every hop of an answered request, its response now built."""
        gw_in, queue, compute, transit = self.split_us(resp)
        out = (time.perf_counter_ns() - self.answered_ns) / 1000
        series = m.hop_series(priority)
        for hist, us in zip(series, (gw_in, queue, compute, transit, out), strict=True):
            hist.observe(us)
