"""Loading bcc programs on this kernel: finding bcc, its kernel headers, and saying why it cannot work.

bcc compiles each program's C text with clang at load time, against kernel headers. This machine's
kernel has none of its own, so `.ci/prepare_ebpf.sh` merges Debian's nearest headers and writes their
path to `/var/tmp/anvil-bcc-kernel-source`; `BCC_KERNEL_SOURCE` (bcc's own variable) wins when set.
Those headers are for another kernel version, so programs here read tracepoint arguments and BPF
helpers only — never kernel structs, whose offsets differ (docs/qos.md, "Why no structs").
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = ["BpfUnavailable", "compile_program", "import_bcc", "kernel_source", "unavailable_reason"]

# Debian's python3-bpfcc installs here, outside any venv; it is pure Python over libbcc (ctypes), so it
# imports in any CPython 3.x that can load libbcc.so.0.
BCC_DIST_PACKAGES = "/usr/lib/python3/dist-packages"
SOURCE_FILE = Path("/var/tmp/anvil-bcc-kernel-source")
# bcc reads tracepoint formats from debugfs's view of tracefs, not /sys/kernel/tracing.
BCC_TRACING = Path("/sys/kernel/debug/tracing/events")


class BpfUnavailable(RuntimeError):
    """eBPF cannot be used here; str(exc) says why in one line, fit for a log and a status field."""


def import_bcc() -> ModuleType:
    """bcc's Python module, from the environment or Debian's dist-packages (appended, so the venv's
    own packages still win)."""
    try:
        import bcc
    except ImportError:
        if BCC_DIST_PACKAGES not in sys.path:
            sys.path.append(BCC_DIST_PACKAGES)
        try:
            import bcc
        except (ImportError, OSError) as exc:
            raise BpfUnavailable(
                f"bcc is not installed (apt-get install python3-bpfcc bpfcc-tools): {exc}"
            ) from exc
    return bcc


def kernel_source() -> str | None:
    """The kernel header tree bcc will use (and exports it as BCC_KERNEL_SOURCE), or None when only
    the running kernel's own /lib/modules/<release>/build would do and it exists."""
    explicit = os.environ.get("BCC_KERNEL_SOURCE")
    if explicit:
        if not Path(explicit, "include").is_dir():
            raise BpfUnavailable(f"BCC_KERNEL_SOURCE={explicit} has no include/ (kernel headers)")
        return explicit
    if Path(f"/lib/modules/{os.uname().release}/build/include").is_dir():
        return None
    try:
        path = SOURCE_FILE.read_text().strip()
    except OSError:
        path = ""
    if path and Path(path, "include").is_dir():
        os.environ["BCC_KERNEL_SOURCE"] = path
        return path
    raise BpfUnavailable(
        f"no kernel headers for {os.uname().release}: run .ci/prepare_ebpf.sh "
        f"(it writes {SOURCE_FILE}) or set BCC_KERNEL_SOURCE"
    )


def unavailable_reason() -> str:
    """Empty when eBPF programs can be loaded here, else every reason why not, joined by '; '.

    Cheap checks only (no compile); `compile_program` can still fail, with its own reason."""
    missing = []
    if os.geteuid() != 0:
        missing.append("not root (loading eBPF needs CAP_BPF/CAP_SYS_ADMIN and CAP_PERFMON)")
    if not BCC_TRACING.is_dir():
        missing.append(
            "tracefs is not reachable at /sys/kernel/debug/tracing "
            "(mount -t debugfs nodev /sys/kernel/debug; mount -t tracefs nodev /sys/kernel/tracing)"
        )
    for check in (import_bcc, kernel_source):
        try:
            check()
        except BpfUnavailable as exc:
            missing.append(str(exc))
    return "; ".join(missing)


def compile_program(text: str, cflags: Sequence[str] = ()) -> Any:
    """Compile and load `text` with bcc; returns the `bcc.BPF` object (its probes are attached by the
    caller, which owns it and must call `.cleanup()`). Compile errors become BpfUnavailable carrying
    clang's first error line, which bcc would otherwise print only to stderr."""
    bcc = import_bcc()
    kernel_source()
    error: Exception | None = None
    with _captured_stderr() as lines:
        try:
            return bcc.BPF(text=text.encode(), cflags=list(cflags))
        except Exception as exc:
            error = exc
    errors = [ln.strip() for ln in lines if "error" in ln][:3] or str(error).splitlines()[:1]
    raise BpfUnavailable(f"bcc could not compile or load a probe: {' | '.join(errors)}") from error


@contextlib.contextmanager
def _captured_stderr() -> Iterator[list[str]]:
    """Collect what the C++ side of bcc writes to fd 2 during a compile (the list fills on exit)."""
    lines: list[str] = []
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(tmp.fileno(), 2)
        try:
            yield lines
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            lines.extend(tmp.read().decode(errors="replace").splitlines())
