"""Process lifecycle shared by the services: logging, event loop, signals, graceful stop."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import threading
from collections.abc import Awaitable, Callable

from anvil_core.logs import get_logger, setup_logging
from anvil_core.settings import ServiceSettings

__all__ = ["apply_cpu_sched", "run_service", "run_sync_service", "settle_gc"]

_POLICIES = {"batch": "SCHED_BATCH", "other": "SCHED_OTHER"}


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


def apply_cpu_sched(settings: ServiceSettings) -> str:
    """Set setting ``cpu_sched``'s policy on every thread of this process (Linux sets it per
    thread; threads started later inherit it from the thread that starts them, processes from their
    parent); "inherit" changes nothing. Returns what was applied, or why not (another OS): never
    fails a start."""
    if settings.cpu_sched == "inherit":
        return "inherited"
    name = _POLICIES[settings.cpu_sched]
    policy = getattr(os, name, None)
    if policy is None or not hasattr(os, "sched_setscheduler"):
        return f"not applied: no {name} here"
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = [0]
    for tid in tids:
        try:
            os.sched_setscheduler(tid, policy, os.sched_param(0))
        except ProcessLookupError:  # a thread that ended meanwhile
            continue
        except OSError as exc:  # e.g. a seccomp profile that refuses it
            return f"not applied: {exc}"
    return name


def run_service(
    kind: str, settings: ServiceSettings, main: Callable[[asyncio.Event], Awaitable[None]]
) -> None:
    """Run `main(stop)` on uvloop (when installed) until SIGTERM/SIGINT sets `stop` and main returns."""
    setup_logging(kind, settings.log_level)
    log = get_logger(f"anvil.{kind}")
    cpu_sched = apply_cpu_sched(settings)

    async def _wrapper() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        log.info("starting", extra={"id": settings.service_id, "cpu_sched": cpu_sched})
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
    log.info("starting", extra={"id": settings.service_id, "cpu_sched": apply_cpu_sched(settings)})
    main(stop)
    log.info("stopped", extra={"id": settings.service_id})
