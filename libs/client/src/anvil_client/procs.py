"""Child processes of the launcher: their own session (so Ctrl-C reaches only the launcher, which
stops them all at once, then Redis) and a parent-death signal (so a killed launcher leaves no
orphans)."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

__all__ = ["running", "spawn", "stop_group", "stop_groups"]

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        except OSError:
            pass


def spawn(
    argv: Sequence[str], env: Mapping[str, str], log_path: Path, cwd: Path | None = None
) -> subprocess.Popen[bytes]:
    """Start `argv` in a new session with stdout+stderr appended to `log_path`."""
    log: IO[bytes] = open(log_path, "ab")  # noqa: SIM115  (the child keeps it open)
    try:
        return subprocess.Popen(
            list(argv),
            env=dict(env),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=cwd,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
    finally:
        log.close()


def stop_groups(pids: Sequence[int], grace_s: float = 5.0) -> None:
    """SIGTERM the process groups of `pids` (in that order, without waiting in between), then SIGKILL
    what is left of them once `grace_s` has passed: stopping N services takes one grace at most,
    not N (a service inside a long C call, a JIT compile say, handles its signal only after it)."""
    groups: dict[int, int] = {}  # pgid -> its leader's pid
    for pid in pids:
        try:
            pgid = os.getpgid(pid)
            os.killpg(pgid, signal.SIGTERM)
        except ProcessLookupError:
            continue
        groups[pgid] = pid
    deadline = time.monotonic() + grace_s
    while groups and time.monotonic() < deadline:
        for pgid, pid in list(groups.items()):
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                del groups[pgid]
                continue
            try:  # reap if it is our child, so it does not linger as a zombie
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
        if groups:
            time.sleep(0.05)
    for pgid in groups:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def stop_group(pid: int, grace_s: float = 5.0) -> None:
    """SIGTERM the process group of `pid`, then SIGKILL whatever is left after `grace_s`."""
    stop_groups([pid], grace_s)


def running(pid: int) -> bool:
    """True while `pid` exists and is not a zombie waiting for its parent to reap it."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True
