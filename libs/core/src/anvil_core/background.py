"""An asyncio loop in a daemon thread, for the Redis chores (registry heartbeats, publishing) of a
service whose hot loop is synchronous (a ZeroMQ poller). The hot loop never waits on it: it hands
over snapshots, and results come back through a thread-safe queue it drains when it likes."""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from typing import Any, TypeVar

__all__ = ["Background"]

T = TypeVar("T")


class Background:
    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.inbox: queue.SimpleQueue[Callable[[], Any]] = queue.SimpleQueue()  # for the hot loop
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coro: Awaitable[T]) -> Future[T]:
        """Run `coro` on the background loop (callable from any thread)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)  # type: ignore[arg-type]

    def every(self, interval_s: float, fn: Callable[[], Awaitable[None]]) -> None:
        """Call `fn` every `interval_s` on the background loop; an exception is swallowed per call."""

        async def tick() -> None:
            while True:
                try:
                    await fn()
                except Exception:  # a chore must not die on a Redis hiccup
                    pass
                await asyncio.sleep(interval_s)

        self.loop.call_soon_threadsafe(lambda: self.loop.create_task(tick()))

    def post(self, fn: Callable[[], Any]) -> None:
        """Queue `fn` for the hot loop (called from the background thread)."""
        self.inbox.put(fn)

    def drain(self) -> None:
        """Run what the background thread queued for the hot loop (call from the hot loop)."""
        while True:
            try:
                fn = self.inbox.get_nowait()
            except queue.Empty:
                return
            fn()

    def stop(self, timeout_s: float = 5.0) -> None:
        async def cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        try:
            self.submit(cancel_all()).result(timeout_s)
        except Exception:
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout_s)
