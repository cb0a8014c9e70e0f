"""The qos process: each tick, follow the registry's services with the probes, turn their readings
into pressure measures, read the p1 SLO and the operators' base rates, run the policy, and write its
decisions to `anvil:qos:limits`, `anvil:events` and /metrics.

Where eBPF cannot load, the /proc observer stands in: said once at start (log line with the reason),
and reported as `mode`/`reason` in the registry record and `anvil_qos_mode` in the metrics.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Iterable
from typing import Any

from redis.exceptions import RedisError

from anvil_core import keys
from anvil_core.logs import get_logger
from anvil_core.metrics import serve_metrics
from anvil_core.registry import Registry
from anvil_qos.metrics import Exporter
from anvil_qos.observer import Observer, open_observer
from anvil_qos.policy import Action, Decision, Policy
from anvil_qos.rates import BASE_KEY, QOS_REASON_PREFIX, parse_bases, parse_limit_rate, parse_slo
from anvil_qos.settings import QosSettings
from anvil_qos.signals import Measure, PressureMeter
from anvil_qos.targets import Target, parse_explicit, resolve

__all__ = ["Qos"]

log = get_logger("anvil.qos")


class Qos:
    def __init__(self, settings: QosSettings) -> None:
        self.s = settings
        self.explicit = parse_explicit(settings.targets)
        self.policy = Policy(settings.policy_config())
        self.calibrator = settings.calibrator()
        self.meter = PressureMeter(settings.signal_window_ms / 1000)
        self.exporter = Exporter()
        self.observer: Observer | None = None
        self.targets: list[Target] = []
        self._resolved: dict[tuple[str, ...], Target] = {}  # registry record -> probed process
        self.measures: list[Measure] = []
        self.notes: tuple[str, ...] = ()  # what the observer cannot see, and why
        self._said: set[str] = set()
        self._redis_ok = True
        self.registry = Registry(
            settings.redis_url,
            "qos",
            settings.service_id,
            settings.heartbeat_ttl_s,
            settings.heartbeat_interval_s,
            fields=self._fields,
            auth=settings.redis_auth,
        )

    def _fields(self) -> dict[str, object]:
        obs = self.observer
        return {
            "mode": obs.mode if obs else "starting",
            "reason": obs.reason if obs else "",
            "targets": len(self.targets),
            "notes": list(self.notes),
            # "name subject" -> {samples, ready, median, mad, threshold}: what qos learned on this host
            "baselines": {f"{b.name} {b.subject}": b.record() for b in self.calibrator.baselines()},
        }

    async def run(self, stop: asyncio.Event) -> None:
        serve_metrics(self.s.metrics_port, "qos", self.s.service_id)
        await self.registry.start()  # registered at once (mode "starting"), like every service
        # Compiling the BPF programs takes ~1 s of clang: off the event loop, heartbeats go on.
        observer = await asyncio.to_thread(
            open_observer, self.s.force_procfs, self.s.cuda_library, self.s.cuda_probe
        )
        self.observer = observer
        self.exporter.set_mode(observer.mode)
        if observer.mode == "ebpf":
            log.info("eBPF probes loaded (mode=ebpf)")
        else:
            log.warning(
                "eBPF unavailable; observing through /proc (mode=procfs)", extra={"reason": observer.reason}
            )
        await self.registry.beat()
        await self._adopt()
        tick_s = self.s.tick_ms / 1000
        try:
            while not stop.is_set():
                started = time.monotonic()
                try:
                    await self.tick(observer)
                    if not self._redis_ok:
                        log.info("redis reachable again")
                    self._redis_ok = True
                except (RedisError, OSError) as exc:
                    if self._redis_ok:
                        log.warning("tick skipped: redis unreachable", extra={"err": str(exc)})
                    self._redis_ok = False
                try:
                    await asyncio.wait_for(stop.wait(), max(0.0, tick_s - (time.monotonic() - started)))
                except TimeoutError:
                    pass
        finally:
            await asyncio.to_thread(observer.close)
            await self.registry.stop()

    async def tick(self, observer: Observer) -> list[Decision]:
        redis = self.registry.redis
        records = [rec for kind in self.s.kinds for rec in await self.registry.services(kind)]
        found, problems = resolve(records, cache=self._resolved)
        self._say(problems)
        pids = {t.pid for t in found}
        targets = sorted(found + [t for t in self.explicit if t.pid not in pids])
        if targets != self.targets:
            await asyncio.to_thread(observer.set_targets, targets, self.s.ports)
            log.info("targets", extra={"targets": [f"{t.kind}:{t.id}:{t.pid}" for t in targets]})
            self.targets = targets
        sample = await asyncio.to_thread(observer.sample)
        self.notes = sample.notes
        self._say(sample.notes)
        self.measures = self.meter.update(sample)
        # Baselines of targets that left are dropped (a target idle for a window keeps its own).
        self.calibrator.retain([f"{t.kind}:{t.id}" for t in targets] + [f"port:{p}" for p in self.s.ports])
        self.exporter.observe(sample, self.measures, self.calibrator.baselines())
        slo = parse_slo(_strs(await redis.hgetall(keys.slo_key())))
        bases, errors = parse_bases(self.s.base_rates, _strs(await redis.hgetall(BASE_KEY)))
        self._say(errors)
        now = time.time()
        decisions = self.policy.step(
            now, slo, self.measures, bases, self.calibrator.thresholds(self.measures)
        )
        if self.policy.settled(now, self.s.baseline_quiet_ms / 1000):
            self.calibrator.learn(self.measures)
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "tick",
                extra={"measures": {f"{m.name} {m.subject}": round(m.value, 3) for m in self.measures}},
            )
        if decisions:
            await self._apply(decisions)
        return decisions

    async def _apply(self, decisions: list[Decision]) -> None:
        async with self.registry.redis.pipeline(transaction=False) as pipe:
            for d in decisions:
                if d.action in (Action.BASE, Action.DECREASE, Action.INCREASE):
                    pipe.hset(keys.qos_limits_key(), d.key, d.limit_json())
                elif d.action == Action.REMOVE:
                    pipe.hdel(keys.qos_limits_key(), d.key)
                pipe.publish(keys.EVENTS, json.dumps(d.event()))
            await pipe.execute()
        for d in decisions:
            self.exporter.decided(d)
            log.info("decision", extra=d.event())

    async def _adopt(self) -> None:
        """Resume the throttles a previous qos left (its reasons start with 'qos:')."""
        try:
            raw = await self.registry.redis.hgetall(keys.qos_limits_key())
        except (RedisError, OSError):
            return
        ours = {}
        for key, value in _strs(raw).items():
            parsed = parse_limit_rate(value)
            if parsed and parsed[1].startswith(QOS_REASON_PREFIX):
                ours[key] = parsed[0]
        self.policy.adopt(ours)

    def _say(self, lines: Iterable[str]) -> None:
        """Log each distinct problem once (a missing pid, a bad base rate, an off probe)."""
        for line in lines:
            if line not in self._said:
                self._said.add(line)
                log.warning(line)


def _strs(raw: dict[Any, Any]) -> dict[str, str]:
    """A Redis hash as str -> str (the registry's client decodes responses; this keeps mypy honest)."""
    return {
        (k.decode() if isinstance(k, bytes) else str(k)): (v.decode() if isinstance(v, bytes) else str(v))
        for k, v in raw.items()
    }
