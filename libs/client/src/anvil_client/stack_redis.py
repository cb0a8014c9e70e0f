"""The running stack's Redis for CLI commands and tools: its URL and its credentials.

URL: the command's ``--redis-url``, else ANVIL_REDIS_URL, else the one in `anvil up`'s state file,
else redis://127.0.0.1:6379/0. Password: ANVIL_REDIS_PASSWORD or ANVIL_SECRETS_DIR's file, else,
when the URL is the state file's, the running stack's secrets directory (never sent to a Redis the
stack did not start). Nothing here prints or logs a password.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import redis
import redis.asyncio as aioredis

from anvil_core.redis_conn import RedisAuth, async_redis, env_redis_auth, load_redis_auth, sync_redis

__all__ = ["open_redis", "open_redis_async", "redis_target", "stack_state"]

DEFAULT_URL = "redis://127.0.0.1:6379/0"


def stack_state(env: Mapping[str, str] = os.environ) -> dict[str, Any] | None:
    """`anvil up`'s state file (current.json), or None when no stack runs here."""
    from anvil_client.launcher import run_root

    try:
        doc = json.loads((run_root(env) / "current.json").read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def redis_target(url: str | None = None, env: Mapping[str, str] = os.environ) -> tuple[str, RedisAuth]:
    state = stack_state(env) or {}
    url = url or env.get("ANVIL_REDIS_URL") or state.get("redis_url") or DEFAULT_URL
    auth = env_redis_auth(env)
    if auth.password is None and state.get("secrets_dir") and url == state.get("redis_url"):
        auth = load_redis_auth(secrets_dir=str(state["secrets_dir"]), username=auth.username or "")
    return str(url), auth


def open_redis(url: str | None = None, env: Mapping[str, str] = os.environ, **kwargs: Any) -> redis.Redis:
    target, auth = redis_target(url, env)
    return sync_redis(target, auth, **kwargs)


def open_redis_async(
    url: str | None = None, env: Mapping[str, str] = os.environ, **kwargs: Any
) -> aioredis.Redis:
    target, auth = redis_target(url, env)
    return async_redis(target, auth, **kwargs)
