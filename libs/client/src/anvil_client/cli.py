"""The `anvil` command: run the stack locally and talk to it."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from anvil_client.admin import add_admin_commands
from anvil_client.bench import add_bench_command
from anvil_client.compose_secrets import add_secrets_command
from anvil_client.deploy import add_deploy_commands
from anvil_client.doctor import add_doctor_command
from anvil_client.launcher import Stack, StackError, install_signal_stop, run_root
from anvil_client.procs import running, stop_group, stop_groups
from anvil_client.stack_redis import open_redis_async, stack_state
from anvil_core import keys

__all__ = ["main"]

CURL_EXAMPLE = (
    "curl -s -X POST {url}/v2/models/mlp/infer -H 'content-type: application/json' -d "
    '\'{{"inputs":[{{"name":"INPUT0","datatype":"FP32","shape":[1,16],"data":[{data}]}}]}}\''
)


def _scale(items: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in items:
        name, _, count = item.partition("=")
        if not count.isdigit() or int(count) < 1:
            raise SystemExit(f"--scale wants SERVICE=N with N >= 1, got {item!r}")
        out[name] = int(count)
    return out


def cmd_up(args: argparse.Namespace) -> int:
    compose = Path(args.file)
    if not compose.is_file():
        print(f"anvil: {compose} not found (run from the repository root or pass -f)", file=sys.stderr)
        return 2
    profiles = set(args.profile) if args.profile else None
    stack = Stack(
        compose,
        profiles=profiles,
        scale=_scale(args.scale),
        restart=not args.no_restart and os.environ.get("ANVIL_RESTART", "1") != "0",
    )
    stop = threading.Event()
    install_signal_stop(stop)
    try:
        stack.start(timeout_s=args.timeout)
    except StackError as exc:
        print(f"anvil: {exc}", file=sys.stderr)
        return 1
    url = stack.gateway_url()
    print("anvil: ready")
    print(f"  HTTP (KServe v2)   {url}")
    grpc_target = stack.grpc_target()
    print(f"  gRPC (KServe v2)   {grpc_target or 'off (ANVIL_GRPC_PORT=0)'}")
    for proc in stack.procs:
        port = proc.env.get("ANVIL_METRICS_PORT")
        if port:
            print(f"  metrics {proc.name:<10} http://127.0.0.1:{port}/metrics")
    print(f"  logs               {stack.run_dir}")
    print("try:")
    print("  " + CURL_EXAMPLE.format(url=url, data=",".join(["0.5"] * 16)))
    print("Ctrl-C (or `anvil down`) stops everything.", flush=True)
    try:
        stack.supervise(stop)
    finally:
        stack.stop()
    return 0


def _state() -> dict[str, Any] | None:
    return stack_state(os.environ)


def cmd_demo(args: argparse.Namespace) -> int:
    from anvil_client.demo import run_demo  # httpx and numpy: only the demo needs them

    return run_demo(Path(args.file))


def cmd_down(_: argparse.Namespace) -> int:
    state = _state()
    if state is None:
        print("anvil: nothing is running (no state file)")
        return 0
    pid = int(state["launcher_pid"])
    try:
        os.kill(pid, signal.SIGTERM)  # the launcher stops its children, then Redis
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + 15
    while running(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    stop_groups([int(svc["pid"]) for svc in state.get("services", []) if svc.get("pid")], grace_s=2)
    if state.get("redis_pid"):
        stop_group(int(state["redis_pid"]), grace_s=2)
    (run_root(os.environ) / "current.json").unlink(missing_ok=True)
    print("anvil: stopped")
    return 0


def cmd_status(_: argparse.Namespace) -> int:
    async def show() -> int:
        # the stack's password, never printed (redis errors do not carry it)
        redis = open_redis_async(decode_responses=True, socket_timeout=1.0, socket_connect_timeout=1.0)
        try:
            found = sorted([k async for k in redis.scan_iter(match=keys.svc_pattern("*"), count=200)])
            if not found:
                print("no services registered")
            for key in found:
                rec = {str(k): str(v) for k, v in (await redis.hgetall(key)).items()}
                ttl = await redis.pttl(key)
                extra = {k: v for k, v in rec.items() if k not in ("kind", "id", "started_at", "beat_at")}
                print(f"{rec.get('kind', '?'):<10} {rec.get('id', '?'):<40} ttl {ttl} ms  {extra}")
            return 0
        except OSError as exc:
            print(f"anvil: registry unreachable: {exc}", file=sys.stderr)
            return 1
        finally:
            await redis.aclose()

    try:
        return asyncio.run(show())
    except Exception as exc:  # redis errors of any flavour: say so, not a traceback
        print(f"anvil: registry unreachable: {exc}", file=sys.stderr)
        return 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="anvil", description="Anvil inference server")
    sub = parser.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="run the stack of compose.yaml as local processes")
    up.add_argument("-f", "--file", default="compose.yaml")
    up.add_argument(
        "--profile", action="append", default=[], help="compose profile (default: gpu if present, else cpu)"
    )
    up.add_argument("--scale", action="append", default=[], metavar="SERVICE=N")
    up.add_argument("--no-restart", action="store_true", help="do not restart services that exit")
    up.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for health")
    up.set_defaults(fn=cmd_up)
    sub.add_parser("down", help="stop what `anvil up` started").set_defaults(fn=cmd_down)
    sub.add_parser("status", help="list registered services").set_defaults(fn=cmd_status)
    demo = sub.add_parser(
        "demo", help="start the stack, embed sentences with MiniLM, print similarities, stop"
    )
    demo.add_argument("-f", "--file", default="compose.yaml")
    demo.set_defaults(fn=cmd_demo)
    add_admin_commands(sub)
    add_deploy_commands(sub)
    add_bench_command(sub)
    add_doctor_command(sub)
    add_secrets_command(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.fn(args))


if __name__ == "__main__":
    sys.exit(main())
