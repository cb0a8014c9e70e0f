"""Every Redis client of Anvil is made here, with the stack's credentials (issue #18).

Compose and `anvil up` give Redis a password; services read it from ``ANVIL_REDIS_PASSWORD`` or
from the ``redis_password`` file of their secrets directory (``ANVIL_SECRETS_DIR``), and a password
in the URL itself works too. The password is held in a field that no repr, log line or error
message shows; log a URL only through ``redact_url``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
import redis.asyncio as aioredis

__all__ = [
    "REDIS_PASSWORD_FILE",
    "RedisAuth",
    "async_redis",
    "env_redis_auth",
    "load_redis_auth",
    "sync_redis",
]

REDIS_PASSWORD_FILE = "redis_password"  # its name in the secrets directory


@dataclass(frozen=True)
class RedisAuth:
    """Credentials for Redis; empty ones leave the URL's own (or none) in force."""

    username: str | None = None
    password: str | None = field(default=None, repr=False)

    def kwargs(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.username:
            out["username"] = self.username
        if self.password:
            out["password"] = self.password
        return out


def load_redis_auth(
    password: str | None = None, secrets_dir: str | Path = "", username: str = ""
) -> RedisAuth:
    """`password` if given, else the secrets directory's redis_password file, else none."""
    if not password and str(secrets_dir):
        path = Path(secrets_dir) / REDIS_PASSWORD_FILE
        try:
            password = path.read_text().strip() or None
        except FileNotFoundError:
            password = None
        except OSError as exc:  # present but unreadable: say which file, never its content
            raise PermissionError(f"cannot read the Redis password file {path}: {exc.strerror}") from None
    return RedisAuth(username or None, password or None)


def env_redis_auth(env: Mapping[str, str] = os.environ) -> RedisAuth:
    """Credentials from ANVIL_REDIS_PASSWORD / ANVIL_SECRETS_DIR / ANVIL_REDIS_USERNAME (CLI, tools)."""
    return load_redis_auth(
        env.get("ANVIL_REDIS_PASSWORD"), env.get("ANVIL_SECRETS_DIR", ""), env.get("ANVIL_REDIS_USERNAME", "")
    )


def sync_redis(url: str, auth: RedisAuth | None = None, **kwargs: Any) -> redis.Redis:
    """A blocking client for `url` with `auth` (a password inside the URL takes precedence)."""
    return redis.Redis.from_url(url, **(auth or RedisAuth()).kwargs(), **kwargs)


def async_redis(url: str, auth: RedisAuth | None = None, **kwargs: Any) -> aioredis.Redis:
    """An asyncio client for `url` with `auth` (a password inside the URL takes precedence)."""
    return aioredis.Redis.from_url(url, **(auth or RedisAuth()).kwargs(), **kwargs)
