"""The qos service process for real: a real Redis, a registered "executor" (a stand-in process that
wakes every 0.5 ms), a synthetic scheduler writing `anvil:slo`, and a real CPU hog on the executor's
core. qos must lower the priority-3 tenant's rate while the hog runs (never priority 1's), publish
its decisions on `anvil:events`, count them on /metrics, and restore the rates once the hog stops.

Runs in eBPF mode where it can load (run-queue p99 and mean from the BPF probe) and always in /proc
mode (mean run-queue wait from schedstat). No threshold is set for this machine: qos learns the
stand-in's calm level on this host (the test waits until its registry record says the baseline is
learned) and must act on the hog relative to it, with the product's floors and ceilings.
The gateway's token buckets and the real SLO publisher are others' work; this drives qos alone.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from anvil_core import keys
from anvil_qos import ctl
from anvil_qos.probes.bpf_loader import unavailable_reason

pytestmark = pytest.mark.integration

BASE = {"acme:1": 100.0, "acme:3": 100.0}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.1)


class World(threading.Thread):
    """Keeps the stand-in executor registered and plays the scheduler: p1 attainment 0.9 while the
    hog runs (the SLO suffers), 1.0 otherwise."""

    def __init__(self, r: redis.Redis, executor_pid: int) -> None:
        super().__init__(daemon=True)
        self.r, self.pid = r, executor_pid
        self.hog_on = threading.Event()
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            now = time.time()
            key = keys.svc_key("executor", "standin")
            rec = {"kind": "executor", "id": "standin", "pid": str(self.pid), "host": socket.gethostname()}
            self.r.hset(key, mapping=rec)
            self.r.pexpire(key, 3000)
            attainment = 0.9 if self.hog_on.is_set() else 1.0
            slo = {"attainment": attainment, "p99_ms": 20.0, "requests": 400, "window_s": 10.0, "ts": now}
            self.r.hset(keys.slo_key(), "1", json.dumps(slo))
            self.stop.wait(0.2)


@pytest.fixture(params=["ebpf", "procfs"])
def mode(request: pytest.FixtureRequest) -> str:
    if request.param == "ebpf" and (reason := unavailable_reason()):
        pytest.skip(f"eBPF impossible here: {reason}")
    return str(request.param)


@pytest.fixture
def events(redis_url: str) -> Iterator[list[dict[str, Any]]]:
    got: list[dict[str, Any]] = []
    pubsub = redis.Redis.from_url(redis_url).pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(**{keys.EVENTS: lambda m: got.append(json.loads(m["data"]))})
    thread = pubsub.run_in_thread(sleep_time=0.05, daemon=True)
    yield got
    thread.stop()
    thread.join(5)
    pubsub.close()


def test_qos_throttles_p3_under_a_cpu_hog_and_restores_after(
    mode: str, redis_url: str, events: list[dict[str, Any]], sleeper, hog, cpu: int, tmp_path
) -> None:
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    for key, rate in BASE.items():  # as an operator would
        tenant, prio = key.split(":")
        assert (
            ctl.main(["--redis-url", redis_url, "base", "set", tenant, prio, str(rate), "--burst", "20"]) == 0
        )
    executor = sleeper(cpu, "anvil_executor-standin")  # the resolver matches anvil_<kind> in argv
    world = World(r, executor.pid)
    world.start()
    metrics_port = _free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("ANVIL_")},
        "ANVIL_REDIS_URL": redis_url,
        "ANVIL_METRICS_PORT": str(metrics_port),
        "ANVIL_FORCE_PROCFS": "1" if mode == "procfs" else "0",
        "ANVIL_LOG_LEVEL": "DEBUG",  # a line of measures per tick, shown when an assertion fails
        "ANVIL_TICK_MS": "200",
        "ANVIL_SIGNAL_WINDOW_MS": "1000",
        "ANVIL_HEARTBEAT_INTERVAL_MS": "300",
        "ANVIL_MD_INTERVAL_MS": "400",
        "ANVIL_HEALTHY_HOLD_MS": "1000",
        "ANVIL_AI_INTERVAL_MS": "200",
        "ANVIL_AI_STEP_FRAC": "0.25",
        # 10 calm ticks (2 s) learn the baseline; the thresholds are the product's relative ones.
        "ANVIL_BASELINE_MIN_SAMPLES": "10",
        "ANVIL_PRESSURE_CLEAR_RATIO": "0.6",
    }
    log = (tmp_path / "qos.log").open("w")
    qos = subprocess.Popen([sys.executable, "-m", "anvil_qos"], env=env, stdout=log, stderr=subprocess.STDOUT)

    def limit(key: str) -> dict[str, Any]:
        return dict(json.loads(r.hget(keys.qos_limits_key(), key) or "{}"))

    try:
        _wait(lambda: len(r.keys(keys.svc_pattern("qos"))) == 1, 20, "qos to register")
        (qos_key,) = r.keys(keys.svc_pattern("qos"))
        _wait(lambda: r.hget(qos_key, "mode") != "starting", 20, "the probes to load")
        assert r.hget(qos_key, "mode") == mode
        _wait(lambda: limit("acme:3").get("rate_rps") == 100.0, 10, "base rates applied")
        _wait(lambda: r.hget(qos_key, "targets") == "1", 10, "qos to follow the executor")
        measure = "runq_p99_us" if mode == "ebpf" else "runq_mean_us"

        def baseline() -> dict[str, Any]:
            return dict(
                json.loads(r.hget(qos_key, "baselines") or "{}").get(f"{measure} executor:standin", {})
            )

        _wait(lambda: baseline().get("ready") is True, 20, f"qos to learn the stand-in's calm {measure}")
        calm = baseline()
        assert limit("acme:3")["rate_rps"] == 100.0  # calm: no throttling without pressure

        hogger = hog(cpu, -19)
        world.hog_on.set()
        hog_at = time.monotonic()
        _wait(lambda: limit("acme:3").get("rate_rps", 100) < 100.0, 20, "p3 throttled")
        first_s = time.monotonic() - hog_at
        _wait(lambda: limit("acme:3").get("rate_rps", 100) <= 25.0, 20, "p3 throttled (two halvings)")
        reason = limit("acme:3")["reason"]
        assert reason.startswith("qos:") and "runq_" in reason and "executor:standin" in reason
        assert limit("acme:1")["rate_rps"] == 100.0  # p1 never throttled
        print(f"{mode}: calm baseline {calm}; first decrease {first_s:.1f} s after the hog; {reason}")

        body = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
        assert 'anvil_qos_decisions_total{action="decrease",cause="cpu_runqueue"}' in body
        assert f'anvil_qos_mode{{mode="{mode}"}} 1.0' in body
        assert f'anvil_qos_measure{{mode="{mode}",name="runq_' in body
        assert f'anvil_qos_baseline{{name="{measure}",stat="threshold",subject="executor:standin"}}' in body

        hogger.kill()
        world.hog_on.clear()
        _wait(lambda: limit("acme:3").get("rate_rps") == 100.0, 30, "p3 restored to its base")
        assert limit("acme:1")["rate_rps"] == 100.0
        kinds = [e["event"] for e in events]
        assert "qos.base" in kinds and "qos.decrease" in kinds and "qos.increase" in kinds
        decrease = next(e for e in events if e["event"] == "qos.decrease")
        assert decrease["key"] == "acme:3" and decrease["cause"] == "cpu_runqueue"
        assert ctl.main(["--redis-url", redis_url, "base", "clear", "acme:3"]) == 0
        _wait(lambda: r.hget(keys.qos_limits_key(), "acme:3") is None, 10, "qos to drop a withdrawn base")
    except AssertionError as exc:
        log.flush()
        tail = "\n".join((tmp_path / "qos.log").read_text().splitlines()[-25:])
        records = {k: r.hgetall(k) for k in r.keys(keys.svc_pattern("qos"))}
        raise AssertionError(f"{exc}\nqos record: {records}\n--- qos log (last 25 lines) ---\n{tail}") from (
            exc
        )
    finally:
        world.stop.set()
        world.join(5)
        qos.terminate()
        try:
            qos.wait(10)
        except subprocess.TimeoutExpired:
            qos.kill()
        log.close()
    assert qos.returncode == 0, (tmp_path / "qos.log").read_text()[-3000:]
