"""A ZeroCopy shared-memory region: a POSIX shm object of fixed-size slots (docs/protocol.md).

Layout (all little-endian)::

    0        64 B    region header: magic "ANVILZC\\0", u16 version, u16 header bytes (64),
                     u32 slot_bytes, u32 slot_count, 44 B zero
    64       slot 0: [16 B doorbell header][payload ... slot_bytes - 16]
    64 + k*slot_bytes   slot k

`slot_bytes` is a multiple of 64, so every slot (and every tensor placed at a 64-aligned slot offset)
is 64-byte aligned in every process's mapping.

API (STYLE rule 6, the shape of tritonclient's shared_memory utilities): `Region.create` (the client:
O_EXCL, mode 0600), `Region.attach` (a server: checks name, owner, mode, size and header before it
maps), `set` / `get` / `array` (bounds-checked, no copies but `set`'s), `destroy` (close + unlink).
Every failure is a `RegionError` whose message never contains the region's name.
"""

from __future__ import annotations

import errno
import mmap
import os
import re
import secrets
import stat
import struct
from typing import Any

import numpy as np

from anvil_core.zerocopy.header import HEADER_BYTES, Status, ZeroCopyError

__all__ = [
    "NAME_PREFIX",
    "REGION_HEADER_BYTES",
    "SHM_DIR",
    "SLOT_ALIGN",
    "Region",
    "RegionError",
    "check_layout",
    "check_name",
    "region_bytes",
]

SHM_DIR = "/dev/shm"  # shm_open(3) names live here on Linux
NAME_PREFIX = "anvil-"
_NAME = re.compile(r"anvil-[A-Za-z0-9_-]{1,58}\Z")  # no '/', no '.', bounded: never a path
REGION_MAGIC = b"ANVILZC\x00"
REGION_VERSION = 1
REGION_HEADER = struct.Struct("<8sHHII44x")
REGION_HEADER_BYTES = REGION_HEADER.size  # 64
SLOT_ALIGN = 64  # bytes; cache line, and enough for every dtype and SIMD load
MIN_SLOT_BYTES = 128
MAX_SLOT_BYTES = 1 << 30
MAX_SLOTS = 0xFFFF  # the slot index is 16 bits of `reserved`
MAX_REGION_BYTES = 1 << 36


class RegionError(ZeroCopyError):
    """A region that cannot be created, attached or addressed as asked."""


def check_name(name: str) -> None:
    if not isinstance(name, str) or not _NAME.match(name):
        raise RegionError(
            Status.BAD_REGION, f"region name must match {NAME_PREFIX}[A-Za-z0-9_-]{{1,58}} (no paths)"
        )


def check_layout(slot_bytes: int, slot_count: int) -> None:
    if not MIN_SLOT_BYTES <= slot_bytes <= MAX_SLOT_BYTES or slot_bytes % SLOT_ALIGN:
        raise RegionError(
            Status.BAD_REGION,
            f"slot_bytes {slot_bytes} must be a multiple of {SLOT_ALIGN} "
            f"in {MIN_SLOT_BYTES}..{MAX_SLOT_BYTES}",
        )
    if not 1 <= slot_count <= MAX_SLOTS:
        raise RegionError(Status.BAD_REGION, f"slot_count {slot_count} must be in 1..{MAX_SLOTS}")
    if region_bytes(slot_bytes, slot_count) > MAX_REGION_BYTES:
        raise RegionError(Status.BAD_REGION, f"a region may hold at most {MAX_REGION_BYTES} bytes")


def region_bytes(slot_bytes: int, slot_count: int) -> int:
    return REGION_HEADER_BYTES + slot_bytes * slot_count


class Region:
    """One mapping of a region. Not thread-safe; the owner of the object serializes its use."""

    def __init__(
        self, name: str, fd: int, slot_bytes: int, slot_count: int, writable: bool, owner: bool
    ) -> None:
        self.name = name
        self.slot_bytes = slot_bytes
        self.slot_count = slot_count
        self.size = region_bytes(slot_bytes, slot_count)
        self.writable = writable
        self.owner = owner  # created here: destroy() unlinks
        self._fd = fd
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        self._mm: mmap.mmap | None = mmap.mmap(fd, self.size, mmap.MAP_SHARED, prot)
        self._view = memoryview(self._mm)
        probe = np.frombuffer(self._view, dtype=np.uint8)
        self.address = int(probe.__array_interface__["data"][0])  # of this process's mapping
        del probe

    # ---- lifecycle --------------------------------------------------------------------------
    @classmethod
    def create(cls, slot_bytes: int, slot_count: int, name: str | None = None) -> Region:
        """Create a fresh region (O_EXCL, mode 0600) and write its header."""
        check_layout(slot_bytes, slot_count)
        name = name or f"{NAME_PREFIX}{secrets.token_hex(12)}"
        check_name(name)
        path = os.path.join(SHM_DIR, name)
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(path, flags, 0o600)
        except OSError as exc:
            raise RegionError(Status.BAD_REGION, f"cannot create region ({_errno(exc)})") from None
        try:
            os.fchmod(fd, 0o600)  # whatever the umask, exactly owner read/write
            os.ftruncate(fd, region_bytes(slot_bytes, slot_count))
            region = cls(name, fd, slot_bytes, slot_count, writable=True, owner=True)
        except (OSError, ValueError) as exc:
            os.close(fd)
            os.unlink(path)
            raise RegionError(Status.BAD_REGION, f"cannot size region ({type(exc).__name__})") from None
        REGION_HEADER.pack_into(
            region._view, 0, REGION_MAGIC, REGION_VERSION, REGION_HEADER_BYTES, slot_bytes, slot_count
        )
        return region

    @classmethod
    def attach(cls, name: str, slot_bytes: int, slot_count: int, writable: bool) -> Region:
        """Map a region a client created, after checking everything a server must not trust:
        the name (no paths), a regular file owned by this uid with no group/other access, at least
        the declared size, and a header that matches the declared layout."""
        check_name(name)
        check_layout(slot_bytes, slot_count)
        flags = (os.O_RDWR if writable else os.O_RDONLY) | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
        try:
            fd = os.open(os.path.join(SHM_DIR, name), flags)
        except OSError as exc:
            raise RegionError(Status.BAD_REGION, f"cannot open region ({_errno(exc)})") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise RegionError(Status.BAD_REGION, "region is not a regular shared-memory object")
            if st.st_uid != os.geteuid():
                raise RegionError(Status.BAD_REGION, "region is owned by another user")
            if st.st_mode & 0o077:
                raise RegionError(Status.BAD_REGION, "region must have mode 0600 (no group/other access)")
            need = region_bytes(slot_bytes, slot_count)
            if st.st_size < need:
                raise RegionError(
                    Status.BAD_REGION, f"region holds {st.st_size} bytes; the declared layout needs {need}"
                )
            region = cls(name, fd, slot_bytes, slot_count, writable=writable, owner=False)
        except RegionError:
            os.close(fd)
            raise
        except (OSError, ValueError) as exc:
            os.close(fd)
            raise RegionError(Status.BAD_REGION, f"cannot map region ({type(exc).__name__})") from None
        try:
            magic, version, hdr, sb, sc = REGION_HEADER.unpack_from(region._view, 0)
            if (magic, version, hdr, sb, sc) != (
                REGION_MAGIC,
                REGION_VERSION,
                REGION_HEADER_BYTES,
                slot_bytes,
                slot_count,
            ):
                raise RegionError(
                    Status.BAD_REGION,
                    f"region header (version {version}, {sb} x {sc}) does not match the declared "
                    f"layout (version {REGION_VERSION}, {slot_bytes} x {slot_count})",
                )
        except RegionError:
            region.close()
            raise
        return region

    def close(self) -> None:
        """Unmap (idempotent). Arrays still viewing the mapping keep it alive until they go."""
        if self._mm is None:
            return
        self._view.release()
        try:
            self._mm.close()
        except BufferError:
            pass  # exported views (numpy arrays) still exist; the mapping dies with them
        self._mm = None
        os.close(self._fd)

    def destroy(self) -> None:
        """Close and, for the creator, unlink the shm object."""
        self.close()
        if self.owner:
            try:
                os.unlink(os.path.join(SHM_DIR, self.name))
            except FileNotFoundError:
                pass

    def __enter__(self) -> Region:
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    @property
    def closed(self) -> bool:
        return self._mm is None

    def intact(self) -> bool:
        """Whether the object still has the size that was mapped (cheap fstat). A shrunk object
        would fault (SIGBUS) on access, so servers check before they touch a slot."""
        try:
            return os.fstat(self._fd).st_size >= self.size
        except OSError:
            return False

    def linked(self) -> bool:
        """Whether the shm object still has a name; its owner unlinking it means "gone"."""
        try:
            return os.fstat(self._fd).st_nlink > 0
        except OSError:
            return False

    # ---- addressing -------------------------------------------------------------------------
    def slot_offset(self, slot: int) -> int:
        if not 0 <= slot < self.slot_count:
            raise RegionError(Status.BAD_SLOT, f"slot {slot} outside 0..{self.slot_count - 1}")
        return REGION_HEADER_BYTES + slot * self.slot_bytes

    def check_payload(self, slot: int, payload_length: int) -> int:
        """The slot's offset, after checking that header + payload_length fit in the slot."""
        base = self.slot_offset(slot)
        if not 0 <= payload_length <= self.slot_bytes - HEADER_BYTES:
            raise RegionError(
                Status.BAD_LENGTH,
                f"payload_length {payload_length} exceeds the slot's {self.slot_bytes - HEADER_BYTES} bytes",
            )
        return base

    def check_span(self, offset: int, length: int) -> int:
        """Check that [offset, offset+length) lies inside one slot's payload; returns the slot."""
        rel = offset - REGION_HEADER_BYTES
        slot = rel // self.slot_bytes if rel >= 0 else -1
        if not 0 <= slot < self.slot_count or length < 0:
            raise RegionError(Status.BAD_LENGTH, f"span at {offset} is outside the region's slots")
        base = REGION_HEADER_BYTES + slot * self.slot_bytes
        if offset < base + HEADER_BYTES or offset + length > base + self.slot_bytes:
            raise RegionError(
                Status.BAD_LENGTH, f"span [{offset}, {offset + length}) leaves the payload of slot {slot}"
            )
        return slot

    # ---- data -------------------------------------------------------------------------------
    def get(self, offset: int, length: int) -> memoryview:
        """A view (no copy) of [offset, offset+length); read-only when mapped read-only."""
        if self._mm is None:
            raise RegionError(Status.BAD_REGION, "region is closed")
        if offset < 0 or length < 0 or offset + length > self.size:
            raise RegionError(
                Status.BAD_LENGTH, f"range [{offset}, {offset + length}) outside the region's {self.size} B"
            )
        return self._view[offset : offset + length]

    def read(self, offset: int, length: int) -> bytes:
        """A copy of [offset, offset+length) read with pread, not through the mapping: a client that
        shrinks its object under a reader makes this a short read (an error), never a SIGBUS."""
        if self._mm is None:
            raise RegionError(Status.BAD_REGION, "region is closed")
        if offset < 0 or length < 0 or offset + length > self.size:
            raise RegionError(
                Status.BAD_LENGTH, f"range [{offset}, {offset + length}) outside the region's {self.size} B"
            )
        try:
            data = os.pread(self._fd, length, offset)
        except OSError as exc:
            raise RegionError(Status.BAD_REGION, f"region unreadable: {_errno(exc)}") from None
        if len(data) != length:
            raise RegionError(
                Status.BAD_REGION, f"region shrank under the reader ({len(data)} of {length} B)"
            )
        return data

    def set(self, offset: int, data: Any) -> int:
        """Copy `data` (any C-contiguous buffer) to `offset`; returns the byte count."""
        if not self.writable:
            raise RegionError(Status.BAD_REGION, "region is mapped read-only")
        src = memoryview(data).cast("B")
        self.get(offset, src.nbytes)[:] = src
        return src.nbytes

    def array(self, offset: int, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        """A numpy view (no copy) of `shape` x `dtype` at `offset`."""
        count = 1
        for d in shape:
            count *= d
        view = self.get(offset, count * dtype.itemsize)
        return np.frombuffer(view, dtype=dtype).reshape(shape)

    def contains(self, array: np.ndarray) -> bool:
        """Whether `array`'s memory lies inside this process's mapping of the region (no copy)."""
        start = int(array.__array_interface__["data"][0])
        return self.address <= start and start + array.nbytes <= self.address + self.size


def _errno(exc: OSError) -> str:
    """The error without its filename: a client's region name never reaches a message."""
    return errno.errorcode.get(exc.errno or 0, "error")
