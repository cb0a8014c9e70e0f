"""Run-queue delay and CPU time of target processes, from scheduler tracepoints.

A thread's run-queue delay is the time from becoming runnable — woken (`sched_wakeup`), newly created
(`sched_wakeup_new`) or preempted while still runnable (`sched_switch` with prev_state running) — to
being switched in (`sched_switch`, next_pid). The probe charges it the way /proc/<tid>/schedstat's
second field (`run_delay`) does, so the two can be checked against each other, and adds the
distribution:

- **A wait that ends on an idle CPU is not run-queue delay.** When the CPU the thread was queued on
  was idle (`sched_switch` prev_pid 0), the wait is the idle task's exit path (and, in a VM, the
  host's delay in resuming the vCPU), not time spent behind another task. The kernel charges it
  ~0: `wakeup_preempt()` marks the run-queue clock "skip update" when it reschedules the idle task,
  so `__schedule()` stamps the arrival with the enqueue clock. Measured on the Intel CI VM: 2,560
  such waits, probe 26.6 ms vs kernel 0.56 ms; on an AMD EPYC VM these exits made the probe's sum
  4.3x schedstat's and its idle p99 ~4 ms. The probe counts such a wait (a timeslice follows) in
  bucket 0 with no delay, and reports its length separately (`idle_wake_ns`, `idle_wakes`).
- **A wakeup of a thread that is on a CPU starts no wait** (it was woken between setting its sleep
  state and calling schedule(); the kernel enqueues nothing), and a thread that blocks drops any
  pending start, so a stale timestamp never reaches a later switch-in.

Only target processes are measured. The programs never read task_struct (offsets from other kernel
headers are wrong), so a thread's process is learned from BPF helpers: in `sched_switch` the current
task is prev, and `bpf_get_current_pid_tgid()` names its process; `task_newtask` (run by the parent)
adds new threads; user space seeds the threads that exist when a target is added.
"""

from __future__ import annotations

import ctypes as ct
from collections.abc import Iterable
from typing import Any

from anvil_qos.hist import Log2Histogram
from anvil_qos.probes.bpf_loader import compile_program
from anvil_qos.samples import ProcessSample
from anvil_qos.targets import Target, thread_ids

__all__ = ["RunQueueProbe"]

MAX_TARGETS = 256  # Anvil processes on one host
MAX_THREADS = 16384  # threads of those processes (LRU: exited threads age out)

PROGRAM = r"""
#define CLONE_THREAD 0x00010000
// sched_switch reports prev_state as a TASK_REPORT bit (0 = running) or TASK_REPORT_MAX (0x100) when
// preempted; both mean "still runnable", i.e. no bit of the 0xff mask.
#define TASK_REPORT_MASK 0xff

struct hist_key { u32 tgid; u32 slot; };
struct totals { u64 delay_ns; u64 waits; u64 cpu_ns; u64 idle_wake_ns; u64 idle_wakes; };

BPF_HASH(targets, u32, u32, MAX_TARGETS);                // tgid -> 1, written by user space
BPF_TABLE("lru_hash", u32, u32, owner, MAX_THREADS);     // tid -> tgid, for threads of targets
BPF_HASH(queued_at, u32, u64, MAX_THREADS);              // tid -> ns it became runnable
BPF_HASH(oncpu_at, u32, u64, MAX_THREADS);               // tid -> ns it was switched in
BPF_HASH(runq_hist, struct hist_key, u64, MAX_TARGETS * 40);
BPF_HASH(runq_totals, u32, struct totals, MAX_TARGETS);

static __always_inline u32 target_of(u32 tid) {
    u32 *tgid = owner.lookup(&tid);
    if (!tgid || !targets.lookup(tgid))
        return 0;
    return *tgid;
}

static __always_inline int mark_runnable(u32 tid) {
    if (tid == 0 || !target_of(tid) || oncpu_at.lookup(&tid))  // on a CPU: nothing is enqueued
        return 0;
    u64 now = bpf_ktime_get_ns();
    queued_at.update(&tid, &now);
    return 0;
}

TRACEPOINT_PROBE(sched, sched_wakeup) { return mark_runnable(args->pid); }
TRACEPOINT_PROBE(sched, sched_wakeup_new) { return mark_runnable(args->pid); }

TRACEPOINT_PROBE(task, task_newtask) {
    u32 tgid = bpf_get_current_pid_tgid() >> 32;  // the parent runs this tracepoint
    if (!(args->clone_flags & CLONE_THREAD) || !targets.lookup(&tgid))
        return 0;
    u32 tid = args->pid;
    owner.update(&tid, &tgid);
    return 0;
}

TRACEPOINT_PROBE(sched, sched_switch) {
    u64 now = bpf_ktime_get_ns();
    u32 prev = args->prev_pid, next = args->next_pid;
    u32 cur_tgid = bpf_get_current_pid_tgid() >> 32;  // current is still prev here
    if (prev != 0 && targets.lookup(&cur_tgid)) {
        owner.update(&prev, &cur_tgid);
        u64 *t_in = oncpu_at.lookup(&prev);
        if (t_in) {
            struct totals zero = {};
            struct totals *t = runq_totals.lookup_or_try_init(&cur_tgid, &zero);
            if (t)
                __sync_fetch_and_add(&t->cpu_ns, now - *t_in);
            oncpu_at.delete(&prev);
        }
        if ((args->prev_state & TASK_REPORT_MASK) == 0)
            queued_at.update(&prev, &now);
        else
            queued_at.delete(&prev);  // blocks: its next wait starts at its next wakeup
    }
    if (next == 0)
        return 0;
    u64 *t_q = queued_at.lookup(&next);
    u32 tgid = target_of(next);
    if (t_q) {
        u64 delta = now - *t_q;
        queued_at.delete(&next);
        if (tgid) {
            // The CPU was idle (prev is the idle task, pid 0): the wait was its exit, not a queue.
            u64 queued = prev == 0 ? 0 : delta;
            u64 us = queued / 1000;
            struct hist_key key = {.tgid = tgid, .slot = us ? bpf_log2l(us) : 0};
            runq_hist.increment(key);
            struct totals zero = {};
            struct totals *t = runq_totals.lookup_or_try_init(&tgid, &zero);
            if (t) {
                __sync_fetch_and_add(&t->delay_ns, queued);
                __sync_fetch_and_add(&t->waits, 1);
                if (prev == 0) {
                    __sync_fetch_and_add(&t->idle_wake_ns, delta);
                    __sync_fetch_and_add(&t->idle_wakes, 1);
                }
            }
        }
    }
    if (tgid)
        oncpu_at.update(&next, &now);
    return 0;
}
"""


class RunQueueProbe:
    """Owned by the eBPF observer (one per qos process). Not thread-safe: one caller at a time."""

    def __init__(self) -> None:
        self.bpf: Any = compile_program(
            PROGRAM, [f"-DMAX_TARGETS={MAX_TARGETS}", f"-DMAX_THREADS={MAX_THREADS}"]
        )
        self._targets: dict[int, Target] = {}

    def set_targets(self, targets: Iterable[Target]) -> None:
        """Follow exactly these processes from now on; newly added ones start from zero."""
        wanted = {t.pid: t for t in targets}
        table, owner = self.bpf["targets"], self.bpf["owner"]
        for pid in set(self._targets) - set(wanted):
            self._forget(pid)
        for pid in set(wanted) - set(self._targets):
            table[ct.c_uint32(pid)] = ct.c_uint32(1)
            for tid in thread_ids(pid):  # threads asleep now are known before their next wakeup
                owner[ct.c_uint32(tid)] = ct.c_uint32(pid)
        self._targets = wanted

    def _forget(self, pid: int) -> None:
        key = ct.c_uint32(pid)
        for name in ("targets", "runq_totals"):
            try:
                del self.bpf[name][key]
            except KeyError:
                pass
        hist = self.bpf["runq_hist"]
        for k in [k for k in hist if k.tgid == pid]:
            del hist[k]

    def histograms(self) -> dict[int, Log2Histogram]:
        """pid -> cumulative histogram of run-queue waits (µs)."""
        slots: dict[int, dict[int, int]] = {}
        for k, v in self.bpf["runq_hist"].items():
            slots.setdefault(int(k.tgid), {})[int(k.slot)] = int(v.value)
        return {pid: Log2Histogram(s) for pid, s in slots.items()}

    def read(self) -> list[ProcessSample]:
        totals = {int(k.value): v for k, v in self.bpf["runq_totals"].items()}
        hists = self.histograms()
        out = []
        for pid, target in sorted(self._targets.items()):
            t = totals.get(pid)
            out.append(
                ProcessSample(
                    target=target,
                    cpu_ns=int(t.cpu_ns) if t else 0,
                    runq_delay_ns=int(t.delay_ns) if t else 0,
                    runq_events=int(t.waits) if t else 0,
                    runq_hist=hists.get(pid, Log2Histogram()),
                    idle_wake_ns=int(t.idle_wake_ns) if t else 0,
                    idle_wakes=int(t.idle_wakes) if t else 0,
                )
            )
        return out

    def close(self) -> None:
        self.bpf.cleanup()
