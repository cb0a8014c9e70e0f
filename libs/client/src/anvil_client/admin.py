"""`anvil qos ...`, `anvil tenant ...` and `anvil keys ...`: operator commands that write Anvil's Redis
keys."""

from __future__ import annotations

import argparse
import hashlib
import json
import secrets
import sys
import time
from typing import Any

import redis

from anvil_client.stack_redis import open_redis
from anvil_core import keys
from anvil_core.priorities import PRIORITIES

__all__ = ["add_admin_commands"]


def _redis(args: argparse.Namespace) -> redis.Redis:
    return open_redis(args.redis_url, decode_responses=True, socket_timeout=2, socket_connect_timeout=2)


def _guard(fn: Any) -> Any:
    def run(args: argparse.Namespace) -> int:
        try:
            return int(fn(args))
        except redis.RedisError as exc:
            print(f"anvil: registry unreachable: {exc}", file=sys.stderr)
            return 1

    return run


def qos_set(args: argparse.Namespace) -> int:
    if args.rate < 0 or (args.burst is not None and args.burst < 1):
        print("anvil: rate must be >= 0 req/s and burst >= 1", file=sys.stderr)
        return 2
    if args.tenant != "*":
        try:
            keys.check_tenant(args.tenant)
        except ValueError as exc:
            print(f"anvil: {exc}", file=sys.stderr)
            return 2
    field = f"{args.tenant}:{args.priority}"
    doc = {
        "rate_rps": args.rate,
        "burst": args.burst or max(1, int(args.rate)),
        "reason": "operator",
        "ts": time.time(),
    }
    _redis(args).hset(keys.qos_limits_key(), field, json.dumps(doc))
    print(f"{field}: {doc['rate_rps']:g} req/s, burst {doc['burst']}")
    return 0


def qos_clear(args: argparse.Namespace) -> int:
    r = _redis(args)
    if args.field:
        r.hdel(keys.qos_limits_key(), args.field)
    else:
        r.delete(keys.qos_limits_key())
    print("cleared")
    return 0


def qos_show(args: argparse.Namespace) -> int:
    r = _redis(args)
    limits = {str(k): str(v) for k, v in r.hgetall(keys.qos_limits_key()).items()}
    if not limits:
        print("no limits (every tenant unlimited)")
    for field, raw in sorted(limits.items()):
        print(f"{field:<24} {raw}")
    for key in sorted(r.scan_iter(keys.svc_pattern("qos"))):
        print("\n".join(_qos_record_lines(str(key), {str(k): str(v) for k, v in r.hgetall(key).items()})))
    return 0


def _qos_record_lines(key: str, rec: dict[str, str]) -> list[str]:
    """A qos registry record for people: its mode and the baselines it learned on its host."""
    out = [f"{key}: mode={rec.get('mode', '?')}" + (f" ({rec['reason']})" if rec.get("reason") else "")]
    try:
        baselines: dict[str, dict[str, Any]] = json.loads(rec.get("baselines") or "{}")
    except ValueError:
        baselines = {}
    if not baselines:
        out.append("  no baselines learned yet")
    for what, b in sorted(baselines.items()):
        state = "learned" if b.get("ready") else "learning (ceiling acts)"
        out.append(
            f"  {what:<36} calm median {b.get('median')} mad {b.get('mad')} -> threshold "
            f"{b.get('threshold')} [{b.get('samples')} calm ticks, {state}]"
        )
    return out


def tenant_add(args: argparse.Namespace) -> int:
    try:
        keys.check_tenant(args.name)
    except ValueError as exc:
        print(f"anvil: {exc}", file=sys.stderr)
        return 2
    key = "anv_" + secrets.token_urlsafe(24)
    _redis(args).hset(keys.tenants_key(), hashlib.sha256(key.encode()).hexdigest(), args.name)
    print(f"tenant {args.name!r} added; its API key (shown once, stored hashed):\n{key}")
    return 0


def tenant_revoke(args: argparse.Namespace) -> int:
    """Remove API keys: the one given (--key), or every key of the tenant. Gateways drop them at their
    next registry refresh (admission reloads tenants every few seconds)."""
    r = _redis(args)
    table = {str(h): str(t) for h, t in r.hgetall(keys.tenants_key()).items()}
    if args.key:
        h = hashlib.sha256(args.key.encode()).hexdigest()
        doomed = [h] if table.get(h) == args.name else []
    else:
        doomed = [h for h, t in table.items() if t == args.name]
    if not doomed:
        print(f"anvil: no such key for tenant {args.name!r}", file=sys.stderr)
        return 1
    r.hdel(keys.tenants_key(), *doomed)
    print(f"revoked {len(doomed)} key(s) of tenant {args.name!r}")
    return 0


def keys_revoke(args: argparse.Namespace) -> int:
    """Remove one API key, whoever's it is (the key as printed by `tenant add`; only its hash is
    stored, so the key itself is what names it). Gateways and the compiler refuse it at their next
    registry refresh (a few seconds)."""
    h = hashlib.sha256(args.key.encode()).hexdigest()
    r = _redis(args)
    tenant = r.hget(keys.tenants_key(), h)
    if tenant is None or not r.hdel(keys.tenants_key(), h):
        print("anvil: no such API key", file=sys.stderr)
        return 1
    print(f"revoked one API key of tenant {tenant!r}")
    return 0


def tenant_list(args: argparse.Namespace) -> int:
    names = sorted({str(v) for v in _redis(args).hgetall(keys.tenants_key()).values()})
    print("\n".join(names) if names else "no tenants")
    return 0


def add_admin_commands(sub: Any) -> None:
    qos = sub.add_parser("qos", help="per-tenant rate limits (anvil:qos:limits)")
    qos.add_argument("--redis-url", default=None)
    qsub = qos.add_subparsers(dest="qos_cmd", required=True)
    s = qsub.add_parser("set", help="set TENANT (or *) PRIORITY (1-3 or *) to RATE req/s")
    s.add_argument("tenant")
    s.add_argument("priority", choices=[*map(str, PRIORITIES), "*"])
    s.add_argument("rate", type=float, help="requests per second")
    s.add_argument("--burst", type=int, default=None, help="bucket size (default: rate, at least 1)")
    s.set_defaults(fn=_guard(qos_set))
    c = qsub.add_parser("clear", help="remove one limit (tenant:priority) or all")
    c.add_argument("field", nargs="?")
    c.set_defaults(fn=_guard(qos_clear))
    qsub.add_parser("show", help="list limits and what each qos learned (mode, baselines)").set_defaults(
        fn=_guard(qos_show)
    )

    ten = sub.add_parser("tenant", help="tenants and API keys (anvil:tenants)")
    ten.add_argument("--redis-url", default=None)
    tsub = ten.add_subparsers(dest="tenant_cmd", required=True)
    a = tsub.add_parser("add", help="add a tenant; prints its new API key once")
    a.add_argument("name")
    a.set_defaults(fn=_guard(tenant_add))
    rv = tsub.add_parser("revoke", help="remove the tenant's API keys (all, or the one given by --key)")
    rv.add_argument("name")
    rv.add_argument("--key", default=None, help="revoke only this key (as printed by `tenant add`)")
    rv.set_defaults(fn=_guard(tenant_revoke))
    tsub.add_parser("list", help="list tenant names").set_defaults(fn=_guard(tenant_list))

    ks = sub.add_parser("keys", help="API keys (anvil:tenants)")
    ks.add_argument("--redis-url", default=None)
    ksub = ks.add_subparsers(dest="keys_cmd", required=True)
    kr = ksub.add_parser("revoke", help="revoke one API key, whichever tenant holds it")
    kr.add_argument("key", help="the key as printed by `anvil tenant add`")
    kr.set_defaults(fn=_guard(keys_revoke))
