"""KServe system shared memory: client-created POSIX shm regions the gateway reads and writes by key.

Trust (docs/security.md): a region is registered by a tenant (its API key) and exists only for that
tenant: names are per tenant, status lists only the caller's. Registration opens `/dev/shm/<key>`
without following symlinks and keeps the descriptor; the object must be a regular file owned by the
gateway's uid (or the configured client uid), with no permission bits for others and none for the
group unless allowed, and offset + byte_size must fit it. An object already registered by another
tenant is refused. Every use is bounds-checked (offset + size within the registered range) and the
object's size is checked again (fstat) before every read and write: a client that shrinks its object
gets an error on that request. A region used by in-flight requests cannot be unregistered under
them (refcounts; the unregister fails with a clear message), and no message echoes the shm key.

The table is shared by the event loop and the parse threads (large bodies are parsed off the loop),
so a lock guards it and the counts.
"""

from __future__ import annotations

import os
import re
import stat
import threading
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
    raises SIGBUS, which kills the process. The object's size is checked (fstat) before each pread
    and pwrite, and a short pread is refused too: a shrunk object fails that request with a 4xx.
    """

    name: str
    key: str
    offset: int
    byte_size: int
    fd: int
    tenant: str = "default"
    inode: tuple[int, int] = (0, 0)  # (st_dev, st_ino) of the object
    users: int = 0

    def check(self, offset: int, size: int, what: str) -> None:
        """ShmError unless [offset, offset + size) lies within the registered range."""
        if offset < 0 or size < 0 or offset + size > self.byte_size:
            raise ShmError(
                f"{what}: offset {offset} + size {size} exceeds region {self.name!r} "
                f"of {self.byte_size} bytes"
            )

    def _check_size(self, offset: int, size: int, what: str) -> None:
        """ShmError if the object no longer holds [offset, offset + size) of the range (it shrank)."""
        have = os.fstat(self.fd).st_size
        if self.offset + offset + size > have:
            raise ShmError(
                f"{what}: region {self.name!r} shrank to {have} bytes under the server; it needs "
                f"{self.offset + offset + size} (register it again at its new size)"
            )

    def read(self, offset: int, size: int, what: str) -> bytes:
        self.check(offset, size, what)
        self._check_size(offset, size, what)
        data = os.pread(self.fd, size, self.offset + offset)
        if len(data) != size:
            raise ShmError(
                f"{what}: region {self.name!r} was truncated under the server ({len(data)} of {size} bytes)"
            )
        return data

    def write(self, offset: int, data: bytes | memoryview, what: str) -> None:
        self.check(offset, len(data), what)
        self._check_size(offset, len(data), what)  # a write past the end would grow the client's object
        view = memoryview(data).cast("B")
        done = 0
        while done < len(view):
            done += os.pwrite(self.fd, view[done:], self.offset + offset + done)


class SystemShm:
    """The gateway's registered regions, by (tenant, name).

    `client_uid`: the uid that may own registered objects besides the gateway's own (-1: none).
    `allow_group`: whether an object may grant its group read/write (for a client of another uid
    in a shared group); others' permission bits are always refused.
    """

    def __init__(
        self, enabled: bool, max_regions: int = 256, client_uid: int = -1, allow_group: bool = False
    ) -> None:
        self.enabled = enabled
        self.max_regions = max_regions
        self.owners = {os.geteuid()} | ({client_uid} if client_uid >= 0 else set())
        self.refused_mode = stat.S_IRWXO | (0 if allow_group else stat.S_IRWXG)
        self.regions: dict[tuple[str, str], Region] = {}
        self._lock = threading.Lock()

    def _check_enabled(self) -> None:
        if not self.enabled:
            raise ShmError(
                "system shared memory is disabled on this server (ANVIL_ALLOW_CLIENT_SHM=1 enables it)", 403
            )

    def register(self, tenant: str, name: str, key: str, offset: int, byte_size: int) -> None:
        self._check_enabled()
        if not isinstance(name, str) or not _NAME.match(name):
            raise ShmError("region name must be 1-128 characters of letters, digits, '.', '_' or '-'")
        if not isinstance(key, str) or not _KEY.match(key):
            raise ShmError("shm key must be a POSIX shm name: an optional '/' then 1-200 of [A-Za-z0-9._-]")
        if (
            not isinstance(offset, int)
            or not isinstance(byte_size, int)
            or isinstance(offset, bool)
            or isinstance(byte_size, bool)
            or offset < 0
            or byte_size <= 0
        ):
            raise ShmError("offset must be >= 0 and byte_size > 0 (integers)")
        fd = self._open(name, key, offset, byte_size)
        st = os.fstat(fd)
        region = Region(name, key, offset, byte_size, fd, tenant, (st.st_dev, st.st_ino))
        with self._lock:
            refusal = self._refusal(region)
            if refusal is None:
                self.regions[(tenant, name)] = region
        if refusal is not None:
            os.close(fd)
            raise refusal

    def _refusal(self, region: Region) -> ShmError | None:
        if (region.tenant, region.name) in self.regions:
            return ShmError(f"region {region.name!r} is already registered", 409)
        if len(self.regions) >= self.max_regions:
            return ShmError(f"at most {self.max_regions} regions may be registered", 429)
        if any(r.inode == region.inode and r.tenant != region.tenant for r in self.regions.values()):
            return ShmError(f"region {region.name!r}: the shm object is registered by another tenant", 403)
        return None

    def _open(self, name: str, key: str, offset: int, byte_size: int) -> int:
        """A descriptor of the checked object: no symlink followed, a regular file, the right owner
        and mode, large enough for the range."""
        path = os.path.join(SHM_DIR, key.lstrip("/"))
        try:
            # O_NONBLOCK: a FIFO planted under the key must not block the open (it is refused below).
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError:
            raise ShmError(f"region {name!r}: the shm object cannot be opened", 400) from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise ShmError(f"region {name!r}: the shm key does not name a shared-memory object")
            if st.st_uid not in self.owners:
                raise ShmError(
                    f"region {name!r}: the shm object's owner is not this server's client user "
                    "(ANVIL_SHM_CLIENT_UID)",
                    403,
                )
            if st.st_mode & self.refused_mode:
                raise ShmError(
                    f"region {name!r}: the shm object's mode {stat.S_IMODE(st.st_mode):04o} grants access "
                    f"beyond its owner{' and group' if not self.refused_mode & stat.S_IRWXG else ''} "
                    "(create it 0600)",
                    403,
                )
            if offset + byte_size > st.st_size:
                raise ShmError(
                    f"region {name!r}: offset {offset} + byte_size {byte_size} exceeds the object's "
                    f"{st.st_size} bytes"
                )
        except BaseException:
            os.close(fd)
            raise
        return fd

    def unregister(self, tenant: str, name: str | None = None) -> None:
        """Unregister one of the tenant's regions (or all of them). Fails, changing nothing, while a
        region is in use."""
        self._check_enabled()
        with self._lock:
            if name is not None and (tenant, name) not in self.regions:
                raise ShmError(f"region {name!r} is not registered", 404)
            names = [name] if name is not None else [n for t, n in self.regions if t == tenant]
            busy = [n for n in names if self.regions[(tenant, n)].users]
            if busy:
                counts = ", ".join(f"{n!r} ({self.regions[(tenant, n)].users})" for n in busy)
                raise ShmError(f"regions in use by in-flight requests: {counts}; retry when they finish", 409)
            closing = [self.regions.pop((tenant, n)) for n in names]
        for region in closing:
            os.close(region.fd)

    def status(self, tenant: str, name: str | None = None) -> list[dict[str, object]]:
        self._check_enabled()
        with self._lock:
            if name is not None and (tenant, name) not in self.regions:
                raise ShmError(f"region {name!r} is not registered", 404)
            chosen = (
                [self.regions[(tenant, name)]]
                if name is not None
                else [r for (t, _), r in self.regions.items() if t == tenant]
            )
        return [{"name": r.name, "key": r.key, "offset": r.offset, "byte_size": r.byte_size} for r in chosen]

    def acquire(self, tenant: str, name: str) -> Region:
        """Pin one of the tenant's regions for one request; pair every acquire with `release`."""
        self._check_enabled()
        with self._lock:
            region = self.regions.get((tenant, name))
            if region is None:
                raise ShmError(f"shared memory region {name!r} is not registered")
            region.users += 1
        return region

    def release(self, region: Region) -> None:
        with self._lock:
            region.users -= 1
