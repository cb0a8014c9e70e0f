"""`python -m anvil_core.healthcheck PORT_VARIABLE PATH`: the services' container healthcheck.

Exit 0 when http://127.0.0.1:$PORT_VARIABLE/PATH answers 2xx within 2 s, else 1 with the reason on
stderr. compose.yaml's healthchecks call this instead of `python -c "<code>"` because no argument
may hold whitespace: podman 4's Docker API splits healthcheck arguments at whitespace (a
`python -c "import urllib..."` check arrives as `python -c import` and never passes).
"""

from __future__ import annotations

import os
import sys
import urllib.request
from collections.abc import Sequence

__all__ = ["check", "main"]


def check(port_variable: str, path: str, env: dict[str, str] | None = None, timeout_s: float = 2.0) -> str:
    """"" when the endpoint answers 2xx, else why not."""
    port = (os.environ if env is None else env).get(port_variable, "")
    if not port.isdigit():
        return f"${port_variable} is {port!r}, not a port number"
    url = f"http://127.0.0.1:{port}/{path.lstrip('/')}"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            status = int(response.status)
    except OSError as exc:  # refused, timed out, or an HTTP error status (HTTPError)
        return f"{url}: {exc}"
    return "" if 200 <= status < 300 else f"{url}: HTTP {status}"


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2:
        print("usage: python -m anvil_core.healthcheck PORT_VARIABLE PATH", file=sys.stderr)
        return 2
    reason = check(*args)
    if reason:
        print(reason, file=sys.stderr)
    return 1 if reason else 0


if __name__ == "__main__":
    sys.exit(main())
