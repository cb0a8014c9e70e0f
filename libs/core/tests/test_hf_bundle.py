"""The HF upload bundle: what travels, and that no malformed bundle is read past its end."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from anvil_core.hf_bundle import MAGIC_V1, MAGIC_V2, BundleError, pack_dir, unpack


def _dir(tmp_path: Path, tokenizer: bool = True) -> Path:
    (tmp_path / "config.json").write_text('{"model_type": "bert"}')
    (tmp_path / "model.safetensors").write_bytes(b"\x00" * 100)
    if tokenizer:
        (tmp_path / "tokenizer.json").write_text("{}")
        (tmp_path / "1_Pooling").mkdir()
        (tmp_path / "1_Pooling" / "config.json").write_text('{"pooling_mode_mean_tokens": true}')
    (tmp_path / "secret.txt").write_text("not for the compiler")
    return tmp_path


def test_a_directory_travels_with_its_tokenizer_and_nothing_else(tmp_path: Path) -> None:
    files = unpack(pack_dir(_dir(tmp_path)))
    assert set(files) == {"config.json", "model.safetensors", "tokenizer.json", "1_Pooling/config.json"}
    assert files["model.safetensors"] == b"\x00" * 100


def test_version_1_is_still_read(tmp_path: Path) -> None:
    cfg = b'{"model_type": "bert"}'
    files = unpack(MAGIC_V1 + struct.pack("<Q", len(cfg)) + cfg + b"weights")
    assert files == {"config.json": cfg, "model.safetensors": b"weights"}
    with pytest.raises(BundleError, match="exceeds the bundle"):
        unpack(MAGIC_V1 + struct.pack("<Q", 10**9) + cfg)


def test_a_directory_without_weights_is_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(BundleError, match=r"missing model\.safetensors"):
        pack_dir(tmp_path)


def _entry(name: str, data: bytes) -> bytes:
    raw = name.encode()
    return struct.pack("<H", len(raw)) + raw + struct.pack("<Q", len(data)) + data


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (struct.pack("<I", 1) + _entry("../../etc/passwd", b"x"), "is not one a bundle may hold"),
        (struct.pack("<I", 2) + _entry("config.json", b"{}") + _entry("config.json", b"{}"), "twice"),
        (struct.pack("<I", 1) + _entry("config.json", b"{}"), "lacks model.safetensors"),
        (struct.pack("<I", 1) + struct.pack("<H", 11) + b"config.json" + struct.pack("<Q", 99), "exceeds"),
        (struct.pack("<I", 99), "at most"),
        (
            struct.pack("<I", 2) + _entry("config.json", b"{}") + _entry("model.safetensors", b"") + b"!",
            "after",
        ),
    ],
)
def test_malformed_bundles_are_refused_with_the_reason(body: bytes, why: str) -> None:
    with pytest.raises(BundleError, match=why):
        unpack(MAGIC_V2 + body)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_after_the_magic_never_escape_as_another_error(tail: bytes) -> None:
    for magic in (MAGIC_V1, MAGIC_V2):
        try:
            files = unpack(magic + tail)
        except BundleError:
            continue
        assert sum(len(v) for v in files.values()) <= len(tail)
