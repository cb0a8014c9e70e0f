"""Admission on the real stack: rates from Redis (set with the CLI) -> 429 + Retry-After; API keys."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.integration

BODY = {
    "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}],
    "parameters": {"priority": 3},
}


def _cli(stack: Any, *args: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "anvil_client.cli", *args],
        env=stack.env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_rate_limit_set_by_the_cli_gives_429_with_retry_after(stack: Any, waiter: Any) -> None:
    if not hasattr(stack, "env"):
        pytest.skip("needs the local stack")
    tenant_key = _cli(stack, "tenant", "add", "limited").strip().splitlines()[-1]
    headers = {"Authorization": f"Bearer {tenant_key}"}
    url = f"{stack.url}/v2/models/identity/infer"
    _cli(stack, "qos", "set", "limited", "3", "0.5", "--burst", "2")

    def limited() -> bool:  # the gateway picks limits up on its next registry refresh
        return httpx.post(url, json=BODY, headers=headers, timeout=5).status_code == 429

    try:
        waiter(limited, 10, "the limit to reach the gateway")
        r = httpx.post(url, json=BODY, headers=headers, timeout=5)
        assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1
        assert "over its rate" in r.json()["error"]
        assert httpx.post(url, json=BODY, timeout=5).status_code == 200  # the default tenant is not limited
        assert (
            httpx.post(
                url, json={**BODY, "parameters": {"priority": 1}}, headers=headers, timeout=5
            ).status_code
            == 200
        )  # nor is priority 1
    finally:
        _cli(stack, "qos", "clear")
    waiter(lambda: not limited(), 10, "the limit to be lifted")


def test_api_keys_are_enforced_when_required(strict_stack: Any) -> None:
    strict = strict_stack
    url = f"{strict.url}/v2/models/identity/infer"
    r = httpx.post(url, json=BODY, headers={"x-api-key": "nope"}, timeout=5)
    assert r.status_code == 401 and "unknown API key" in r.json()["error"]
    assert httpx.post(url, json=BODY, timeout=5).status_code == 401
    key = _cli(strict, "tenant", "add", "acme").strip().splitlines()[-1]
    ok = lambda: httpx.post(url, json=BODY, headers={"x-api-key": key}, timeout=5).status_code == 200  # noqa: E731
    from time import monotonic

    deadline = monotonic() + 10
    while not ok():  # the key reaches the gateway on its next registry refresh
        assert monotonic() < deadline, "the new tenant's key was never accepted"
