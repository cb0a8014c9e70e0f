"""The compile worker: runs one compile in its own process, so a model that crashes the compiler
(or hangs it past the job timeout) takes down only this process, never the service.

Messages to the parent over a one-way Pipe: ``("progress", stage, percent)``, then exactly one of
``("done", manifest)`` or ``("error", message, stage, detail)``. A process that exits without
either is a crashed worker: the job fails with its exit code.
"""

from __future__ import annotations

import traceback
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

__all__ = ["worker_main"]


def worker_main(
    conn: Connection,
    fmt: str,
    model_path: str,
    name: str,
    opts: dict[str, Any],
    out_dir: str,
    key: str,
    calibration_path: str = "",
) -> None:
    from anvil_compiler.errors import CompileError
    from anvil_compiler.options import CompileOptions
    from anvil_compiler.pipeline import compile_model

    def progress(stage: str, percent: float) -> None:
        conn.send(("progress", stage, percent))

    try:
        data = Path(model_path).read_bytes()
        calibration = Path(calibration_path).read_bytes() if calibration_path else b""
        manifest = compile_model(
            fmt,
            data,
            name,
            CompileOptions.from_dict(opts),
            Path(out_dir),
            key,
            progress,
            calibration=calibration,
        )
        conn.send(("done", manifest))
    except CompileError as exc:
        conn.send(("error", str(exc), exc.stage, exc.detail))
    except Exception as exc:  # a compiler bug: report it as a failed job with the traceback
        conn.send(
            (
                "error",
                f"internal compiler error: {type(exc).__name__}: {exc}",
                "internal",
                traceback.format_exc(),
            )
        )
    finally:
        conn.close()
