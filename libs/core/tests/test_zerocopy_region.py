"""Shared-memory regions: creation (0600, O_EXCL), the checks a server makes before mapping, and
bounds on every access."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator

import numpy as np
import pytest

from anvil_core.zerocopy import Region, RegionError, Status
from anvil_core.zerocopy.region import REGION_HEADER_BYTES, SHM_DIR, check_name


@pytest.fixture
def region() -> Iterator[Region]:
    r = Region.create(256, 4)
    yield r
    r.destroy()


def test_created_region_is_private_and_laid_out(region: Region) -> None:
    path = os.path.join(SHM_DIR, region.name)
    st = os.stat(path)
    assert stat.S_IMODE(st.st_mode) == 0o600
    assert st.st_size == REGION_HEADER_BYTES + 4 * 256 == region.size
    assert region.name.startswith("anvil-")
    assert [region.slot_offset(i) for i in range(4)] == [64, 320, 576, 832]
    assert all(region.slot_offset(i) % 64 == 0 for i in range(4))


def test_create_is_exclusive(region: Region) -> None:
    with pytest.raises(RegionError, match="cannot create region \\(EEXIST\\)"):
        Region.create(256, 4, name=region.name)


def test_destroy_unlinks_and_is_idempotent() -> None:
    r = Region.create(128, 1)
    path = os.path.join(SHM_DIR, r.name)
    r.destroy()
    r.destroy()
    assert not os.path.exists(path)


def test_attach_sees_the_creators_bytes_without_copying(region: Region) -> None:
    peer = Region.attach(region.name, 256, 4, writable=False)
    try:
        x = np.arange(16, dtype=np.float32)
        off = region.slot_offset(2) + 64
        region.set(off, x)
        view = peer.array(off, np.dtype(np.float32), (16,))
        assert np.array_equal(view, x) and peer.contains(view) and not view.flags.writeable
        region.set(off, np.zeros(16, np.float32))  # the creator writes: the view changes with it
        assert not view.any()
        with pytest.raises(RegionError, match="read-only"):
            peer.set(off, b"x")
    finally:
        peer.close()


@pytest.mark.parametrize(
    "name",
    ["../etc/passwd", "anvil-a/b", "/dev/shm/anvil-x", "x-anvil", "anvil-", "anvil-a.b", "anvil-" + "a" * 59],
)
def test_names_that_could_be_paths_are_refused(name: str) -> None:
    with pytest.raises(RegionError) as info:
        check_name(name)
    assert info.value.status == Status.BAD_REGION
    assert "must match anvil-[A-Za-z0-9_-]{1,58}" in info.value.message


def test_attach_refuses_what_a_server_must_not_trust(region: Region) -> None:
    cases = [
        ((region.name, 256, 8), "holds 1088 bytes"),  # declares more than exists
        ((region.name, 128, 4), "does not match the declared layout"),  # header disagrees
        (("anvil-doesnotexist0", 256, 4), "cannot open region (ENOENT)"),
        ((region.name, 100, 4), "multiple of 64"),
        ((region.name, 256, 0), "slot_count 0"),
    ]
    for args, says in cases:
        with pytest.raises(RegionError) as info:
            Region.attach(*args, writable=True)  # type: ignore[arg-type]
        assert says in info.value.message
        assert region.name not in info.value.message  # a client's name never reaches a message


def test_attach_refuses_group_readable_symlinked_and_special_files(region: Region) -> None:
    path = os.path.join(SHM_DIR, region.name)
    os.chmod(path, 0o640)
    with pytest.raises(RegionError, match="mode 0600"):
        Region.attach(region.name, 256, 4, writable=False)
    os.chmod(path, 0o600)
    link = os.path.join(SHM_DIR, "anvil-zctestlink")
    fifo = os.path.join(SHM_DIR, "anvil-zctestfifo")
    os.symlink(path, link)
    os.mkfifo(fifo, 0o600)
    try:
        with pytest.raises(RegionError, match="ELOOP"):
            Region.attach("anvil-zctestlink", 256, 4, writable=False)
        with pytest.raises(RegionError, match="not a regular"):
            Region.attach("anvil-zctestfifo", 256, 4, writable=False)  # O_NONBLOCK: never hangs
    finally:
        os.unlink(link)
        os.unlink(fifo)


def test_every_access_is_bounds_checked(region: Region) -> None:
    with pytest.raises(RegionError) as info:
        region.slot_offset(4)
    assert info.value.status == Status.BAD_SLOT
    with pytest.raises(RegionError) as info:
        region.check_payload(0, 256 - 16 + 1)
    assert info.value.status == Status.BAD_LENGTH
    assert region.check_payload(3, 240) == region.slot_offset(3)
    for offset, length in [(-1, 1), (region.size, 1), (0, region.size + 1)]:
        with pytest.raises(RegionError):
            region.get(offset, length)


def test_spans_must_stay_inside_one_slots_payload(region: Region) -> None:
    base = region.slot_offset(1)
    assert region.check_span(base + 16, 240) == 1
    for offset, length in [
        (base, 16),  # the header is not payload
        (base + 16, 241),  # runs into slot 2
        (0, 8),  # the region header
        (region.size, 0),  # past the last slot
        (base + 16, -1),
    ]:
        with pytest.raises(RegionError) as info:
            region.check_span(offset, length)
        assert info.value.status == Status.BAD_LENGTH


def test_shrunk_or_unlinked_regions_are_noticed(region: Region) -> None:
    assert region.intact() and region.linked()
    peer = Region.attach(region.name, 256, 4, writable=True)
    try:
        os.truncate(os.path.join(SHM_DIR, region.name), 64)
        assert not peer.intact()
        os.unlink(os.path.join(SHM_DIR, region.name))
        assert not peer.linked()
    finally:
        peer.close()


def test_close_with_live_views_defers_the_unmap(region: Region) -> None:
    peer = Region.attach(region.name, 256, 4, writable=False)
    view = peer.array(region.slot_offset(0) + 64, np.dtype(np.uint8), (8,))
    peer.close()  # views keep the pages; nothing crashes
    assert peer.closed and view.sum() == 0
    with pytest.raises(RegionError, match="closed"):
        peer.get(0, 1)
