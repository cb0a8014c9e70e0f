"""The artifact cache: a Redis index over the artifact directory, and a cross-process lock so
that concurrent requests for one key compile once.

``anvil:artifact:{id}`` (hash): ``manifest`` (JSON), ``path``, ``ts``. The directory is the truth:
an index entry whose directory is gone is ignored, and a directory without an entry (Redis
restarted) is re-indexed on first lookup. ``anvil:artifact:{id}:lock`` (string, PX TTL) is held
by the one compiler process that builds ``id``; others wait for the index entry.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import redis

from anvil_compiler.artifacts import read_manifest
from anvil_core import keys
from anvil_core.redis_conn import RedisAuth, sync_redis

__all__ = ["ArtifactCache", "artifact_index_key"]


def artifact_index_key(artifact_id: str) -> str:
    return keys.artifact_key(artifact_id)


class ArtifactCache:
    def __init__(self, redis_url: str, root: Path, auth: RedisAuth | None = None) -> None:
        self.root = root
        self.r = sync_redis(redis_url, auth, socket_timeout=2, socket_connect_timeout=2)
        self.token = uuid.uuid4().hex

    def path(self, artifact_id: str) -> Path:
        return self.root / artifact_id

    def lookup(self, artifact_id: str) -> dict[str, Any] | None:
        """The manifest of a finished artifact, or None."""
        try:
            raw = self.r.hget(artifact_index_key(artifact_id), "manifest")
        except redis.RedisError:
            raw = None
        if raw is not None and (self.path(artifact_id) / "manifest.json").is_file():
            doc: dict[str, Any] = json.loads(raw)
            return doc
        manifest = read_manifest(self.path(artifact_id))
        if manifest is not None:
            self.index(artifact_id, manifest)
        return manifest

    def index(self, artifact_id: str, manifest: dict[str, Any]) -> None:
        try:
            self.r.hset(
                artifact_index_key(artifact_id),
                mapping={
                    "manifest": json.dumps(manifest),
                    "path": str(self.path(artifact_id)),
                    "ts": manifest["created"],
                },
            )
        except redis.RedisError:
            pass  # the directory still serves lookups; the next lookup re-indexes

    def try_lock(self, artifact_id: str, ttl_ms: int) -> bool:
        try:
            return bool(self.r.set(f"{artifact_index_key(artifact_id)}:lock", self.token, nx=True, px=ttl_ms))
        except redis.RedisError:
            return True  # no Redis: compile locally (single-flight still holds within this process)

    def locked(self, artifact_id: str) -> bool:
        try:
            return bool(self.r.exists(f"{artifact_index_key(artifact_id)}:lock"))
        except redis.RedisError:
            return False

    def unlock(self, artifact_id: str) -> None:
        key = f"{artifact_index_key(artifact_id)}:lock"
        try:
            if self.r.get(key) == self.token.encode():
                self.r.delete(key)
        except redis.RedisError:
            pass
