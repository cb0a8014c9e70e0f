"""Killing and restarting services, and Redis itself, is survived without restarting the others."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from anvil_client.embedded_redis import start_redis, users_in, wait_redis

pytestmark = pytest.mark.integration

Waiter = Callable[..., float]
HEARTBEAT_TTL_S = 1.5
MARGIN_S = 1.0  # readiness asks Redis directly; the margin covers one poll and process scheduling


def _ready(url: str, path: str = "/v2/health/ready") -> bool:
    try:
        return httpx.get(url + path, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _infer_ok(url: str) -> bool:
    x = np.ones((1, 16), np.float32)
    body = {
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": x.reshape(-1).tolist()}],
        "parameters": {"priority": 3},
    }
    try:
        return httpx.post(url + "/v2/models/mlp/infer", json=body, timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_executor_kill_fails_readiness_within_the_ttl_and_restart_restores_it(
    private_stack: Any, waiter: Waiter
) -> None:
    wait_for = waiter

    stack = private_stack
    url = stack.url
    assert _ready(url)
    stack.kill("executor")
    took = wait_for(lambda: not _ready(url), HEARTBEAT_TTL_S + MARGIN_S, "readiness to fail")
    assert took <= HEARTBEAT_TTL_S + MARGIN_S
    r = httpx.get(url + "/v2/health/ready", timeout=2)
    assert r.status_code == 503 and "no executor" in r.json()["error"]
    stack.start_again("executor")
    wait_for(lambda: _ready(url), 30, "readiness to return")
    wait_for(lambda: _infer_ok(url), 30, "inference through the new executor")


def test_redis_restart_is_survived_with_no_service_restarted(
    private_stack: Any, tmp_path: Path, waiter: Waiter
) -> None:
    wait_for = waiter

    stack = private_stack
    state = stack.state
    pids = {s["name"]: s["pid"] for s in state["services"]}
    url = stack.url
    wait_for(lambda: _ready(url), 30, "a ready stack")
    os.kill(state["redis_pid"], 9)
    wait_for(lambda: not _ready(url), 10, "readiness to notice the registry is gone")
    redis_proc = start_redis(stack.redis_port, tmp_path, users=users_in(stack.secrets_dir))  # the same users
    try:
        assert wait_redis(stack.redis_port, 10, stack.redis_password)
        wait_for(lambda: _ready(url), 30, "re-registration after the Redis restart")
        wait_for(lambda: _infer_ok(url), 30, "inference after the Redis restart")
        for name, pid in pids.items():
            if name != "executor":  # the executor was replaced by the previous test
                assert _alive(pid), f"{name} was restarted"
    finally:
        redis_proc.terminate()
        redis_proc.wait(10)


def test_ctrl_c_leaves_no_process_behind(new_local_stack: Callable[[], Any]) -> None:
    local = new_local_stack()
    pids = [s["pid"] for s in local.state["services"]] + [local.state["redis_pid"]]
    assert all(_alive(p) for p in pids)
    local.stop()  # SIGINT, like Ctrl-C in a terminal
    assert local.proc.returncode == 0, "".join(local.output)  # -9: it did not stop within 30 s
    leftovers = [p for p in pids if _alive(p) and not _zombie(p)]
    assert leftovers == []
    assert any("anvil: stopped" in line for line in local.output)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return False


def test_anvil_down_stops_a_running_stack(new_local_stack: Callable[[], Any]) -> None:
    local = new_local_stack()
    pids = [s["pid"] for s in local.state["services"]]
    out = subprocess.run(
        [sys.executable, "-m", "anvil_client.cli", "down"],
        env=local.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    local.proc.wait(30)
    assert [p for p in pids if _alive(p) and not _zombie(p)] == []
