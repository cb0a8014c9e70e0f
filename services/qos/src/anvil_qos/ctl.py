"""Operators' base rates: `python -m anvil_qos.ctl base {set,clear,show}` (anvil:qos:base).

    python -m anvil_qos.ctl base set acme 3 200 --burst 40   # acme's batch traffic: 200 req/s
    python -m anvil_qos.ctl base show                         # bases, and what qos enforces now
    python -m anvil_qos.ctl base clear acme:3                 # qos stops governing it

A base is the rate a tenant/priority gets while the system is healthy; qos copies it into
`anvil:qos:limits` and lowers it under pressure (docs/qos.md). Limits set directly in
`anvil:qos:limits` (`anvil qos set`) for fields without a base are never touched by qos.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import redis

from anvil_core import keys
from anvil_core.priorities import PRIORITIES
from anvil_core.redis_conn import env_redis_auth, sync_redis
from anvil_qos.rates import BASE_KEY, parse_bases, parse_key

__all__ = ["main"]


def _redis(url: str | None) -> redis.Redis:
    url = url or os.environ.get("ANVIL_REDIS_URL") or "redis://127.0.0.1:6379/0"
    return sync_redis(
        url, env_redis_auth(), decode_responses=True, socket_timeout=2, socket_connect_timeout=2
    )


def _set(r: redis.Redis, args: argparse.Namespace) -> int:
    field = f"{args.tenant}:{args.priority}"
    doc = {"rate_rps": args.rate, "burst": args.burst or max(1, round(args.rate))}
    _, errors = parse_bases({field: doc})
    if errors:
        print(f"anvil_qos: {errors[0]}", file=sys.stderr)
        return 2
    r.hset(BASE_KEY, field, json.dumps(doc))
    print(f"base {field}: {args.rate:g} req/s, burst {doc['burst']}")
    return 0


def _clear(r: redis.Redis, args: argparse.Namespace) -> int:
    if args.field:
        parse_key(args.field)
        r.hdel(BASE_KEY, args.field)
    else:
        r.delete(BASE_KEY)
    print("cleared")
    return 0


def _show(r: redis.Redis, _: argparse.Namespace) -> int:
    bases, errors = parse_bases({str(k): v for k, v in r.hgetall(BASE_KEY).items()})
    limits = {str(k): str(v) for k, v in r.hgetall(keys.qos_limits_key()).items()}
    if not bases:
        print("no base rates (qos governs nothing)")
    for field, base in sorted(bases.items()):
        now = json.loads(limits[field]) if field in limits else {}
        print(
            f"{field:<24} base {base.rate_rps:>8g} rps  now {now.get('rate_rps', '-'):>8}  "
            f"{now.get('reason', '')}"
        )
    for line in errors:
        print(line, file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m anvil_qos.ctl", description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", default=None, help="default: $ANVIL_REDIS_URL")
    sub = parser.add_subparsers(dest="what", required=True)
    base = sub.add_parser("base", help="base rates qos governs (anvil:qos:base)")
    bsub = base.add_subparsers(dest="cmd", required=True)
    s = bsub.add_parser("set", help="TENANT PRIORITY(2, 3; 1 or * are copied, never throttled) RATE")
    s.add_argument("tenant")
    s.add_argument("priority", choices=[*map(str, PRIORITIES), "*"])
    s.add_argument("rate", type=float, help="req/s when healthy")
    s.add_argument("--burst", type=int, default=None, help="bucket size (default: the rate)")
    s.set_defaults(fn=_set)
    c = bsub.add_parser("clear", help="remove one base (tenant:priority) or all")
    c.add_argument("field", nargs="?")
    c.set_defaults(fn=_clear)
    bsub.add_parser("show", help="bases and current limits").set_defaults(fn=_show)
    args = parser.parse_args(argv)
    try:
        return int(args.fn(_redis(args.redis_url), args))
    except redis.RedisError as exc:
        print(f"anvil_qos: redis unreachable: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"anvil_qos: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
