"""An executor's links to this host's gateways beside the scheduler's (docs/scheduler.md): direct
answers (`deliver`: a batch's answers written to each named gateway's answer socket) and direct
requests (`DirectSocket`: gateways' lone requests on this executor's own socket). Both are used on
the thread that runs the batch; the direct socket only on the I/O loop."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import zmq

from anvil_core import codec
from anvil_core.codec import pb
from anvil_core.drops import DropLog
from anvil_core.logs import get_logger
from anvil_core.unix_link import PolledFds, UnixRouter
from anvil_core.unix_peers import BUSY, AnswerSender, direct_path
from anvil_executor import metrics as m
from anvil_executor.batch_runner import Pending

__all__ = ["DirectSocket", "deliver"]

log = get_logger("anvil.executor")
_POLL_IN, _POLL_OUT = int(zmq.POLLIN), int(zmq.POLLOUT)

# (gateway identity, model, request id, the request's frames: [envelope, *payloads])
Handle = Callable[[bytes, str, str, list[bytes]], None]


def deliver(answers: AnswerSender, pending: Pending, result: pb.BatchResultT, out: list[Any]) -> list[Any]:
    """Direct answers: each answer whose request names its gateway (``Batch.reply_to``) written
    to that gateway's answer socket, one message per gateway; the frames left for the scheduler
    (what could not go, and every answer of a request that did not read) and ``deliveredIds``
    set. Called where the batch ran (a compute lane, or the I/O loop for an inline batch)."""
    if not pending.reply_to or not out:
        return out
    groups = pending.answer_groups  # (request index, frames), the order of `out`
    by_gateway: dict[str, list[int]] = {}  # gateway -> positions in groups
    for g, (i, _) in enumerate(groups):
        gateway = pending.reply_to[i]
        if gateway and pending.requests[i] is not None:
            by_gateway.setdefault(gateway, []).append(g)
    delivered: set[int] = set()
    ids: list[str] = []
    for gateway, mine in by_gateway.items():
        if answers.send(gateway, codec.bundle([groups[g][1] for g in mine], responses=True)):
            delivered.update(mine)
            ids += [pending.requests[groups[g][0]].requestId for g in mine]
    m.answers.labels(path="direct").inc(len(delivered))
    m.answers.labels(path="scheduler").inc(len(groups) - len(delivered))
    if not delivered:
        return out
    keep = [group for g, (_, group) in enumerate(groups) if g not in delivered]
    result.frameCounts = [len(group) for group in keep]
    result.deliveredIds = list[str | None](ids)
    return [frame for group in keep for frame in group]


class DirectSocket:
    """This executor's direct socket, ``direct-<service id>.usock`` in the link directory (a
    `UnixRouter`: 0600, this user's peers only, a hello first), served from the I/O loop. A message
    is ``[model, request id, envelope, *payloads]``; one without its header is counted and dropped.
    What the executor will not run it hands back with ``busy``; what it ran it answers with
    ``answer``."""

    def __init__(self, service_id: str, drops: DropLog) -> None:
        self.service_id = service_id
        self.drops = drops
        self.router: UnixRouter | None = None
        self._fds = PolledFds(_POLL_IN, _POLL_OUT)
        self.ran = 0  # direct requests run

    @property
    def path(self) -> str | None:
        return None if self.router is None else self.router.path

    def listen(self, ipc_dir: str) -> None:
        """Serve the socket in the link directory `ipc_dir` (again when the directory moved). Not
        served: logged, every request comes through the scheduler."""
        path = direct_path(ipc_dir, self.service_id)
        if self.router is not None:
            if self.router.path == path:
                return
            self.close()
        if path is None:
            log.warning("no direct socket: the service id cannot name one", extra={"id": self.service_id})
            return
        try:
            self.router = UnixRouter(path)
        except OSError as exc:
            log.warning("no direct socket: requests come through the scheduler", extra={"err": str(exc)})

    def serve(
        self, events: dict[Any, int], poller: zmq.Poller, handle: Handle, stop: Callable[[], bool]
    ) -> None:
        """The socket's ready fds of the poll's `events`: connections accepted, each request read
        handed to `handle` (until `stop` says so), then the poller's fds brought up to date."""
        router = self.router
        if router is None:
            return
        for fd, flags in events.items():
            if not isinstance(fd, int) or not router.owns(fd):
                continue
            msgs, problems = router.on_ready(fd, bool(flags & _POLL_OUT))
            for reason, detail in problems:
                if reason != "closed":  # a gateway that went away is no one's fault
                    self.drops.drop(reason, f"direct socket: {detail}")
            for gateway, parts in msgs:
                if stop():
                    break
                header = _header(parts)
                if isinstance(header, str):
                    self.drops.drop("invalid", f"direct request from {gateway!r}: {header}")
                else:
                    handle(gateway, *header, parts[2:])
        self._fds.watch(poller, router)

    def busy(self, gateway: bytes, rid: str) -> None:
        m.direct_requests.labels(outcome="busy").inc()
        if self.router is not None:
            self.router.send(gateway, [BUSY, rid.encode()])

    def answer(self, gateway: bytes, rid: str, pending: Pending, result: pb.BatchResultT) -> None:
        """A direct request's answer (or its error) on its gateway's connection; a gateway gone
        meanwhile has nobody left to answer."""
        groups = [group for _, group in pending.answer_groups]
        if not groups:  # a failure of the whole batch (or of its preparation)
            err = result.error or codec.error(pb.ErrorCode.INTERNAL, "the executor produced no answer")
            name = pending.model.spec.name if pending.model else ""
            envelope = codec.build_response(
                request_id=rid, trace_id=None, model=name, error=(err.code, err.reason or "")
            )
            groups = [[envelope]]
        if self.router is not None:
            self.router.send(gateway, codec.bundle(groups, responses=True))

    def close(self) -> None:
        if self.router is not None:
            self.router.close()
            self.router = None


def _header(parts: list[bytes]) -> tuple[str, str] | str:
    """(model, request id) of a direct request's message, or why it has none."""
    if len(parts) < 3 or not 0 < len(parts[1]) <= 256:
        return "no model and request id before the request"
    try:
        return parts[0].decode(), parts[1].decode()
    except UnicodeDecodeError:
        return "model or request id not UTF-8"
