"""The scheduler's same-host Unix stream links (anvil_core.unix_link; docs/scheduler.md): one router
for gateways and one for executors, in the run's link directory, served from the scheduler's own
ZeroMQ poll loop beside its ROUTER sockets."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import zmq

from anvil_core.unix_link import PolledFds, UnixRouter, unix_endpoint, unix_path
from anvil_scheduler import metrics as m

__all__ = ["UnixLinks"]

# (handler of one received message [identity, *frames], what to do with a (reason, detail) problem)
Handle = Callable[[list[Any]], None]
Problem = Callable[[str, str], None]
# zmq's poll flags as plain ints: an operator on the IntFlag members costs ~1.5 µs each (enum.Flag),
# and the loop set the flags of every fd once a turn
_POLL_IN, _POLL_OUT = int(zmq.POLLIN), int(zmq.POLLOUT)


class UnixLinks:
    """Both Unix routers, and which of their fds the loop's poller watches with which flags."""

    def __init__(self, ipc_dir: str) -> None:
        self.gateway = UnixRouter(unix_path(unix_endpoint(ipc_dir, "gateway")))
        self.executor = UnixRouter(unix_path(unix_endpoint(ipc_dir, "executor")))
        self._polled = PolledFds(_POLL_IN, _POLL_OUT)

    def watch(self, poller: zmq.Poller) -> None:
        """Keep the poller's fds in step with the routers' connections (new, gone, and whether each
        has bytes waiting to be written)."""
        self._polled.watch(poller, self.gateway, self.executor)

    def serve(
        self, events: dict[Any, int], on_gateway: Handle, on_executor: Handle, problem: Problem
    ) -> None:
        """Every ready fd of the poll's ``events`` (the ints: ZeroMQ sockets are the caller's),
        handed to its router; each message read goes to its link's handler. Executors' fds first:
        a batch's result frees its lane before a request read in the same turn is admitted, so that
        request is not kept waiting by the result's processing (its queue time counts from its read)
        and finds the lane free."""
        ready = [(fd, flags) for fd, flags in events.items() if isinstance(fd, int)]
        ready.sort(key=lambda item: self.gateway.owns(item[0]))  # False (executor) first; stable
        for fd, flags in ready:
            router, handle = (
                (self.gateway, on_gateway) if self.gateway.owns(fd) else (self.executor, on_executor)
            )
            msgs, problems = router.on_ready(fd, bool(flags & _POLL_OUT))
            for reason, detail in problems:
                problem(reason, detail)
            for ident, frames in msgs:
                handle([ident, *frames])

    def export(self) -> None:
        m.unix_peers.labels(link="gateway").set(len(self.gateway.conns))
        m.unix_peers.labels(link="executor").set(len(self.executor.conns))

    def close(self) -> None:
        self.gateway.close()
        self.executor.close()
