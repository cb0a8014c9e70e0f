"""`anvil bench`: an open-loop load generator with reports (see docs/bench.md)."""

from anvil_client.bench.cli import add_bench_command

__all__ = ["add_bench_command"]
