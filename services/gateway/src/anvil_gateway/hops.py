"""Where a request's time goes at the gateway and behind it, per hop and per priority (issue #19).

The gateway reports five hops of an HTTP infer request (µs):

* ``gateway_in``: handler entered -> request sent to the scheduler (body read, parse, validate,
  admit, encode); gateway clock.
* ``scheduler_queue``: admitted by the scheduler -> dispatched in a batch (``InferResponse.queue_us``).
* ``compute``: the executor's time for the batch the request rode in (``InferResponse.compute_us``).
* ``transit``: the rest of the round trip: both links, the scheduler's admission and forwarding, the
  executor's queue (round trip - queue - compute).
* ``gateway_out``: answer received -> response built (decode, encode JSON/binary); gateway clock.

``transit`` is split further from the wall-clock stamps the answer carries (the scheduler's dispatch,
the executor's receipt and its outputs copied out; docs/scheduler.md "Per-hop timing"), where it
carries them (a request that ran):

* ``to_scheduler``: sent -> admitted by the scheduler (the link, the scheduler's read and admission);
* ``to_executor``: dispatched -> read by the executor (the link, the executor's loop);
* ``executor_queue``: read -> its batch starts (``InferResponse.exec_queue_us``);
* ``back``: outputs copied out -> answer read by the gateway (the answers' encoding and the
  executor's write to the gateway's answer socket; without direct answers, the hand-off to the
  executor's I/O loop, both links back and the scheduler's forwarding).

The four add up to ``transit`` but for the executor's time outside ``compute`` (µs) and clock
reading noise; stamps of different hosts compare only with synchronised clocks, so a negative
difference (skew) is reported as 0.

Each is observed in ``anvil_gateway_hop_us{hop,priority}``; all but ``gateway_out`` also travel back
to the client in the ``x-anvil-hops-us`` response header (``in=..,queue=..,compute=..,transit=..``
and, where split, ``,to_scheduler=..,to_executor=..,executor_queue=..,back=..``), which ``anvil
bench`` breaks down per priority.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from anvil_core.codec import pb
from anvil_gateway import metrics as m

__all__ = ["HOPS_HEADER", "TRANSIT_HOPS", "Hops"]

HOPS_HEADER = "x-anvil-hops-us"


TRANSIT_HOPS = ("to_scheduler", "to_executor", "executor_queue", "back")  # transit's split, in order
_Split = tuple[int, int, int, int]  # four hops, µs


@dataclass(slots=True)
class Hops:
    """perf_counter_ns stamps of one request at the gateway (0: not reached), and the wall clock at
    send and answer (time_ns) to compare with the other services' stamps."""

    entered_ns: int
    sent_ns: int = 0
    answered_ns: int = 0
    sent_wall_ns: int = 0
    answered_wall_ns: int = 0
    # (answer, its split_us, its transit_us): worked out once per answer, for the header and record
    _measured: tuple[pb.InferResponseT, _Split, _Split | None] | None = None

    def mark_sent(self) -> None:
        self.sent_ns = time.perf_counter_ns()
        self.sent_wall_ns = time.time_ns()

    def mark_answered(self) -> None:
        self.answered_ns = time.perf_counter_ns()
        self.answered_wall_ns = time.time_ns()

    def transit_us(self, resp: pb.InferResponseT) -> tuple[int, int, int, int] | None:
        """``transit`` split (TRANSIT_HOPS order, µs, each >= 0), or None when the answer carries no
        stamps (it did not run, or an executor of an older version answered it)."""
        dispatched, exec_in = int(resp.dispatchedUnixNs), int(resp.executorInUnixNs)
        done = int(resp.executorDoneUnixNs)
        if not (dispatched and exec_in and done and self.sent_wall_ns and self.answered_wall_ns):
            return None
        admitted = dispatched - int(resp.queueUs) * 1000
        return (
            max(0, (admitted - self.sent_wall_ns) // 1000),
            max(0, (exec_in - dispatched) // 1000),
            int(resp.execQueueUs),
            max(0, (self.answered_wall_ns - done) // 1000),
        )

    def split_us(self, resp: pb.InferResponseT) -> tuple[int, int, int, int]:
        """(gateway_in, scheduler_queue, compute, transit) in µs for an answered request."""
        queue, compute = int(resp.queueUs), int(resp.computeUs)
        round_trip = (self.answered_ns - self.sent_ns) // 1000
        return (self.sent_ns - self.entered_ns) // 1000, queue, compute, max(0, round_trip - queue - compute)

    def _measure(self, resp: pb.InferResponseT) -> tuple[_Split, _Split | None]:
        """``split_us`` and ``transit_us`` of `resp`, computed once (``header`` and ``record`` both
        need them)."""
        if self._measured is None or self._measured[0] is not resp:
            self._measured = (resp, self.split_us(resp), self.transit_us(resp))
        return self._measured[1], self._measured[2]

    def header(self, resp: pb.InferResponseT) -> str:
        (gw_in, queue, compute, transit), parts = self._measure(resp)
        text = f"in={gw_in},queue={queue},compute={compute},transit={transit}"
        if parts is not None:
            text += "".join(f",{name}={us}" for name, us in zip(TRANSIT_HOPS, parts, strict=True))
        return text

    def record(self, resp: pb.InferResponseT, priority: int) -> None:
        """Observe every hop of an answered request, its response now built."""
        (gw_in, queue, compute, transit), parts = self._measure(resp)
        out = (time.perf_counter_ns() - self.answered_ns) / 1000
        series = m.hop_series(priority)
        split = len(m.HOP_NAMES) - len(TRANSIT_HOPS)  # the five hops, then transit's parts
        for hist, us in zip(series[:split], (gw_in, queue, compute, transit, out), strict=True):
            hist.observe(us)
        if parts is not None:
            for hist, us in zip(series[split:], parts, strict=True):
                hist.observe(us)
