"""System shared memory regions: bounds, refcounts, disabled by default, no key in messages, owner and
mode checks, no symlinks, per-tenant names, a shrunk object errors one request."""

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
        SystemShm(enabled=False).register("t", "r", shm_key, 0, 16)
    assert info.value.status == 403


def test_register_status_unregister(shm_key: str) -> None:
    shm = SystemShm(enabled=True)
    shm.register("t", "r", shm_key, 1024, 2048)
    assert shm.status("t") == [{"name": "r", "key": shm_key, "offset": 1024, "byte_size": 2048}]
    shm.unregister("t", "r")
    assert shm.status("t") == []


@pytest.mark.parametrize(
    ("offset", "size", "match"),
    [(0, 4097, "exceeds the object's 4096 bytes"), (4000, 200, "exceeds"), (-1, 4, "offset must be")],
)
def test_register_bounds(shm_key: str, offset: int, size: int, match: str) -> None:
    with pytest.raises(ShmError, match=match) as info:
        SystemShm(enabled=True).register("t", "r", shm_key, offset, size)
    assert shm_key.strip("/") not in str(info.value)


@pytest.mark.parametrize("key", ["/../etc/passwd", "/a/b", "", "x" * 300, "/dev/../x"])
def test_hostile_keys_are_refused_without_being_echoed(key: str) -> None:
    with pytest.raises(ShmError) as info:
        SystemShm(enabled=True).register("t", "r", key, 0, 1)
    assert key not in str(info.value) or key == ""


def test_missing_object_does_not_echo_the_key() -> None:
    key = f"/anvil-missing-{uuid.uuid4().hex}"
    with pytest.raises(ShmError, match="cannot be opened") as info:
        SystemShm(enabled=True).register("t", "r", key, 0, 1)
    assert key.strip("/") not in str(info.value)


def test_reads_and_writes_are_bounds_checked(shm_key: str) -> None:
    shm = SystemShm(enabled=True)
    shm.register("t", "r", shm_key, 100, 50)
    region = shm.acquire("t", "r")
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
    shm.register("t", "r", shm_key, 0, 4096)
    os.truncate(f"/dev/shm{shm_key}", 10)  # the client shrinks its object after registering it
    region = shm.acquire("t", "r")
    with pytest.raises(ShmError, match="shrank to 10 bytes"):
        region.read(0, 64, "x")
    with pytest.raises(ShmError, match="shrank to 10 bytes"):
        region.write(0, b"\x01" * 64, "x")  # refused, not a write that grows the client's object
    assert os.stat(f"/dev/shm{shm_key}").st_size == 10
    assert region.read(0, 10, "x") == b"\x00" * 10  # what is still there is served
    shm.release(region)


def test_a_region_in_use_cannot_be_unregistered(shm_key: str) -> None:
    shm = SystemShm(enabled=True)
    shm.register("t", "r", shm_key, 0, 64)
    region = shm.acquire("t", "r")
    with pytest.raises(ShmError, match="in use by in-flight requests") as info:
        shm.unregister("t", "r")
    assert info.value.status == 409 and ("t", "r") in shm.regions
    with pytest.raises(ShmError, match="in use"):
        shm.unregister("t")
    shm.release(region)
    shm.unregister("t")
    assert shm.regions == {}


def test_duplicate_and_unknown_names(shm_key: str) -> None:
    shm = SystemShm(enabled=True)
    shm.register("t", "r", shm_key, 0, 8)
    with pytest.raises(ShmError, match="already registered"):
        shm.register("t", "r", shm_key, 0, 8)
    with pytest.raises(ShmError, match="not registered"):
        shm.acquire("t", "nope")
    with pytest.raises(ShmError, match="not registered"):
        shm.unregister("t", "nope")


def test_symlinks_are_not_followed(shm_key: str) -> None:
    link = f"/anvil-test-link-{uuid.uuid4().hex}"
    os.symlink(f"/dev/shm{shm_key}", f"/dev/shm{link}")
    try:
        with pytest.raises(ShmError, match="cannot be opened"):
            SystemShm(enabled=True).register("t", "r", link, 0, 8)
    finally:
        os.unlink(f"/dev/shm{link}")


@pytest.mark.parametrize(
    ("mode", "allow_group", "ok"),
    [
        (0o600, False, True),
        (0o604, False, False),
        (0o660, False, False),
        (0o660, True, True),
        (0o606, True, False),
    ],
)
def test_mode_beyond_the_owner_is_refused(shm_key: str, mode: int, allow_group: bool, ok: bool) -> None:
    os.chmod(f"/dev/shm{shm_key}", mode)
    shm = SystemShm(enabled=True, allow_group=allow_group)
    if ok:
        shm.register("t", "r", shm_key, 0, 8)
        return
    with pytest.raises(ShmError, match=f"mode 0{mode:o} grants access") as info:
        shm.register("t", "r", shm_key, 0, 8)
    assert info.value.status == 403 and shm.regions == {}


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another uid needs root (CI runs as root)")
def test_owner_must_be_the_server_or_the_client_uid(shm_key: str) -> None:
    other = os.geteuid() + 4242
    os.chown(f"/dev/shm{shm_key}", other, -1)
    with pytest.raises(ShmError, match="owner is not") as info:
        SystemShm(enabled=True).register("t", "r", shm_key, 0, 8)
    assert info.value.status == 403
    SystemShm(enabled=True, client_uid=other).register("t", "r", shm_key, 0, 8)


def test_a_fifo_is_refused_without_blocking() -> None:
    key = f"/anvil-test-fifo-{uuid.uuid4().hex}"
    os.mkfifo(f"/dev/shm{key}", 0o600)
    try:
        with pytest.raises(ShmError, match="does not name a shared-memory object"):
            SystemShm(enabled=True).register("t", "r", key, 0, 8)
    finally:
        os.unlink(f"/dev/shm{key}")


def test_names_are_per_tenant(shm_key: str) -> None:
    shm = SystemShm(enabled=True)
    shm.register("alice", "r", shm_key, 0, 8)
    assert shm.status("bob") == []
    with pytest.raises(ShmError, match="not registered"):
        shm.acquire("bob", "r")
    with pytest.raises(ShmError, match="not registered"):
        shm.status("bob", "r")
    shm.unregister("bob")  # all of bob's: none, alice's stays
    with pytest.raises(ShmError, match="registered by another tenant") as info:
        shm.register("bob", "r", shm_key, 0, 8)  # the same object, under bob's name space
    assert info.value.status == 403
    assert [r["name"] for r in shm.status("alice")] == ["r"]
    shm.release(shm.acquire("alice", "r"))
