"""One Redis ACL user per service, with only the commands and keys it needs (issue #18).

The key patterns come from ``anvil_core.keys`` (the one definition of every key), so a new key
cannot be used by a service until its role here says so. A selector ``%R~`` grants reads only,
``~`` reads and writes (Redis >= 7.0 / Valkey: the embedded server and compose's image).

- gateway: writes its registry entry, its statistics share, ZeroCopy regions (`shm`) and unload
  marks (`unloaded`: the repository API's unload/load); reads the registry, deployments (`model`,
  `versions`), the executors' advertisements (`served`), limits and tenants (API keys).
- scheduler: writes its registry entry, `slo` and `profile`; reads the registry and unload marks.
- executor: writes its registry entry and its advertisement (`served`: what it serves, warm);
  reads the registry, deployments (`model`), unload marks and regions (`shm`).
- compiler: writes its registry entry and `artifact` (manifests, locks); reads the registry and
  tenants (API keys, with ANVIL_REQUIRE_API_KEY).
- qos: writes its registry entry and `qos:limits`; reads the registry, `slo` and `qos:base`.
- admin (the CLI: deploy, tenants, qos, status): every `anvil:` key; the only writer of deployments
  (`model`, `versions`).

Every role may publish on ``anvil:events`` (and subscribe: `anvil deploy --wait`); none may run
administrative or dangerous commands (CONFIG, FLUSHALL, KEYS, ACL, DEBUG, ...). The `admin` role is
the server's ``default`` user, so the operator's tools authenticate with a password alone.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from anvil_core import keys

__all__ = ["ADMIN", "ROLES", "SERVICE_ROLES", "acl_file", "password_file", "role_rules", "user_of"]

ADMIN = "admin"
SERVICE_ROLES: tuple[str, ...] = ("gateway", "scheduler", "executor", "compiler", "qos")
ROLES: tuple[str, ...] = (*SERVICE_ROLES, ADMIN)

# What every client does on connect (redis-py: AUTH, CLIENT SETINFO, SELECT) and in a pipeline.
_CONNECTION: tuple[str, ...] = ("auth", "hello", "ping", "echo", "select", "quit", "reset")
_CONNECTION += ("client|setinfo", "client|setname", "client|getname", "client|id", "multi", "exec", "discard")
_REGISTRY = ("hset", "hgetall", "pexpire", "del", "scan", "publish")  # Registry.beat/stop/services

_COMMANDS: Mapping[str, tuple[str, ...]] = {
    "gateway": ("hget", "hmget", "hexists", "set", "get"),  # set/get: its statistics share (gwstats)
    "scheduler": ("hget", "hmget"),
    "executor": ("hget", "hmget", "exists"),
    "compiler": ("hget", "hexists", "set", "get", "exists"),
    "qos": ("hget", "hdel"),
}


def _own(role: str) -> str:
    return keys.svc_key(role, "*")


def _keys(role: str) -> tuple[str, ...]:
    """Key selectors of `role`: ``~p`` read and write, ``%R~p`` read only."""
    read = f"%R~{keys.svc_pattern('*')}"  # every service may find the others
    if role == "gateway":
        return (
            f"~{_own(role)}",
            read,
            f"~{keys.gateway_stats_pattern()}",  # each process's statistics share, the others' read
            f"~{keys.shm_key('*')}",
            f"~{keys.model_unloaded_key('*')}",  # the repository API's unload/load
            f"%R~{keys.model_key('*')}",
            f"%R~{keys.model_versions_key('*')}",
            f"%R~{keys.served_key('*')}",
            f"%R~{keys.qos_limits_key()}",
            f"%R~{keys.tenants_key()}",
        )
    if role == "scheduler":
        return (
            f"~{_own(role)}",
            read,
            f"~{keys.slo_key()}",
            f"~{keys.profile_key('*', '*')}",
            f"%R~{keys.model_unloaded_key('*')}",
        )
    if role == "executor":
        return (
            f"~{_own(role)}",
            read,
            f"~{keys.served_key('*')}",  # its advertisement (anvil:served:{its id})
            f"%R~{keys.model_key('*')}",
            f"%R~{keys.model_unloaded_key('*')}",
            f"%R~{keys.shm_key('*')}",
        )
    if role == "compiler":
        return (f"~{_own(role)}", read, f"~{keys.artifact_key('*')}", f"%R~{keys.tenants_key()}")
    if role == "qos":
        return (
            f"~{_own(role)}",
            read,
            f"~{keys.qos_limits_key()}",
            f"%R~{keys.qos_base_key()}",
            f"%R~{keys.slo_key()}",
        )
    raise ValueError(f"unknown Redis role {role!r}; roles: {', '.join(ROLES)}")


def role_rules(role: str) -> str:
    """The ACL rules of `role` (after ``user NAME on #HASH``)."""
    if role == ADMIN:
        # the operator: every anvil key and command but the server's own administration
        return f"resetkeys ~{keys.PREFIX}* resetchannels &{keys.PREFIX}* -@all +@all -@admin -@dangerous"
    commands = " ".join(f"+{c}" for c in (*_CONNECTION, *_REGISTRY, *_COMMANDS[role]))
    return f"resetkeys {' '.join(_keys(role))} resetchannels &{keys.EVENTS} -@all {commands}"


def user_of(role: str) -> str:
    """The Redis user name of `role` (the admin is the server's default user)."""
    return "default" if role == ADMIN else role


def password_file(role: str) -> str:
    """The file in a secrets directory that holds `role`'s password (the admin's is
    ``redis_password``, the default user's, as without per-service users)."""
    return "redis_password" if role == ADMIN else f"{role}.redis_password"


def acl_file(passwords: Mapping[str, str]) -> str:
    """An ACL file for the server: one line per role in `passwords` (role -> password), each with
    its password's SHA-256 only. Roles left out get no user; without ``admin`` the default user is
    off."""
    lines = []
    if ADMIN not in passwords:
        lines.append("user default off resetkeys resetchannels -@all")
    for role, password in passwords.items():
        digest = hashlib.sha256(password.encode()).hexdigest()
        lines.append(f"user {user_of(role)} on #{digest} {role_rules(role)}")
    return "\n".join(lines) + "\n"
