"""Built-ins the executor serves as compiled artifacts: it runs the compiler's offline entry point
(``python -m anvil_compiler.offline``, a process of its own: services run each other, they never
import each other) on a model source, and loads the artifact like a deployed one.

The artifact lands in the executor's built-in artifact directory under the compiler's content
address (model bytes, format, options, compiler version), so a restart or a second executor on the
same volume finds it and compiles nothing; each compile stage is logged as it happens.

Sources: ``minilm`` compiles its pip package's HF directory (models/minilm.py); on a GPU the seeded
``mlp`` and ``mlp4x1024`` compile an ONNX file written here from their recipes (models/gpu_builtins.py).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from anvil_core.logs import get_logger

__all__ = ["COMPILE_TIMEOUT_S", "BuiltinUnavailable", "compile_builtin"]

log = get_logger("anvil.executor.builtin")

COMPILE_TIMEOUT_S = 600


class BuiltinUnavailable(RuntimeError):
    """A built-in cannot be loaded here (package or compiler absent, compile failed); says why."""


def compile_builtin(
    source: tuple[str, Path], artifact_root: Path, name: str, options: dict[str, Any], build_kernels: bool
) -> Path:
    """The artifact directory of ``source`` (``("hf", dir)`` or ``("onnx", file)``), compiled by the
    compiler's offline entry point when not cached (progress logged per stage); BuiltinUnavailable
    when it cannot be made here."""
    fmt, path = source
    if fmt not in ("hf", "onnx"):
        raise ValueError(f"a built-in's source is 'hf' or 'onnx', got {fmt!r}")
    if importlib.util.find_spec("anvil_compiler") is None:
        raise BuiltinUnavailable("the compiler (anvil-compiler) is not installed next to this executor")
    cmd = [
        sys.executable, "-m", "anvil_compiler.offline", f"--{fmt}", str(path),
        "--out-root", str(artifact_root), "--name", name, "--options", json.dumps(options),
        *([] if build_kernels else ["--no-build"]),
    ]  # fmt: skip
    last: dict[str, Any] = {}
    with tempfile.TemporaryFile("w+") as errs:  # a file, not a pipe: a chatty stderr cannot block it
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=errs, text=True)
        assert proc.stdout is not None
        for line in proc.stdout:  # one JSON object a line (anvil_compiler.offline)
            try:
                last = json.loads(line)
            except ValueError:
                continue
            if "stage" in last:
                log.info("compiling built-in model", extra={"model": name, **last})
        try:
            proc.wait(timeout=COMPILE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise BuiltinUnavailable(f"compiling {name} took over {COMPILE_TIMEOUT_S} s") from None
        errs.seek(0)
        tail = errs.read().strip().splitlines()[-1:]
    if proc.returncode != 0 or "path" not in last:
        why = last.get("error") or (tail[0] if tail else f"exit {proc.returncode}")
        raise BuiltinUnavailable(f"compiling {name} failed: {why}")
    log.info(
        "built-in model artifact",
        extra={"model": name, "artifact": last["artifact"], "cached": last["cached"],
               "compile_s": last["compile_s"]},
    )  # fmt: skip
    return Path(last["path"])
