"""Server-side model paths (`POST /v1/compile` with `path`): read only from beneath `model_root`.

A path is taken relative to the root (an absolute one must lie under it), resolved (symlinks
followed: a symlink that stays inside the root, as in a Hugging Face cache snapshot, is fine), and
refused (400) if it leaves the root. The file is then opened component by component from the root's
descriptor with O_NOFOLLOW, along the resolved path: a symlink swapped in after the check makes the
open fail instead of leading out. Files over the size cap are refused (413) before being read.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from anvil_core.hf_bundle import OPTIONAL, REQUIRED, BundleError, pack_files

__all__ = ["PathRefused", "read_model"]


class PathRefused(ValueError):
    """A path the compiler will not read; `status` is the HTTP status to answer."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def read_model(root: Path, path: str, fmt: str, max_bytes: int) -> bytes:
    """The bytes of the model at `path` under `root`: an ONNX file, or an HF directory's bundle."""
    real_root = root.resolve(strict=True)
    rel = _resolve_under(real_root, real_root / path, path)  # an absolute `path` replaces the root
    target = real_root.joinpath(*rel)
    if fmt == "hf" and target.is_dir():
        files = {}
        for name in (*REQUIRED, *OPTIONAL):
            if not (target / name).exists():
                if name in REQUIRED:
                    raise PathRefused(f"path {path!r} has no {name}")
                continue
            parts = _resolve_under(real_root, target / name, f"{path}/{name}")
            files[name] = _read_beneath(real_root, parts, max_bytes)
        try:
            return pack_files(files)
        except BundleError as exc:
            raise PathRefused(str(exc)) from None
    return _read_beneath(real_root, rel, max_bytes)


def _resolve_under(real_root: Path, p: Path, shown: str) -> tuple[str, ...]:
    """The parts of `p`, symlinks resolved, relative to the root; PathRefused if it leaves it."""
    try:
        target = p.resolve(strict=True)
    except (OSError, RuntimeError):
        raise PathRefused(f"path {shown!r} does not exist under the compiler's model_root") from None
    if not target.is_relative_to(real_root):
        raise PathRefused(f"path {shown!r} is not under the compiler's model_root")
    return target.relative_to(real_root).parts


def _read_beneath(root: Path, parts: tuple[str, ...], max_bytes: int) -> bytes:
    """Open root/parts[0]/.../parts[-1] without following any symlink; a regular file only."""
    if not parts:
        raise PathRefused("the model_root itself is not a model file")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts[:-1]:
            nxt = _open_at(fd, part, os.O_RDONLY | os.O_DIRECTORY)
            os.close(fd)
            fd = nxt
        file_fd = _open_at(fd, parts[-1], os.O_RDONLY)
    finally:
        os.close(fd)
    with os.fdopen(file_fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise PathRefused(f"{'/'.join(parts)} is not a regular file")
        if st.st_size > max_bytes:
            raise PathRefused(f"{'/'.join(parts)}: {st.st_size} bytes exceeds the cap of {max_bytes}", 413)
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise PathRefused(f"{'/'.join(parts)} grew past the cap of {max_bytes} bytes", 413)
    return data


def _open_at(dir_fd: int, name: str, flags: int) -> int:
    try:
        return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError as exc:  # ELOOP: a symlink appeared on the checked path; ENOTDIR, EACCES, ...
        raise PathRefused(f"{name!r} cannot be opened beneath the model_root ({exc.strerror})") from None
