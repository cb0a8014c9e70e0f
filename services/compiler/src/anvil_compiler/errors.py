"""The one exception type of the compiler: a model it cannot compile, with the reason."""

from __future__ import annotations

__all__ = ["CompileError"]


class CompileError(ValueError):
    """A model the compiler rejects. The message names the op and node (or the file) at fault.

    ``stage`` is the pipeline stage that raised it (load, import, fuse, quantize, accuracy, plan, codegen,
    build); ``detail`` carries long diagnostics whole (e.g. nvcc's output and the source path).
    """

    def __init__(self, message: str, *, stage: str = "", detail: str = "") -> None:
        super().__init__(message)
        self.stage = stage
        self.detail = detail
