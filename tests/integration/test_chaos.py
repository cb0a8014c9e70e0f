"""Chaos under steady load: kill an executor, restart the scheduler, restart Redis, freeze the scheduler.

For every scenario, driven by the `anvil bench` engine (open loop, constant rate, one id per request):
- every request sent gets exactly one answer: a result or an explicit error with a reason (a KServe
  `{"error": ...}` body with a 4xx/5xx status), never a dropped connection or a client timeout;
- no answer carries another request's id;
- the stack returns to full health (ready, every executor connected, inference OK) without manual
  action within RECOVERY_S;
- with two executors, >= 99% of the requests sent around an executor kill succeed, and the other
  executor takes the load within TAKEOVER_S (issue #21: two CPU executors stand in for two GPUs):
  it completes a batch within TAKEOVER_S of the kill, and no request answered after the kill waited
  longer than TAKEOVER_S past the kill (the killed executor's batches are re-dispatched);
- under load on a device-bound model, batches spread across both executors (not all on one).

Short form by default (~1.5 min incl. the stack); ANVIL_CHAOS_LONG=1 runs longer load and repeats
each fault.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from anvil_client.bench.arrivals import schedule
from anvil_client.bench.engine import Engine, Progress, RunResult
from anvil_client.bench.workload import Workload
from anvil_client.embedded_redis import start_redis, users_in, wait_redis

pytestmark = [pytest.mark.integration, pytest.mark.slow]

LONG = os.environ.get("ANVIL_CHAOS_LONG") == "1"
RATE_RPS = 80.0  # steady load; well inside what two CPU executors serve on a 2-core machine
LOAD_S = 30.0 if LONG else 7.0
REPEAT = 3 if LONG else 1
FAULT_AFTER = 150  # answered requests before the fault: the load is steady by then
RECOVERY_S = 15.0  # stated bound: full health again within this long after the fault is undone
# Issue #21: the surviving executor (GPU) takes the load within this long of a kill -9. What bounds it
# is the loss detection: the killed executor's in-flight batches wait until it is declared lost,
# ANVIL_EXECUTOR_TIMEOUT_MS after its last heartbeat (1.5 s in these stacks; 3 s by default).
TAKEOVER_S = 2.0
# `busy` requests of 8 rows: 8 ms per request alone (4 ms + 0.5 ms/row, sleeping), so at RATE_RPS with
# Poisson arrivals one executor is often still busy when the next request comes (the other then
# finishes it sooner), while a lone survivor still has ~2x headroom by batching (2 requests: 12 ms).
BUSY_ROWS = 8
Waiter = Callable[..., float]


class Load:
    """Open-loop load on a thread of its own (its own event loop), so the test can inject faults."""

    def __init__(
        self, url: str, seconds: float = LOAD_S, rate: float = RATE_RPS, device_bound: bool = False
    ) -> None:
        """device_bound: BUSY_LOAD (`busy`, the device stand-in, Poisson arrivals) instead of mlp."""
        if device_bound:
            self.wl = Workload(model="busy", rows=BUSY_ROWS, width=16, priorities={3: 1.0})
            self.sched = schedule("poisson", rate, seconds, seed=21)
        else:
            self.wl = Workload(model="mlp", width=16, priorities={3: 1.0})
            self.sched = schedule("constant", rate, seconds)
        self.engine = Engine(url, self.wl, max_connections=256, request_timeout_s=15.0)
        self.progress = Progress(0, 0, 0, 0, 0, 0, 0.0)
        self.result: RunResult | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _tick(self, p: Progress) -> None:
        self.progress = p

    def _run(self) -> None:
        try:
            self.result = asyncio.run(self.engine.run_open(self.sched, self._tick))
        except BaseException as exc:  # surfaced by finish()
            self.error = exc

    def finish(self) -> RunResult:
        self.thread.join(LOAD_S + 60)
        assert not self.thread.is_alive(), "the load generator did not finish"
        if self.error:
            raise self.error
        assert self.result is not None
        return self.result


def check_exactly_once(r: RunResult, what: str) -> dict[str, int]:
    """Every request: one answer, an HTTP status, and for errors a JSON body that states a reason."""
    assert r.status.size == len(r.intended_s) > 0
    assert (r.answers == 1).all(), (
        f"{what}: {(r.answers == 0).sum()} unanswered, {(r.answers > 1).sum()} duplicated"
    )
    assert r.id_mismatches == 0, f"{what}: {r.id_mismatches} answers carried another request's id"
    silent = {i: t for i, t in r.reasons.items() if r.status[i] <= 0}
    assert not silent, (
        f"{what}: {len(silent)} requests got no HTTP answer, e.g. {next(iter(silent.values()))}"
    )
    unexplained = []
    for i, text in r.reasons.items():
        try:
            reason = json.loads(text).get("error", "")
        except ValueError:
            reason = ""
        if not reason:
            unexplained.append((int(r.status[i]), text[:100]))
    assert not unexplained, f"{what}: errors without a reason: {unexplained[:3]}"
    counts: dict[str, int] = {}
    for s in r.status.tolist():
        counts[str(s)] = counts.get(str(s), 0) + 1
    return counts


def _metric(stack: Any, service: str, name: str) -> float | None:
    port = stack.service(service)["env"]["ANVIL_METRICS_PORT"]
    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
    except httpx.HTTPError:
        return None
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


def fully_healthy(stack: Any, executors: int = 2) -> bool:
    try:
        if httpx.get(stack.url + "/v2/health/ready", timeout=2).status_code != 200:
            return False
        body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": [0.5] * 16}]}
        if httpx.post(stack.url + "/v2/models/mlp/infer", json=body, timeout=5).status_code != 200:
            return False
    except httpx.HTTPError:
        return False
    return _metric(stack, "scheduler", "anvil_scheduler_executors") == executors


def _wait_load(load: Load, waiter: Waiter, answered: int = FAULT_AFTER) -> None:
    waiter(lambda: load.progress.done >= answered, 30, f"{answered} answers before the fault", every_s=0.05)


def _logs(stack: Any, *names: str) -> str:
    out = []
    for name in names:
        text = Path(stack.service(name)["log"]).read_text(errors="replace").splitlines()
        out.append(f"--- {name} (last 15 lines)\n" + "\n".join(text[-15:]))
    return "\n".join(out)


def test_stack_starts_healthy_with_two_executors(scaled_stack: Any, waiter: Waiter) -> None:
    waiter(lambda: fully_healthy(scaled_stack), 30, "two executors and a ready stack")


def _batches(stack: Any, name: str, model: str | None = None) -> float:
    """Batches an executor ran (anvil_executor_batches_total, every outcome; of `model` if given)."""
    port = stack.service(name)["env"]["ANVIL_METRICS_PORT"]
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
    want = "" if model is None else f'model="{model}"'
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("anvil_executor_batches_total{") and want in line
    )


def test_batches_spread_across_both_executors(scaled_stack: Any, waiter: Waiter) -> None:
    """The device-bound load (BUSY_ROWS): while one executor runs a batch the other one finishes the
    next sooner, so both get batches (least predicted finish), not all on the first."""
    waiter(lambda: fully_healthy(scaled_stack), RECOVERY_S, "two executors and a ready stack")
    names = ("executor", "executor.1")
    before = {n: _batches(scaled_stack, n, "busy") for n in names}
    r = Load(scaled_stack.url, seconds=4.0, device_bound=True).finish()
    counts = check_exactly_once(r, "busy load")
    assert counts.get("200", 0) == r.status.size, counts
    ran = {n: _batches(scaled_stack, n, "busy") - before[n] for n in names}
    total = sum(ran.values())
    print(f"\nbatches per executor under the device-bound load: {ran}")
    assert total > 0 and min(ran.values()) >= 0.1 * total, f"batches per executor: {ran}"


@pytest.mark.parametrize("model", ["mlp", "busy"])
def test_kill_one_of_two_executors(scaled_stack: Any, waiter: Waiter, model: str) -> None:
    """mlp: the executors idle between tiny batches. busy (a device stand-in, batches of 4+ ms): the
    victim is killed while it holds a batch, so the kill loses work that must move to the survivor."""
    for _ in range(REPEAT):
        waiter(lambda: fully_healthy(scaled_stack), RECOVERY_S, "full health before the fault")
        load = Load(scaled_stack.url, device_bound=model == "busy")
        _wait_load(load, waiter)
        if model == "busy":
            waiter(
                lambda: (_metric(scaled_stack, "executor.1", "anvil_executor_inflight_batches") or 0) > 0,
                10,
                "a batch in flight on executor.1",
                every_s=0.005,
            )
        survivor_before = _batches(scaled_stack, "executor")
        killed_unix = time.time()
        _kill(scaled_stack, "executor.1")
        first_batch_s = waiter(
            lambda b=survivor_before: _batches(scaled_stack, "executor") > b,
            TAKEOVER_S,
            "the surviving executor's first batch after the kill",
            every_s=0.01,
        )
        r = load.finish()
        counts = check_exactly_once(r, f"executor kill ({model})")
        ok = counts.get("200", 0) / r.status.size
        assert ok >= 0.99, f"only {ok:.2%} succeeded during the executor kill: {counts}\n" + _logs(
            scaled_stack, "scheduler", "executor"
        )
        stall_s = _stall_after(r, killed_unix - r.started_unix)
        print(
            f"\nkill -9 of executor.1 under {model} load: the survivor's first batch "
            f"{first_batch_s * 1e3:.0f} ms after it (metrics polled); the longest wait past the kill "
            f"{stall_s * 1e3:.0f} ms; answers {counts}"
        )
        assert stall_s <= TAKEOVER_S, (
            f"a request answered after the kill waited {stall_s:.2f} s past it (> {TAKEOVER_S} s)\n"
            + _logs(scaled_stack, "scheduler")
        )
        scaled_stack.start_again("executor.1")
        took = waiter(lambda: fully_healthy(scaled_stack), RECOVERY_S, "two executors again")
        assert took <= RECOVERY_S


def _stall_after(r: RunResult, kill_s: float) -> float:
    """The longest a request answered after the kill (s from the run's start) waited past the later
    of the kill and its own sending: how long the load went unserved."""
    done = np.nan_to_num(r.done_s, nan=-1.0)
    after = done > kill_s
    assert after.any(), "no request was answered after the kill"
    return float((done[after] - np.maximum(r.intended_s[after], kill_s)).max())


def test_scheduler_restart(scaled_stack: Any, waiter: Waiter) -> None:
    for _ in range(REPEAT):
        waiter(lambda: fully_healthy(scaled_stack), RECOVERY_S, "full health before the fault")
        load = Load(scaled_stack.url)
        _wait_load(load, waiter)
        _kill(scaled_stack, "scheduler")
        scaled_stack.start_again("scheduler")
        r = load.finish()
        counts = check_exactly_once(r, "scheduler restart")
        assert counts.get("200", 0) > 0, counts
        waiter(lambda: fully_healthy(scaled_stack), RECOVERY_S, "full health after the scheduler restart")
        # after recovery, the load is served again in full
        after = Load(scaled_stack.url, seconds=2.0)
        tail = after.finish()
        assert check_exactly_once(tail, "after the scheduler restart").get("200", 0) == tail.status.size


def test_redis_restart(scaled_stack: Any, waiter: Waiter, tmp_path: Path) -> None:
    state = scaled_stack.state
    waiter(lambda: fully_healthy(scaled_stack), RECOVERY_S, "full health before the fault")
    redis_pid = state["redis_pid"]
    password = scaled_stack.redis_password
    procs = []
    try:
        for _ in range(REPEAT):
            load = Load(scaled_stack.url)
            _wait_load(load, waiter)
            os.kill(redis_pid, signal.SIGKILL)
            waiter(lambda: not wait_redis(scaled_stack.redis_port, 0.05, password), 5, "Redis to be gone")
            proc = start_redis(scaled_stack.redis_port, tmp_path, users=users_in(scaled_stack.secrets_dir))
            procs.append(proc)
            redis_pid = proc.pid
            assert wait_redis(scaled_stack.redis_port, 10, password)
            r = load.finish()
            counts = check_exactly_once(r, "Redis restart")
            # the request path never waits on Redis (the gateway serves from its snapshot)
            assert counts.get("200", 0) / r.status.size >= 0.99, counts
            took = waiter(
                lambda: fully_healthy(scaled_stack), RECOVERY_S, "full health after the Redis restart"
            )
            assert took <= RECOVERY_S
    finally:
        for proc in procs[:-1]:
            proc.wait(1)
        scaled_stack.extra.extend(procs[-1:])  # the live Redis is stopped with the stack


def test_scheduler_frozen_for_two_seconds(scaled_stack: Any, waiter: Waiter) -> None:
    for _ in range(REPEAT):
        waiter(lambda: fully_healthy(scaled_stack), RECOVERY_S, "full health before the fault")
        load = Load(scaled_stack.url)
        _wait_load(load, waiter)
        pid = _live_pid(scaled_stack, "scheduler")
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(2.0)  # the fault itself: two seconds frozen
        finally:
            os.kill(pid, signal.SIGCONT)
        r = load.finish()
        counts = check_exactly_once(r, "scheduler freeze")
        assert counts.get("200", 0) > 0, counts
        took = waiter(lambda: fully_healthy(scaled_stack), RECOVERY_S, "full health after the freeze")
        assert took <= RECOVERY_S


def _live_pid(stack: Any, name: str) -> int:
    """A service's pid: its replacement started by an earlier fault (same argv and env), else the
    launcher's."""
    svc = stack.service(name)
    for proc in reversed(stack.extra):
        if proc.poll() is None and list(proc.args) == list(svc["argv"]) and _env_of(proc.pid) == svc["env"]:
            return int(proc.pid)
    return int(svc["pid"])


def _env_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(kv.decode(errors="replace").split("=", 1) for kv in raw if b"=" in kv)


def _kill(stack: Any, name: str) -> None:
    os.kill(_live_pid(stack, name), signal.SIGKILL)


# ---- containers (`make test-compose`): compose restarts what was killed ---------------------------
# A killed container is back and serving within this long: the restart, the interpreter, numba and
# the built-in models' warm-up (MiniLM ~20 s on 2 vCPUs; minutes when the host runs at load 20-30).
# A bound, not a wait: the test goes on as soon as the service serves.
CONTAINER_RECOVERY_S = 300.0


def _restarted(stack: Any, service: str, before: dict[str, Any]) -> bool:
    st = stack.state(service)
    return st["started"] != before["started"] and st["status"] == "running" and st["health"] == "healthy"


def _serving(url: str) -> bool:
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": [0.5] * 16}]}
    try:
        ready = httpx.get(f"{url}/v2/health/ready", timeout=2).status_code == 200
        return ready and httpx.post(f"{url}/v2/models/mlp/infer", json=body, timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.mark.parametrize("service", ["executor", "scheduler"])
def test_container_killed_under_load_answers_each_request_once_and_restarts(
    compose_stack: Any, waiter: Waiter, service: str
) -> None:
    """SIGKILL a container under steady load: every request gets exactly one answer (a result or an
    error that says why), and `restart: unless-stopped` brings the service back to serving."""
    stack = compose_stack
    before = stack.state(service)
    load = Load(stack.url)
    waiter(lambda: load.progress.done >= FAULT_AFTER, 30, "the load to be steady")
    how = stack.kill(service)
    t0 = time.monotonic()
    during = check_exactly_once(load.finish(), f"{service} killed ({how})")
    waiter(
        lambda: _restarted(stack, service, before), CONTAINER_RECOVERY_S, f"{service} restarted and healthy"
    )
    waiter(lambda: _serving(stack.url), CONTAINER_RECOVERY_S, "the stack to serve again")
    after = stack.state(service)
    print(f"\n{service}: {how}; answers {during}; back in {time.monotonic() - t0:.1f} s, restarts "
          f"{before['restarts']} -> {after['restarts']}")  # fmt: skip
    assert after["pid"] != before["pid"]
    again = Load(stack.url, seconds=2.0).finish()
    counts = check_exactly_once(again, f"after the {service} restart")
    assert counts.get("200", 0) >= 0.95 * again.status.size, counts  # serving again, not degraded
