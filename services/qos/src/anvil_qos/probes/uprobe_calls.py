"""Count calls to library functions, and time the blocking ones, in target processes (uprobes).

The machinery of the GPU probe (cuda.py), kept free of anything CUDA-specific so that it is tested on
any library: e.g. libc's `getpid` as a "launch" and `clock_nanosleep` as a "wait".

- a *counted* symbol gets a uprobe: +1 per call of a target process;
- a *timed* symbol gets a uprobe and a uretprobe: entry time per thread, and at return +1 call and
  the time spent inside, also as a log2 µs histogram.
Uprobes attach to a file (by inode), for every process that maps it; the programs keep only calls of
target processes (a BPF hash of PIDs written from user space), so services can come and go without
re-attaching. Each distinct library file (e.g. one per container image) is attached once.
"""

from __future__ import annotations

import ctypes as ct
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from anvil_qos.hist import Log2Histogram
from anvil_qos.probes.bpf_loader import BpfUnavailable, compile_program

__all__ = ["CallCounts", "UprobeCalls"]

PROGRAM = r"""
struct hist_key { u32 tgid; u32 slot; };
struct calls { u64 counted; u64 timed; u64 wait_ns; };

BPF_HASH(targets, u32, u32, 256);                      // tgid -> 1, written by user space
BPF_HASH(totals, u32, struct calls, 256);
BPF_HASH(entered_at, u32, u64, 16384);                 // tid -> ns at entry of a timed call
BPF_HASH(wait_hist, struct hist_key, u64, 256 * 40);

int on_counted(struct pt_regs *ctx) {
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (!targets.lookup(&tgid))
        return 0;
    struct calls zero = {};
    struct calls *c = totals.lookup_or_try_init(&tgid, &zero);
    if (c)
        __sync_fetch_and_add(&c->counted, 1);
    return 0;
}

int on_timed_entry(struct pt_regs *ctx) {
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32, tid = (u32)id;
    if (!targets.lookup(&tgid))
        return 0;
    u64 now = bpf_ktime_get_ns();
    entered_at.update(&tid, &now);
    return 0;
}

int on_timed_return(struct pt_regs *ctx) {
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32, tid = (u32)id;
    u64 *t0 = entered_at.lookup(&tid);
    if (!t0)
        return 0;
    u64 delta = bpf_ktime_get_ns() - *t0;
    entered_at.delete(&tid);
    struct calls zero = {};
    struct calls *c = totals.lookup_or_try_init(&tgid, &zero);
    if (c) {
        __sync_fetch_and_add(&c->timed, 1);
        __sync_fetch_and_add(&c->wait_ns, delta);
    }
    u64 us = delta / 1000;
    struct hist_key key = {.tgid = tgid, .slot = us ? bpf_log2l(us) : 0};
    wait_hist.increment(key);
    return 0;
}
"""


@dataclass(frozen=True)
class CallCounts:
    counted: int  # calls of the counted symbols
    timed: int  # returns from the timed symbols
    wait_ns: int  # time inside the timed symbols
    wait_hist: Log2Histogram  # µs per timed call


class UprobeCalls:
    """Owned by one probe (e.g. CudaProbe). Not thread-safe: one caller at a time."""

    def __init__(self, counted: Sequence[str], timed: Sequence[str]) -> None:
        self.counted, self.timed = tuple(counted), tuple(timed)
        self.bpf: Any = compile_program(PROGRAM)
        self._files: dict[tuple[int, int], list[str]] = {}  # (dev, inode) -> symbols attached
        self._pids: set[int] = set()

    def attach(self, library: str) -> list[str]:
        """Attach to every listed symbol that `library` (a path) exports; returns those attached.

        Idempotent per file; raises BpfUnavailable when the file exists but no symbol attaches."""
        st = os.stat(library)
        ident = (st.st_dev, st.st_ino)
        if ident in self._files:
            return self._files[ident]
        attached = []
        for sym in self.counted:
            if self._try(self.bpf.attach_uprobe, library, sym, "on_counted"):
                attached.append(sym)
        for sym in self.timed:
            entry = self._try(self.bpf.attach_uprobe, library, sym, "on_timed_entry")
            if entry and self._try(self.bpf.attach_uretprobe, library, sym, "on_timed_return"):
                attached.append(sym)
        if not attached:
            raise BpfUnavailable(f"none of {self.counted + self.timed} could be attached in {library}")
        self._files[ident] = attached
        return attached

    @staticmethod
    def _try(attach: Any, library: str, sym: str, fn: str) -> bool:
        try:
            attach(name=library.encode(), sym=sym.encode(), fn_name=fn.encode())
        except Exception:  # bcc raises bare Exception for a missing symbol or a failed attach
            return False
        return True

    @property
    def attached(self) -> bool:
        return bool(self._files)

    def set_pids(self, pids: Iterable[int]) -> None:
        wanted = set(pids)
        table = self.bpf["targets"]
        for pid in self._pids - wanted:
            del table[ct.c_uint32(pid)]
            try:
                del self.bpf["totals"][ct.c_uint32(pid)]
            except KeyError:
                pass
        for pid in wanted - self._pids:
            table[ct.c_uint32(pid)] = ct.c_uint32(1)
        self._pids = wanted

    def read(self) -> dict[int, CallCounts]:
        """pid -> cumulative counts, for every target pid."""
        totals = {int(k.value): v for k, v in self.bpf["totals"].items()}
        slots: dict[int, dict[int, int]] = {}
        for k, v in self.bpf["wait_hist"].items():
            slots.setdefault(int(k.tgid), {})[int(k.slot)] = int(v.value)
        out = {}
        for pid in sorted(self._pids):
            t = totals.get(pid)
            out[pid] = CallCounts(
                counted=int(t.counted) if t else 0,
                timed=int(t.timed) if t else 0,
                wait_ns=int(t.wait_ns) if t else 0,
                wait_hist=Log2Histogram(slots.get(pid, {})),
            )
        return out

    def close(self) -> None:
        self.bpf.cleanup()
