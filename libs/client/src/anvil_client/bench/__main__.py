"""`python -m anvil_client.bench ...`: the same as `anvil bench ...`."""

from __future__ import annotations

import argparse
import sys

from anvil_client.bench.cli import add_bench_command


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="anvil")
    add_bench_command(parser.add_subparsers(dest="cmd", required=True))
    args = parser.parse_args(["bench", *(sys.argv[1:] if argv is None else argv)])
    return int(args.fn(args))


if __name__ == "__main__":
    sys.exit(main())
