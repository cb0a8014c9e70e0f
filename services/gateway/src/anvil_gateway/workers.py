"""The gateway's processes: one server (``serve``), or N workers sharing the HTTP port under a
supervisor (``supervise``); ``python -m anvil_gateway`` picks by ``ANVIL_HTTP_WORKERS``.

Workers share the port, and the gRPC port, through SO_REUSEPORT (the kernel spreads connections
over them; grpc_server.py), so a
gateway's CPU per request (HTTP, JSON, tensor packing) no longer caps the stack at one core. Each
worker is a whole gateway: its own scheduler link, ZeroCopy doorbell, registry entry
``<service_id>-w<i>`` and metrics on ``metrics_port + 100 * i``. When a worker dies the supervisor
stops the others and exits non-zero, so the launcher restarts the lot. Workers are started with
``spawn`` (no forked event loop, ZeroMQ context or thread state) and live in this module, which the
children import by name.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import socket
from multiprocessing.connection import wait
from types import FrameType

import uvicorn

from anvil_core import tracing
from anvil_core.logs import get_logger, setup_logging
from anvil_core.metrics import serve_metrics
from anvil_core.runtime import settle_gc
from anvil_gateway.app import create_app
from anvil_gateway.fastpath import FastInfer
from anvil_gateway.http_protocol import CoalescingHttpToolsProtocol
from anvil_gateway.settings import GatewaySettings

__all__ = ["serve", "supervise", "worker_settings"]

log = get_logger("anvil.gateway")
WORKER_METRICS_STEP = 100  # worker i exports metrics on metrics_port + 100 * i (like executors per GPU)


def serve(settings: GatewaySettings, sock: socket.socket | None = None) -> None:
    """One gateway process: metrics, the app (with its gRPC server), uvicorn on ``sock`` (shared
    port) or its own bind."""
    serve_metrics(settings.metrics_port, "gateway", settings.service_id)
    app = create_app(settings, shared_ports=sock is not None)
    config = uvicorn.Config(
        FastInfer(app, app.state.gw),
        host=settings.bind_host,
        port=settings.http_port,
        loop="uvloop",
        http=CoalescingHttpToolsProtocol,
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=5,
    )
    server = uvicorn.Server(config)
    tracing.setup("gateway")  # OTLP export when OTEL_EXPORTER_OTLP_ENDPOINT is set
    settle_gc(settings)  # the imports and the app live as long as the process
    try:
        server.run(sockets=[sock] if sock is not None else None)
    finally:
        tracing.shutdown()  # flush the queued spans


def worker_settings(base: GatewaySettings, i: int) -> GatewaySettings:
    """Worker ``i``'s settings: its own id, metrics port and ZeroCopy directory."""
    update: dict[str, object] = {
        "service_id": f"{base.service_id}-w{i}",
        "metrics_port": base.metrics_port + WORKER_METRICS_STEP * i if base.metrics_port else 0,
        "http_workers": 1,
    }
    if base.zerocopy_dir:
        update["zerocopy_dir"] = os.path.join(base.zerocopy_dir, f"w{i}")
    return base.model_copy(update=update)


def shared_port(host: str, port: int) -> socket.socket:
    """A listening TCP socket with SO_REUSEPORT, so every worker binds the same port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(2048)
    return sock


def _worker(i: int) -> None:
    settings = worker_settings(GatewaySettings(), i)
    setup_logging("gateway", settings.log_level)
    serve(settings, shared_port(settings.bind_host, settings.http_port))


def supervise(settings: GatewaySettings) -> int:
    """Start ``http_workers`` workers; return when one exits (its code, 1 if it was 0) or on a signal."""
    ctx = mp.get_context("spawn")  # no forked event loop, ZeroMQ context or thread state
    n = settings.http_workers
    procs = [ctx.Process(target=_worker, args=(i,), name=f"gateway-w{i}") for i in range(n)]
    for p in procs:
        p.start()
    log.info("gateway workers started", extra={"workers": len(procs), "pids": [p.pid for p in procs]})
    stopping = False

    def stop(signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        for p in procs:
            if p.is_alive() and p.pid is not None:
                os.kill(p.pid, signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    wait([p.sentinel for p in procs])  # the first to exit
    code = 0 if stopping else next((p.exitcode or 1 for p in procs if p.exitcode is not None), 1)
    if not stopping:
        log.error("a gateway worker exited; stopping the others", extra={"exit_code": code})
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(10)
        if p.is_alive():
            p.kill()
    return code
