"""The running stack's Redis for CLI commands and tools: its URL and its credentials.

URL: the command's ``--redis-url``, else ANVIL_REDIS_URL, else the one in `anvil up`'s state file,
else redis://127.0.0.1:6379/0. Password: ANVIL_REDIS_PASSWORD or ANVIL_SECRETS_DIR's file, else,
when the URL is the state file's, the running stack's secrets directory (never sent to a Redis the
stack did not start). The compiler's API key likewise (``compiler_key``). Nothing here prints or
logs a secret.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import redis
import redis.asyncio as aioredis

from anvil_core.redis_conn import RedisAuth, async_redis, env_redis_auth, load_redis_auth, sync_redis
from anvil_core.settings import COMPILER_API_KEY_FILE

__all__ = ["compiler_key", "open_redis", "open_redis_async", "redis_target", "stack_state"]

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


def compiler_key(url: str, env: Mapping[str, str] = os.environ, env_file: str | Path = ".env") -> str:
    """The compiler API key for `url`: ANVIL_COMPILER_API_KEY; else, when `url` is the running
    `anvil up` stack's compiler, that stack's key file; else the compose env file's
    ANVIL_SECRET_COMPILER_API_KEY (`anvil secrets`); else ANVIL_API_KEY (a tenant's key, accepted
    with ANVIL_REQUIRE_API_KEY); else "". In a container of the compose stack (the `cli` service,
    the compiler's own) the key file in ANVIL_SECRETS_DIR comes right after ANVIL_COMPILER_API_KEY:
    that directory is set for this stack only, as the variable would be."""
    if env.get("ANVIL_COMPILER_API_KEY"):
        return env["ANVIL_COMPILER_API_KEY"]
    if env.get("ANVIL_SECRETS_DIR"):
        try:
            key = (Path(env["ANVIL_SECRETS_DIR"]) / COMPILER_API_KEY_FILE).read_text().strip()
        except OSError:
            key = ""
        if key:
            return key
    state = stack_state(env) or {}
    if state.get("secrets_dir") and _is_stack_compiler(url, state):
        try:
            return (Path(str(state["secrets_dir"])) / COMPILER_API_KEY_FILE).read_text().strip()
        except OSError:
            pass
    try:
        for line in Path(env_file).read_text().splitlines():
            name, _, value = line.partition("=")
            if name.strip() == "ANVIL_SECRET_COMPILER_API_KEY":
                return value.strip().strip("'\"")
    except OSError:
        pass
    return env.get("ANVIL_API_KEY", "")


def _is_stack_compiler(url: str, state: Mapping[str, Any]) -> bool:
    parsed = urlsplit(url)
    if parsed.hostname not in ("127.0.0.1", "localhost", "::1"):
        return False
    ports = {
        str(s.get("env", {}).get("ANVIL_HTTP_PORT"))
        for s in state.get("services", [])
        if isinstance(s, dict) and s.get("service") == "compiler"
    }
    return str(parsed.port or (443 if parsed.scheme == "https" else 80)) in ports
