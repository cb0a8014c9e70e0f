"""Process lifecycle shared by the services: logging, event loop, signals, graceful stop."""

from __future__ import annotations

import asyncio
import gc
import signal
import threading
from collections.abc import Awaitable, Callable

from anvil_core.logs import get_logger, setup_logging
from anvil_core.settings import ServiceSettings
from anvil_core.signals import set_on_signals

__all__ = ["run_service", "run_sync_service", "settle_gc"]


def settle_gc(settings: ServiceSettings) -> None:
    """Call once a service has started, before it serves: collect the start-up's garbage, then
    freeze what survives (`gc.freeze`: never scanned again) and set the young generation's
    threshold (settings `gc_freeze`, `gc_gen0_threshold`). With the gateway's imports (FastAPI,
    pydantic, grpc, numpy) in the generations, the collector took a measurable share of its loop
    under load (py-spy, #19)."""
    if settings.gc_gen0_threshold > 0:
        _, gen1, gen2 = gc.get_threshold()
        gc.set_threshold(settings.gc_gen0_threshold, gen1, gen2)
    if settings.gc_freeze:
        gc.collect()
        gc.freeze()


def run_service(
    kind: str, settings: ServiceSettings, main: Callable[[asyncio.Event], Awaitable[None]]
) -> None:
    """Run `main(stop)` on uvloop (when installed) until SIGTERM/SIGINT sets `stop` and main returns."""
    setup_logging(kind, settings.log_level)
    log = get_logger(f"anvil.{kind}")

    async def _wrapper() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        log.info("starting", extra={"id": settings.service_id})
        await main(stop)
        log.info("stopped", extra={"id": settings.service_id})

    try:
        import uvloop

        uvloop.run(_wrapper())
    except ImportError:
        asyncio.run(_wrapper())


def run_sync_service(kind: str, settings: ServiceSettings, main: Callable[[threading.Event], None]) -> None:
    """Run a synchronous service loop `main(stop)` until SIGTERM/SIGINT sets `stop`."""
    setup_logging(kind, settings.log_level)
    log = get_logger(f"anvil.{kind}")
    stop = threading.Event()
    set_on_signals(stop)  # not a handler calling stop.set(): see anvil_core.signals
    log.info("starting", extra={"id": settings.service_id})
    main(stop)
    log.info("stopped", extra={"id": settings.service_id})
