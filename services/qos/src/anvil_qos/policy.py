"""AIMD throttling of lower-priority tenants to protect the priority-1 SLO (pure: inputs -> decisions).

Each tick `Policy.step(now, slo, measures, bases)` returns the limit changes to make:

- **Decrease** (multiplicative): when p1 is *at risk* — attainment below `attainment_low` or latency
  headroom (1 - p99/SLO) below `headroom_low`, over at least `min_requests` requests — AND a pressure
  measure is over its threshold (the "explaining" signal, named in the reason). Thresholds come per
  (measure, subject) from the caller — the service passes those `baseline.Calibrator` learned on
  this host — else from `PolicyConfig.thresholds` by measure name. The lowest class
  first: every priority-3 limit x `md_factor`, at most once per `md_interval_s`; priority 2 only once
  all priority-3 limits sit at their floor (`floor_frac` x base).
- **No explanation, no action.** p1 at risk with every pressure under threshold means the cause is
  not contention qos can see (a slow model, a cold executor, p1's own load): throttling others would
  cost them without helping p1. The policy says so (an UNEXPLAINED decision, at most once per
  `unexplained_every_s`) and changes nothing.
- **Increase** (additive, with hysteresis): only after p1 is *healthy* (attainment >= `attainment_ok`
  and headroom >= `headroom_ok`, or no fresh p1 reading: qos fails open) AND every pressure is below
  `clear_ratio` x its threshold, continuously for `hold_s`; then + `ai_step_frac` x base per
  `ai_interval_s`, priority 2 before priority 3, up to the base. Between "at risk" and "healthy"
  nothing moves, and the hold restarts.
- **Priority 1 is never throttled**, nor a "{tenant}:*" limit (it covers p1): those stay at base.
- **Bases** come from the operator; a new or changed base is applied at once (an existing throttle
  is kept if lower), a withdrawn one removes qos's limit.

`now` is wall-clock seconds (the SLO readings carry wall-clock `ts`), injected by the caller.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from anvil_core.priorities import DEFAULT_SLO_MS
from anvil_qos.rates import QOS_REASON_PREFIX, BaseRate, SloReading, parse_key
from anvil_qos.signals import Measure

__all__ = ["Action", "Decision", "Policy", "PolicyConfig"]

# Pressure measure -> the bounded cause label of decisions (Prometheus label, event field).
CAUSES = {
    "runq_p99_us": "cpu_runqueue",
    "runq_mean_us": "cpu_runqueue",
    "retransmits_per_s": "tcp_retransmits",
    "gpu_sync_wait_share": "gpu_sync_wait",
}


class Action(StrEnum):
    BASE = "base"  # a governed limit set to its operator base (new or changed base)
    DECREASE = "decrease"
    INCREASE = "increase"
    REMOVE = "remove"  # base withdrawn: qos's limit is removed
    UNEXPLAINED = "unexplained"  # p1 at risk without a pressure signal: reported, nothing changed


@dataclass(frozen=True)
class PolicyConfig:
    attainment_low: float = 0.99  # p1 at risk below this
    attainment_ok: float = 0.995  # p1 healthy at or above this
    headroom_low: float = 0.2  # p1 at risk when p99 is within 20% of its SLO
    headroom_ok: float = 0.35
    p1_slo_ms: float = float(DEFAULT_SLO_MS[1])  # p1's SLO when the reading has no slo_ms (ANVIL_SLO_P1_MS)
    min_requests: int = 20  # fewer p1 requests in the window: attainment means nothing
    slo_stale_s: float = 5.0  # older p1 readings count as none (the scheduler writes every 1 s)
    # Pressure thresholds per measure (signals.py). 2 ms waiting for a CPU, at p99, is 4% of p1's
    # 50 ms SLO per hop; /proc's mean hides the tail, hence the lower bar.
    thresholds: Mapping[str, float] = field(
        default_factory=lambda: {
            "runq_p99_us": 2000.0,
            "runq_mean_us": 500.0,
            "retransmits_per_s": 5.0,
            "gpu_sync_wait_share": 0.95,
        }
    )
    clear_ratio: float = 0.5  # a pressure is gone below threshold x this (hysteresis)
    md_factor: float = 0.5  # each decrease halves the rate
    md_interval_s: float = 1.0  # at most one decrease per second: the effect needs a window to show
    floor_frac: float = 0.05  # never below 5% of base: a throttled tenant still makes progress
    ai_step_frac: float = 0.1  # + 10% of base per step: floor to base in ~10 steps
    ai_interval_s: float = 1.0
    hold_s: float = 5.0  # healthy this long before the first increase
    unexplained_every_s: float = 30.0

    def __post_init__(self) -> None:
        assert 0 < self.md_factor < 1, "md_factor must be in (0, 1)"
        assert 0 < self.floor_frac <= 1 and 0 < self.ai_step_frac <= 1
        assert 0 < self.clear_ratio <= 1
        assert self.attainment_low <= self.attainment_ok and self.headroom_low <= self.headroom_ok


@dataclass(frozen=True)
class Decision:
    action: Action
    key: str  # "{tenant}:{priority}" ("" for UNEXPLAINED)
    rate_rps: float  # the new rate (0 for REMOVE / UNEXPLAINED)
    burst: int
    prev_rate_rps: float
    cause: str  # bounded label: cpu_runqueue, tcp_retransmits, gpu_sync_wait, healthy, operator, none
    reason: str  # one line for people
    ts: float

    def limit_json(self) -> str:
        """The `anvil:qos:limits` value (keys.qos_limits_key)."""
        return json.dumps(
            {"rate_rps": round(self.rate_rps, 3), "burst": self.burst, "reason": self.reason, "ts": self.ts}
        )

    def event(self) -> dict[str, Any]:
        """The `anvil:events` message."""
        return {
            "event": f"qos.{self.action}",
            "key": self.key,
            "rate_rps": round(self.rate_rps, 3),
            "prev_rate_rps": round(self.prev_rate_rps, 3),
            "burst": self.burst,
            "cause": self.cause,
            "reason": self.reason,
            "ts": self.ts,
        }


class Policy:
    """Owned by the qos service loop; single-threaded. State: the current rate of each governed key."""

    def __init__(self, config: PolicyConfig | None = None) -> None:
        self.cfg = config or PolicyConfig()
        self.bases: dict[str, BaseRate] = {}
        self.rates: dict[str, float] = {}
        self._adopted: dict[str, float] = {}
        self._last_md = self._last_ai = self._last_unexplained = float("-inf")
        self._healthy_since: float | None = None
        self.state = "healthy"  # of p1 at the last step: "risk" | "healthy" | "watch"

    def settled(self, now: float, quiet_s: float) -> bool:
        """p1 healthy at the last step, no governed limit below its base and no decrease for `quiet_s`:
        what the measures show now is this host calm (the service learns baselines only then)."""
        throttled = any(
            self.rates.get(k, b.rate_rps) < b.rate_rps
            for k, b in self.bases.items()
            if self.governed_priority(k)
        )
        return self.state == "healthy" and not throttled and now - self._last_md >= quiet_s

    def adopt(self, current: Mapping[str, float]) -> None:
        """Start from the rates a previous qos left in `anvil:qos:limits` (restart keeps throttles)."""
        self._adopted = dict(current)

    def step(
        self,
        now: float,
        slo: Mapping[int, SloReading],
        measures: Sequence[Measure],
        bases: Mapping[str, BaseRate],
        thresholds: Mapping[tuple[str, str], float] | None = None,
    ) -> list[Decision]:
        """`thresholds`: (measure name, subject) -> threshold; measures without one are informational.
        None: `PolicyConfig.thresholds` by measure name."""
        decisions = self._sync_bases(now, bases)
        state, p1 = self._assess_p1(now, slo)
        self.state = state
        if thresholds is None:
            thresholds = {
                (m.name, m.subject): self.cfg.thresholds[m.name]
                for m in measures
                if m.name in self.cfg.thresholds
            }
        governed = [
            (m, thresholds[(m.name, m.subject)]) for m in measures if (m.name, m.subject) in thresholds
        ]
        over = sorted(
            ((m, t) for m, t in governed if m.value > t),
            key=lambda mt: mt[0].value / max(mt[1], 1e-12),
            reverse=True,
        )
        calm = all(m.value <= t * self.cfg.clear_ratio for m, t in governed)
        if state == "risk":
            self._healthy_since = None
            if over and now - self._last_md >= self.cfg.md_interval_s:
                decisions += self._decrease(now, p1, over)
            elif not over and now - self._last_unexplained >= self.cfg.unexplained_every_s:
                self._last_unexplained = now
                reason = f"{QOS_REASON_PREFIX} p1 {p1}; no pressure signal explains it: no throttling"
                decisions.append(Decision(Action.UNEXPLAINED, "", 0.0, 0, 0.0, "none", reason, now))
        elif state == "healthy" and calm:
            if self._healthy_since is None:
                self._healthy_since = now
            if now - self._healthy_since >= self.cfg.hold_s and now - self._last_ai >= self.cfg.ai_interval_s:
                decisions += self._increase(now, p1)
        else:
            self._healthy_since = None
        return decisions

    # -- p1 ----------------------------------------------------------------------------------------
    def _assess_p1(self, now: float, slo: Mapping[int, SloReading]) -> tuple[str, str]:
        """("risk" | "healthy" | "watch", description)."""
        r = slo.get(1)
        if r is None or now - r.ts > self.cfg.slo_stale_s:
            return "healthy", "has no fresh SLO reading"
        if r.requests is not None and r.requests < self.cfg.min_requests:
            return "healthy", f"had {r.requests} requests (< {self.cfg.min_requests})"
        if r.p99_ms is None:  # not published: attainment alone decides
            headroom, text = 1.0, f"attainment {r.attainment:.3f}"
        else:
            headroom = 1.0 - r.p99_ms / (r.slo_ms or self.cfg.p1_slo_ms)
            text = f"attainment {r.attainment:.3f}, headroom {headroom:.2f}"
        if r.attainment < self.cfg.attainment_low or headroom < self.cfg.headroom_low:
            return "risk", text
        if r.attainment >= self.cfg.attainment_ok and headroom >= self.cfg.headroom_ok:
            return "healthy", text
        return "watch", text

    # -- limits --------------------------------------------------------------------------------------
    @staticmethod
    def governed_priority(key: str) -> int | None:
        """2 or 3 for keys qos may throttle; None for p1 and "{tenant}:*" keys."""
        prio = parse_key(key)[1]
        return prio if prio is not None and prio > 1 else None

    def _decision(
        self, action: Action, key: str, rate: float, cause: str, reason: str, now: float
    ) -> Decision:
        base = self.bases[key]
        prev = self.rates.get(key, base.rate_rps)
        self.rates[key] = rate
        burst = max(1, round(base.burst * rate / base.rate_rps))
        return Decision(action, key, rate, burst, prev, cause, f"{QOS_REASON_PREFIX} {reason}", now)

    def _sync_bases(self, now: float, bases: Mapping[str, BaseRate]) -> list[Decision]:
        out = []
        for key in sorted(set(self.bases) - set(bases)):
            prev = self.rates.pop(key, 0.0)
            self.bases.pop(key)
            out.append(
                Decision(
                    Action.REMOVE, key, 0.0, 0, prev, "operator", f"{QOS_REASON_PREFIX} base removed", now
                )
            )
        for key, base in sorted(bases.items()):
            old = self.bases.get(key)
            if old == base:
                continue
            self.bases[key] = base
            floor = base.rate_rps * self.cfg.floor_frac
            if self.governed_priority(key) is None:
                rate = base.rate_rps
            elif old is None:  # first sight: resume a previous qos's throttle, if any
                rate = min(base.rate_rps, max(floor, self._adopted.pop(key, base.rate_rps)))
            else:  # changed base: keep a throttle that is below it
                rate = min(base.rate_rps, max(floor, self.rates.get(key, base.rate_rps)))
            out.append(self._decision(Action.BASE, key, rate, "operator", f"base {base.rate_rps:g} rps", now))
        return out

    def _decrease(self, now: float, p1: str, over: Sequence[tuple[Measure, float]]) -> list[Decision]:
        by_prio: dict[int, list[str]] = {}
        for key in self.bases:
            prio = self.governed_priority(key)
            if prio is not None and self.rates[key] > self.bases[key].rate_rps * self.cfg.floor_frac * 1.0001:
                by_prio.setdefault(prio, []).append(key)
        if not by_prio:
            return []  # every governed limit is at its floor already
        self._last_md = now
        self._last_ai = now  # a later increase waits a full interval after the last decrease
        top = over[0][0]
        cause = CAUSES.get(top.name, top.name)
        why = "; ".join(f"{m.name} {m.subject} {m.value:.4g} > {t:.4g}" for m, t in over[:3])
        out = []
        for key in sorted(by_prio[max(by_prio)]):
            base = self.bases[key]
            rate = max(base.rate_rps * self.cfg.floor_frac, self.rates[key] * self.cfg.md_factor)
            out.append(self._decision(Action.DECREASE, key, rate, cause, f"p1 {p1}; {why}", now))
        return out

    def _increase(self, now: float, p1: str) -> list[Decision]:
        by_prio: dict[int, list[str]] = {}
        for key, base in self.bases.items():
            prio = self.governed_priority(key)
            if prio is not None and self.rates[key] < base.rate_rps:
                by_prio.setdefault(prio, []).append(key)
        if not by_prio:
            return []
        self._last_ai = now
        out = []
        for key in sorted(by_prio[min(by_prio)]):
            base = self.bases[key]
            rate = min(base.rate_rps, self.rates[key] + base.rate_rps * self.cfg.ai_step_frac)
            out.append(self._decision(Action.INCREASE, key, rate, "healthy", f"p1 {p1}; pressure clear", now))
        return out
