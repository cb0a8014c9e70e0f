"""Compile jobs: single-flight per artifact key, a concurrency limit, a timeout, one worker
process per compile (`worker.py`).

Job lifecycle: QUEUED -> RUNNING -> DONE | FAILED. The table is bounded: finished jobs are dropped
after `finished_ttl_s` and beyond `max_finished` (oldest first), and a submission while
`max_pending` jobs are queued or running is refused (`JobsFull`). A request whose key is already built gets a
job that is DONE at once (``cached``); one whose key is being built in this process gets the
running job; one whose key another compiler process holds the lock for waits for its result.
"""

from __future__ import annotations

import enum
import multiprocessing
import shutil
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from anvil_compiler.artifacts import artifact_key, model_digest
from anvil_compiler.cache import ArtifactCache
from anvil_compiler.options import CompileOptions
from anvil_compiler.worker import worker_main

__all__ = ["Job", "JobManager", "JobStatus", "JobsFull"]


class JobsFull(RuntimeError):
    """Too many jobs queued or running; retry later (429)."""


class JobStatus(enum.StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


@dataclass(slots=True)
class Job:
    id: str
    key: str
    name: str
    status: JobStatus = JobStatus.QUEUED
    stage: str = "queued"
    percent: float = 0.0
    cached: bool = False
    error: str = ""
    error_stage: str = ""
    detail: str = ""
    created: float = field(default_factory=time.time)
    finished: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "artifact_id": self.key,
            "name": self.name,
            "status": str(self.status),
            "stage": self.stage,
            "percent": self.percent,
            "cached": self.cached,
            "error": self.error,
            "error_stage": self.error_stage,
            "detail": self.detail,
            "elapsed_s": round((self.finished or time.time()) - self.created, 3),
        }


class JobManager:
    def __init__(
        self,
        cache: ArtifactCache,
        max_jobs: int,
        timeout_s: float,
        finished_ttl_s: float = 3600.0,
        max_finished: int = 256,
        max_pending: int = 16,
    ) -> None:
        self.cache = cache
        self.timeout_s = timeout_s
        self.finished_ttl_s = finished_ttl_s
        self.max_finished = max_finished
        self.max_pending = max_pending
        self.jobs: dict[str, Job] = {}
        self.inflight: dict[str, Job] = {}  # artifact key -> running job
        self.lock = threading.Lock()
        self.slots = threading.BoundedSemaphore(max_jobs)
        self.ctx = multiprocessing.get_context("spawn")

    def submit(self, fmt: str, data: bytes, name: str, opts: CompileOptions, calibration: bytes = b"") -> Job:
        """``calibration``: ``.npz`` inputs for the accuracy report (part of the key)."""
        key = artifact_key(model_digest(data), fmt, opts, model_digest(calibration) if calibration else "")
        with self.lock:
            if (running := self.inflight.get(key)) is not None:
                return running
            self._prune(time.time())
            if len(self.inflight) >= self.max_pending:
                raise JobsFull(
                    f"{len(self.inflight)} compile jobs queued or running (the bound); retry later"
                )
            job = Job(uuid.uuid4().hex[:16], key, name)
            self.jobs[job.id] = job
            if self.cache.lookup(key) is not None:
                self._finish(job, cached=True)
                return job
            self.inflight[key] = job
        spool = self.cache.root / ".spool" / f"{job.id}.model"
        spool.parent.mkdir(parents=True, exist_ok=True)
        spool.write_bytes(data)
        if calibration:
            spool.with_suffix(".npz").write_bytes(calibration)
        threading.Thread(
            target=self._run, args=(job, fmt, spool, opts), name=f"job-{job.id}", daemon=True
        ).start()
        return job

    def _prune(self, now: float) -> None:
        """Drop finished jobs past their TTL, then the oldest beyond `max_finished` (under the lock)."""
        finished = sorted(
            (j for j in self.jobs.values() if j.status in (JobStatus.DONE, JobStatus.FAILED)),
            key=lambda j: j.finished,
        )
        excess = len(finished) - self.max_finished + 1  # room for the job being added
        for i, j in enumerate(finished):
            if i < excess or now - j.finished > self.finished_ttl_s:
                del self.jobs[j.id]

    def _finish(self, job: Job, cached: bool = False) -> None:
        job.status, job.stage, job.percent, job.cached, job.finished = (
            JobStatus.DONE,
            "done",
            100.0,
            cached,
            time.time(),
        )

    def _fail(self, job: Job, error: str, stage: str, detail: str = "") -> None:
        job.status, job.error, job.error_stage, job.detail, job.finished = (
            JobStatus.FAILED,
            error,
            stage,
            detail,
            time.time(),
        )

    def _run(self, job: Job, fmt: str, spool: Path, opts: CompileOptions) -> None:
        try:
            with self.slots:
                deadline = time.monotonic() + self.timeout_s
                while time.monotonic() < deadline:
                    if self.cache.lookup(job.key) is not None:
                        return self._finish(job, cached=True)
                    if self.cache.try_lock(job.key, int(self.timeout_s * 1000) + 30_000):
                        try:
                            return self._compile(job, fmt, spool, opts, deadline)
                        finally:
                            self.cache.unlock(job.key)
                    job.stage = "waiting for another compiler"
                    time.sleep(0.05)
                self._fail(job, f"timed out after {self.timeout_s:.0f} s", job.stage)
        except Exception as exc:
            self._fail(job, f"internal error: {exc}", "internal")
        finally:
            spool.unlink(missing_ok=True)
            spool.with_suffix(".npz").unlink(missing_ok=True)
            with self.lock:
                self.inflight.pop(job.key, None)

    @staticmethod
    def _calibration(spool: Path) -> str:
        npz = spool.with_suffix(".npz")
        return str(npz) if npz.exists() else ""

    def _compile(self, job: Job, fmt: str, spool: Path, opts: CompileOptions, deadline: float) -> None:
        tmp = self.cache.root / f".tmp-{job.key}-{job.id}"
        job.status, job.stage = JobStatus.RUNNING, "starting"
        rx, tx = self.ctx.Pipe(duplex=False)
        proc = self.ctx.Process(
            target=worker_main,
            daemon=True,
            args=(tx, fmt, str(spool), job.name, opts.to_dict(), str(tmp), job.key, self._calibration(spool)),
        )
        proc.start()
        tx.close()
        result: tuple[Any, ...] | None = None
        try:
            while result is None:
                if time.monotonic() > deadline:
                    proc.kill()
                    return self._fail(job, f"timed out after {self.timeout_s:.0f} s", job.stage)
                if rx.poll(0.05):
                    try:
                        msg = rx.recv()
                    except EOFError:
                        break
                    if msg[0] == "progress":
                        job.stage, job.percent = msg[1], float(msg[2])
                    else:
                        result = msg
                elif not proc.is_alive() and not rx.poll(0):
                    break
            proc.join(5)
            if result is None:
                return self._fail(job, f"compile worker crashed (exit code {proc.exitcode})", job.stage)
            if result[0] == "error":
                return self._fail(job, result[1], result[2], result[3])
            final = self.cache.path(job.key)
            if final.exists():
                shutil.rmtree(tmp, ignore_errors=True)
            else:
                tmp.rename(final)
            self.cache.index(job.key, result[1])
            self._finish(job)
        finally:
            rx.close()
            if proc.is_alive():
                proc.kill()
            shutil.rmtree(tmp, ignore_errors=True)
