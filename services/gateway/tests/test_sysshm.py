"""System shared memory regions: bounds, refcounts, disabled by default, no key in messages."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from anvil_gateway.sysshm import ShmError, SystemShm


@pytest.fixture
def shm_key() -> Iterator[str]:
    key = f"/anvil-test-{uuid.uuid4().hex}"
    fd = os.open(f"/dev/shm{key}", os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    os.ftruncate(fd, 4096)
    os.close(fd)
    yield key
    os.unlink(f"/dev/shm{key}")


def test_disabled_by_default_says_how_to_enable(shm_key: str) -> None:
    with pytest.raises(ShmError, match="ANVIL_ALLOW_CLIENT_SHM") as info:
        SystemShm(enabled=False).register("r", shm_key, 0, 16)
    assert info.value.status == 403


def test_register_status_unregister(shm_key: str) -> None:
    shm = SystemShm(enabled=True)
    shm.register("r", shm_key, 1024, 2048)
    assert shm.status() == [{"name": "r", "key": shm_key, "offset": 1024, "byte_size": 2048}]
    shm.unregister("r")
    assert shm.status() == []


@pytest.mark.parametrize(
    ("offset", "size", "match"),
    [(0, 4097, "exceeds the object's 4096 bytes"), (4000, 200, "exceeds"), (-1, 4, "offset must be")],
)
def test_register_bounds(shm_key: str, offset: int, size: int, match: str) -> None:
    with pytest.raises(ShmError, match=match) as info:
        SystemShm(enabled=True).register("r", shm_key, offset, size)
    assert shm_key.strip("/") not in str(info.value)


@pytest.mark.parametrize("key", ["/../etc/passwd", "/a/b", "", "x" * 300, "/dev/../x"])
def test_hostile_keys_are_refused_without_being_echoed(key: str) -> None:
    with pytest.raises(ShmError) as info:
        SystemShm(enabled=True).register("r", key, 0, 1)
    assert key not in str(info.value) or key == ""


def test_missing_object_does_not_echo_the_key() -> None:
    key = f"/anvil-missing-{uuid.uuid4().hex}"
    with pytest.raises(ShmError, match="cannot be opened") as info:
        SystemShm(enabled=True).register("r", key, 0, 1)
    assert key.strip("/") not in str(info.value)


def test_reads_and_writes_are_bounds_checked(shm_key: str) -> None:
    shm = SystemShm(enabled=True)
    shm.register("r", shm_key, 100, 50)
    region = shm.acquire("r")
    region.write(0, b"\x07" * 50, "x")
    with open(f"/dev/shm{shm_key}", "rb") as f:
        assert f.read()[100:150] == b"\x07" * 50
    assert region.read(10, 5, "x") == b"\x07" * 5
    with pytest.raises(ShmError, match="exceeds region 'r' of 50 bytes"):
        region.read(10, 41, "x")
    with pytest.raises(ShmError, match="exceeds region 'r' of 50 bytes"):
        region.write(49, b"ab", "x")
    shm.release(region)


def test_a_region_truncated_under_the_server_is_an_error_not_a_crash(shm_key: str) -> None:
    shm = SystemShm(enabled=True)
    shm.register("r", shm_key, 0, 4096)
    os.truncate(f"/dev/shm{shm_key}", 10)  # the client shrinks its object after registering it
    region = shm.acquire("r")
    with pytest.raises(ShmError, match="truncated under the server"):
        region.read(0, 64, "x")
    shm.release(region)


def test_a_region_in_use_cannot_be_unregistered(shm_key: str) -> None:
    shm = SystemShm(enabled=True)
    shm.register("r", shm_key, 0, 64)
    region = shm.acquire("r")
    with pytest.raises(ShmError, match="in use by in-flight requests") as info:
        shm.unregister("r")
    assert info.value.status == 409 and "r" in shm.regions
    with pytest.raises(ShmError, match="in use"):
        shm.unregister()
    shm.release(region)
    shm.unregister()
    assert shm.regions == {}


def test_duplicate_and_unknown_names(shm_key: str) -> None:
    shm = SystemShm(enabled=True)
    shm.register("r", shm_key, 0, 8)
    with pytest.raises(ShmError, match="already registered"):
        shm.register("r", shm_key, 0, 8)
    with pytest.raises(ShmError, match="not registered"):
        shm.acquire("nope")
    with pytest.raises(ShmError, match="not registered"):
        shm.unregister("nope")
