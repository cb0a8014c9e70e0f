"""Process lifecycle shared by the services: logging, event loop, signals, graceful stop."""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Awaitable, Callable

from anvil_core.logs import get_logger, setup_logging
from anvil_core.settings import ServiceSettings

__all__ = ["run_service", "run_sync_service"]


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
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    log.info("starting", extra={"id": settings.service_id})
    main(stop)
    log.info("stopped", extra={"id": settings.service_id})
