"""KServe system shared memory: client-created POSIX shm regions the gateway maps by key.

Every use is bounds-checked (offset + size within the registered range, the range within the mapped
object), a region used by in-flight requests cannot be unregistered under them (refcounts; the
unregister fails with a clear message), and no message ever echoes the client's shm key.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass

__all__ = ["Region", "ShmError", "SystemShm"]

_KEY = re.compile(r"^/?[A-Za-z0-9._-]{1,200}$")
_NAME = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
SHM_DIR = "/dev/shm"


class ShmError(ValueError):
    """A shared-memory request that cannot be honoured; `status` is the HTTP status to answer."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Region:
    """A registered range of a client's shm object, accessed with pread/pwrite on a kept descriptor.

    Not mmap: a client can truncate its object at any time, and touching a mapping past the new end
    raises SIGBUS, which kills the process. pread simply returns fewer bytes, which is answered
    with a 4xx; pwrite past the end extends the client's own object.
    """

    name: str
    key: str
    offset: int
    byte_size: int
    fd: int
    users: int = 0

    def check(self, offset: int, size: int, what: str) -> None:
        """ShmError unless [offset, offset + size) lies within the registered range."""
        if offset < 0 or size < 0 or offset + size > self.byte_size:
            raise ShmError(
                f"{what}: offset {offset} + size {size} exceeds region {self.name!r} "
                f"of {self.byte_size} bytes"
            )

    def read(self, offset: int, size: int, what: str) -> bytes:
        self.check(offset, size, what)
        data = os.pread(self.fd, size, self.offset + offset)
        if len(data) != size:
            raise ShmError(
                f"{what}: region {self.name!r} was truncated under the server ({len(data)} of {size} bytes)"
            )
        return data

    def write(self, offset: int, data: bytes | memoryview, what: str) -> None:
        self.check(offset, len(data), what)
        view = memoryview(data).cast("B")
        done = 0
        while done < len(view):
            done += os.pwrite(self.fd, view[done:], self.offset + offset + done)


class SystemShm:
    """The gateway's registered regions. Owned by the event loop (no locking needed)."""

    def __init__(self, enabled: bool, max_regions: int = 256) -> None:
        self.enabled = enabled
        self.max_regions = max_regions
        self.regions: dict[str, Region] = {}

    def _check_enabled(self) -> None:
        if not self.enabled:
            raise ShmError(
                "system shared memory is disabled on this server (ANVIL_ALLOW_CLIENT_SHM=1 enables it)", 403
            )

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        self._check_enabled()
        if not _NAME.match(name):
            raise ShmError("region name must be 1-128 characters of letters, digits, '.', '_' or '-'")
        if not isinstance(key, str) or not _KEY.match(key):
            raise ShmError("shm key must be a POSIX shm name: an optional '/' then 1-200 of [A-Za-z0-9._-]")
        if not isinstance(offset, int) or not isinstance(byte_size, int) or offset < 0 or byte_size <= 0:
            raise ShmError("offset must be >= 0 and byte_size > 0 (integers)")
        if name in self.regions:
            raise ShmError(f"region {name!r} is already registered", 409)
        if len(self.regions) >= self.max_regions:
            raise ShmError(f"at most {self.max_regions} regions may be registered", 429)
        path = os.path.join(SHM_DIR, key.lstrip("/"))
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            raise ShmError(f"region {name!r}: the shm object cannot be opened", 400) from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise ShmError(f"region {name!r}: the shm key does not name a shared-memory object")
            if offset + byte_size > st.st_size:
                raise ShmError(
                    f"region {name!r}: offset {offset} + byte_size {byte_size} exceeds the object's "
                    f"{st.st_size} bytes"
                )
        except BaseException:
            os.close(fd)
            raise
        self.regions[name] = Region(name, key, offset, byte_size, fd)

    def unregister(self, name: str | None = None) -> None:
        """Unregister one region (or all). Fails, changing nothing, while a region is in use."""
        self._check_enabled()
        names = [name] if name is not None else list(self.regions)
        if name is not None and name not in self.regions:
            raise ShmError(f"region {name!r} is not registered", 404)
        busy = [n for n in names if self.regions[n].users]
        if busy:
            counts = ", ".join(f"{n!r} ({self.regions[n].users})" for n in busy)
            raise ShmError(f"regions in use by in-flight requests: {counts}; retry when they finish", 409)
        for n in names:
            os.close(self.regions.pop(n).fd)

    def status(self, name: str | None = None) -> list[dict[str, object]]:
        self._check_enabled()
        if name is not None and name not in self.regions:
            raise ShmError(f"region {name!r} is not registered", 404)
        chosen = [self.regions[name]] if name is not None else list(self.regions.values())
        return [{"name": r.name, "key": r.key, "offset": r.offset, "byte_size": r.byte_size} for r in chosen]

    def acquire(self, name: str) -> Region:
        """Pin a region for one request; pair every acquire with `release`."""
        self._check_enabled()
        region = self.regions.get(name)
        if region is None:
            raise ShmError(f"shared memory region {name!r} is not registered")
        region.users += 1
        return region

    @staticmethod
    def release(region: Region) -> None:
        region.users -= 1
