"""The upload format of a Hugging Face checkpoint directory (`anvil deploy DIR` -> compiler): one
home for the client that packs it and the compiler that reads it.

Version 2, ``ANVILHF2`` (little-endian)::

    b"ANVILHF2" | count u32 | count x (name_len u16 | name utf-8 | size u64 | bytes)

Names come from a fixed list (``REQUIRED`` then ``OPTIONAL``): the checkpoint, and what serving text
needs: the tokenizer and sentence-transformers' module/pooling configs. Nothing else of the directory
travels. Version 1 (``ANVILHF1 | len(config) u64 | config.json | model.safetensors``) is still read.
A bundle's bytes are the model's content address. ``unpack`` checks every length against the data
(a bundle arrives over HTTP: not trusted) and raises ``BundleError`` with what is wrong.
"""

from __future__ import annotations

import struct
from pathlib import Path

__all__ = [
    "MAGIC_V1",
    "MAGIC_V2",
    "OPTIONAL",
    "REQUIRED",
    "BundleError",
    "pack_dir",
    "pack_files",
    "unpack",
]

MAGIC_V1 = b"ANVILHF1"
MAGIC_V2 = b"ANVILHF2"
REQUIRED = ("config.json", "model.safetensors")
OPTIONAL = (
    "tokenizer.json",
    "modules.json",
    "1_Pooling/config.json",
    "config_sentence_transformers.json",
    "sentence_bert_config.json",
)
MAX_ASSET_BYTES = 32 << 20  # any file but the weights: a tokenizer.json is ~0.7 MB


class BundleError(ValueError):
    """Not a well-formed bundle; the message says which part."""


def pack_dir(path: Path) -> bytes:
    """The bundle of a checkpoint directory: its required files and whichever optional ones exist."""
    missing = [n for n in REQUIRED if not (path / n).is_file()]
    if missing:
        raise BundleError(f"{path} must contain {' and '.join(REQUIRED)} (missing {', '.join(missing)})")
    names = [*REQUIRED, *(n for n in OPTIONAL if (path / n).is_file())]
    return pack_files({name: (path / name).read_bytes() for name in names})


def pack_files(files: dict[str, bytes]) -> bytes:
    """The bundle of checkpoint files already read (names from REQUIRED and OPTIONAL)."""
    missing = [n for n in REQUIRED if n not in files]
    if missing:
        raise BundleError(f"a bundle needs {' and '.join(REQUIRED)} (missing {', '.join(missing)})")
    names = [*REQUIRED, *(n for n in OPTIONAL if n in files)]
    parts = [MAGIC_V2, struct.pack("<I", len(names))]
    for name in names:
        data = files[name]
        if name != "model.safetensors" and len(data) > MAX_ASSET_BYTES:
            raise BundleError(f"{name}: {len(data)} bytes exceeds {MAX_ASSET_BYTES}")
        raw = name.encode()
        parts += [struct.pack("<H", len(raw)), raw, struct.pack("<Q", len(data)), data]
    return b"".join(parts)


def unpack(data: bytes) -> dict[str, bytes]:
    """name -> bytes of a version 1 or 2 bundle; BundleError if anything is off."""
    if data.startswith(MAGIC_V1):
        if len(data) < 16:
            raise BundleError("truncated bundle header")
        (n,) = struct.unpack_from("<Q", data, 8)
        if n > len(data) - 16:
            raise BundleError(f"config.json length {n} exceeds the bundle")
        return {"config.json": data[16 : 16 + n], "model.safetensors": data[16 + n :]}
    if not data.startswith(MAGIC_V2):
        raise BundleError("not an Anvil HF bundle (magic ANVILHF1 or ANVILHF2 missing)")
    mv = memoryview(data)
    if len(data) < 12:
        raise BundleError("truncated bundle header")
    (count,) = struct.unpack_from("<I", data, 8)
    allowed = set(REQUIRED) | set(OPTIONAL)
    if count > len(allowed):
        raise BundleError(f"{count} files; a bundle holds at most {len(allowed)}")
    pos, files = 12, {}
    for _ in range(count):
        if pos + 2 > len(data):
            raise BundleError("truncated file name")
        (ln,) = struct.unpack_from("<H", data, pos)
        pos += 2
        try:
            name = bytes(mv[pos : pos + ln]).decode()
        except UnicodeDecodeError:
            raise BundleError("a file name is not UTF-8") from None
        pos += ln
        if name not in allowed:
            raise BundleError(f"file {name[:64]!r} is not one a bundle may hold: {sorted(allowed)}")
        if name in files:
            raise BundleError(f"file {name!r} appears twice")
        if pos + 8 > len(data):
            raise BundleError(f"{name}: truncated size")
        (size,) = struct.unpack_from("<Q", data, pos)
        pos += 8
        if size > len(data) - pos:
            raise BundleError(f"{name}: size {size} exceeds the bundle")
        if name != "model.safetensors" and size > MAX_ASSET_BYTES:
            raise BundleError(f"{name}: {size} bytes exceeds {MAX_ASSET_BYTES}")
        files[name] = bytes(mv[pos : pos + size])
        pos += size
    if pos != len(data):
        raise BundleError(f"{len(data) - pos} bytes after the last file")
    missing = [n for n in REQUIRED if n not in files]
    if missing:
        raise BundleError(f"bundle lacks {', '.join(missing)}")
    return files
