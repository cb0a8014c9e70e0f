"""The executor's model-loading loop: follows the registry (``anvil_core.deployments``) at every beat.

For each model record and unload mark it decides, for this executor:

* unloaded (``anvil:unloaded:{name}``), or an artifact whose placement excludes this executor ->
  unload the model if served here;
* an artifact placed here that is not the one served -> load it on a loader thread, warm it up,
  then switch to it in one step (the version served before answers until then);
* a built-in model of this executor's settings that is no longer served (it was unloaded, then
  loaded again) -> load it again.

Then it advertises what it serves in its own key (``publish_served``: ``anvil:served:{id}``, with
its registry TTL); the readers derive READY from it. It writes nothing else of the registry's.

A load that fails is retried with exponential back-off (``load_retry_base_ms`` doubling up to
``load_retry_max_ms``), and logged, counted and published as an event once per state change (a new
artifact failing, a different error, a recovery), not at every retry.

Threads: ``sync`` runs on the executor's background (Redis) loop; loads run on their own threads;
``models`` is read by the compute thread, which looks a model up once per batch (a batch that
started keeps the model object it found, whatever is swapped meanwhile).
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from anvil_core import deployments as dep
from anvil_core import keys
from anvil_core.logs import get_logger
from anvil_executor import metrics as m
from anvil_executor.models import Model

__all__ = ["ModelLoader"]

log = get_logger("anvil.executor.loader")

LoadArtifact = Callable[[str, str], Model]  # (model name, artifact id) -> warm model; raises on failure


@dataclass
class _Failure:
    artifact: str
    error: str
    attempts: int
    retry_at_s: float  # monotonic


@dataclass(frozen=True)
class _Served:
    artifact: str  # "" for a built-in
    version: str


class ModelLoader:
    """Owns ``models`` (name -> served Model) of one executor, as the registry asks."""

    def __init__(
        self,
        executor_id: str,
        device: str,
        builtins: dict[str, Model],
        load_builtin: Callable[[str], Model],
        load_artifact: LoadArtifact,
        on_change: Callable[[], None],
        retry_base_s: float = 1.0,
        retry_max_s: float = 60.0,
        served_ttl_s: float = 10.0,
    ) -> None:
        self.executor_id = executor_id
        self.device = device
        self.models: dict[str, Model] = dict(builtins)
        self._builtin_names = tuple(builtins)
        self._load_builtin = load_builtin
        self._load_artifact = load_artifact
        self._on_change = on_change  # called from any thread: re-register with the scheduler
        self.retry_base_s = retry_base_s
        self.retry_max_s = retry_max_s
        self.served_ttl_ms = int(served_ttl_s * 1000)  # its advertisement lives as its registry entry
        self._served = {n: _Served("", mdl.spec.version) for n, mdl in builtins.items()}
        self._loading: set[str] = set()
        self.failures: dict[str, _Failure] = {}
        self._lock = threading.Lock()
        self._events: list[dict[str, Any]] = []  # published on the next sync

    # ---- the beat ------------------------------------------------------------------------------
    async def sync(self, redis: Any) -> None:
        """Called at every registry beat: act on the records, then advertise what is served."""
        seen: set[str] = set()
        marks = await dep.unloaded(redis)
        async for key in redis.scan_iter(match=keys.model_key("*"), count=200):
            name = _text(key).removeprefix(keys.model_key(""))
            artifact, version, placement = (
                _text(v) for v in await redis.hmget(key, ["artifact", "version", "placement"])
            )
            seen.add(name)
            status = dep.UNLOADED if name in marks else dep.COMPILED
            self._follow(name, status, artifact, version or "1", dep.parse_placement(placement))
        for name in marks.keys() - seen:  # a built-in unloaded, or a model undeployed altogether
            seen.add(name)
            self._follow(name, dep.UNLOADED, "", "", {})
        for name in self._builtin_names:  # a record that vanished (Redis restart, `load` of a built-in)
            if name not in seen and name not in self.models:
                self._start(name, "", "")
        with self._lock:
            events, self._events = self._events, []
            served = [(n, mdl, self._served.get(n)) for n, mdl in self.models.items()]
        for event in events:
            await redis.publish(keys.EVENTS, json.dumps(event))
        advertised = {
            name: (how.artifact, how.version, model.spec.to_json())
            for name, model, how in served
            if how is not None and name not in marks
        }
        await dep.publish_served(redis, self.executor_id, advertised, self.served_ttl_ms)

    def _follow(self, name: str, status: str, artifact: str, version: str, placement: dict[str, Any]) -> None:
        here = self._served.get(name)
        if status == dep.UNLOADED:
            self.unload(name, "unloaded in the registry")  # also forgets a failing load of it
            return
        if not artifact:  # a built-in's record (or one a Redis restart emptied): nothing to load
            if name in self._builtin_names and here is None:
                self._start(name, "", "")
            return
        if not dep.placement_allows(placement, self.device, self.executor_id):
            self.unload(name, "its placement excludes this executor")
            return
        if here is not None and here.artifact == artifact:
            if here.version != version:  # the same artifact deployed again under a new version
                self._rename(name, version)
            return
        self._start(name, artifact, version)

    # ---- loading -------------------------------------------------------------------------------
    def _start(self, name: str, artifact: str, version: str) -> None:
        with self._lock:
            if name in self._loading:
                return
            failed = self.failures.get(name)
            if failed is not None and failed.artifact == artifact and time.monotonic() < failed.retry_at_s:
                return  # backing off
            self._loading.add(name)
        threading.Thread(
            target=self._load, args=(name, artifact, version), name=f"load-{name}", daemon=True
        ).start()

    def _load(self, name: str, artifact: str, version: str) -> None:
        """Loader thread: load and warm up, then serve it (one dict assignment: batches that start
        after it run the new model, those already running finish on the old one)."""
        try:
            model = self._load_artifact(name, artifact) if artifact else self._load_builtin(name)
            if artifact:
                model.spec = dataclasses.replace(model.spec, version=version)
        except Exception as exc:
            self._failed(name, artifact, exc)
            with self._lock:
                self._loading.discard(name)
            return
        with self._lock:
            before = self.failures.pop(name, None)
            self.models[name] = model
            self._served[name] = _Served(artifact, model.spec.version)
        m.load_failing.labels(model=name).set(0)
        where = {"model": name, "artifact": artifact or "(built-in)", "version": model.spec.version}
        if before is not None:
            where["failed_attempts"] = str(before.attempts)
        log.info("model loaded", extra=where)
        self._on_change()
        with self._lock:  # a load ends once it is reported: whoever waits for it sees both
            self._loading.discard(name)

    def _failed(self, name: str, artifact: str, exc: Exception) -> None:
        error = f"{type(exc).__name__}: {exc}"
        with self._lock:
            last = self.failures.get(name)
            attempts = last.attempts + 1 if last is not None and last.artifact == artifact else 1
            delay_s = min(self.retry_max_s, self.retry_base_s * 2 ** (attempts - 1))
            self.failures[name] = _Failure(artifact, error, attempts, time.monotonic() + delay_s)
            changed = last is None or last.artifact != artifact or last.error != error
            if changed:
                self._events.append(
                    {"event": "model_load_failed", "model": name, "artifact": artifact,
                     "executor": self.executor_id, "error": error[:500], "ts": time.time()}
                )  # fmt: skip
        m.load_failures.labels(model=name).inc()
        m.load_failing.labels(model=name).set(1)
        where = {"model": name, "artifact": artifact, "attempt": attempts, "retry_in_s": round(delay_s, 1)}
        if changed:  # once per state change; the retries that fail the same way stay quiet
            log.error(
                "cannot load model; retrying with back-off", extra={**where, "err": error}, exc_info=exc
            )
        else:
            log.debug("model still fails to load", extra=where)

    # ---- unloading -----------------------------------------------------------------------------
    def unload(self, name: str, why: str) -> None:
        """Stop serving ``name``: later batches of it are answered NOT_FOUND by the batch runner."""
        with self._lock:
            model = self.models.pop(name, None)
            self._served.pop(name, None)
            self.failures.pop(name, None)
        if model is None:
            return
        _forget_series(name)
        log.info("model unloaded", extra={"model": name, "why": why})
        self._on_change()

    def _rename(self, name: str, version: str) -> None:
        with self._lock:
            model = self.models.get(name)
            here = self._served.get(name)
            if model is None or here is None:
                return
            model.spec = dataclasses.replace(model.spec, version=version)
            self._served[name] = _Served(here.artifact, version)
        self._on_change()

    # ---- views ---------------------------------------------------------------------------------
    def artifact_of(self, name: str) -> str:
        how = self._served.get(name)
        return how.artifact if how is not None else ""

    def load_errors(self) -> dict[str, str]:
        """model -> "artifact: error" of the loads failing now (the executor's registry record)."""
        with self._lock:
            return {n: f"{f.artifact or '(built-in)'}: {f.error}"[:300] for n, f in self.failures.items()}


def _forget_series(model: str) -> None:
    """An unloaded model keeps no per-model series here (bounded metrics across deploys)."""
    for metric in (m.load_failing, m.load_failures, m.warmup_seconds, m.compute_us):
        try:
            metric.remove(model)
        except KeyError:
            pass


def _text(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw or "")
