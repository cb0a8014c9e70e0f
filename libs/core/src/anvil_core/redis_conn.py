"""Every Redis client of Anvil is made here, with the stack's credentials (issue #18).

Compose and `anvil up` give each service its own Redis user (``anvil_core.redis_acl``): a service
of role R authenticates as user R with the password in ``R.redis_password`` of its secrets directory
(``ANVIL_SECRETS_DIR``). Without that file (an external Redis), ``ANVIL_REDIS_PASSWORD`` (with
``ANVIL_REDIS_USERNAME``) or the directory's ``redis_password`` file (the default user, which is
also the operator's: the CLI) is used, and a password in the URL itself works too. The password
is held in a field that no repr, log line or error message shows; log a URL only through
``redact_url``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
import redis.asyncio as aioredis

from anvil_core import redis_acl

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
    password: str | None = None, secrets_dir: str | Path = "", username: str = "", role: str = ""
) -> RedisAuth:
    """`password` (with `username`) if given; else `role`'s own user and password file in the
    secrets directory when there is one; else the directory's redis_password file; else none."""
    if password or not str(secrets_dir):
        return RedisAuth(username or None, password or None)
    if role:
        own = _read_secret(Path(secrets_dir) / redis_acl.password_file(role))
        if own:
            return RedisAuth(redis_acl.user_of(role), own)
    return RedisAuth(username or None, _read_secret(Path(secrets_dir) / REDIS_PASSWORD_FILE))


def _read_secret(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except FileNotFoundError:
        return None
    except OSError as exc:  # present but unreadable: say which file, never its content
        raise PermissionError(f"cannot read the Redis password file {path}: {exc.strerror}") from None


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
