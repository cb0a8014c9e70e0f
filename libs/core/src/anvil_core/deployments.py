"""Which model versions are deployed, where, and in what state: the one mechanism behind
`anvil deploy` / `anvil undeploy`, the KServe repository API (load, unload, index) and what
executors advertise.

Keys (``anvil_core.keys``):

* ``anvil:model:{name}`` (hash), the served version: ``spec`` (ModelSpec JSON), ``status``,
  ``version``, ``artifact``, ``artifact_dir``, ``placement`` (JSON, see ``placement_allows``),
  ``reason`` (why UNLOADED), ``ts``.
* ``anvil:versions:{name}`` (hash), the model's repository: version -> JSON {artifact,
  artifact_dir, spec, placement, deployed_at}. Only deployed artifacts have one; built-in models
  (loaded by executors from their settings) have none.

``status`` is one of:

* ``COMPILED``: a version was deployed (or loaded again); executors that place it load it, warm it
  up, and switch to it. Until then the version they served before keeps answering.
* ``READY``: an executor serves the record's artifact, warm (written by ``publish_served``).
* ``UNLOADED``: nothing may serve the model: executors unload it and stop advertising it, the
  scheduler answers what is queued for it, the gateway forgets it (404). ``undeploy`` also drops
  the repository; ``unload`` keeps it, so ``load`` brings it back.

An executor publishes READY only through ``publish_served``, a script that checks the record in
the same step: a beat of an executor that has not yet seen an undeploy or a redeploy cannot
overwrite it. A record that vanished altogether (a Redis restart) is re-created by the executors'
next beats, so models keep serving across a Redis restart.
"""

from __future__ import annotations

import fnmatch
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from anvil_core import keys

__all__ = [
    "COMPILED",
    "READY",
    "UNLOADED",
    "Deployment",
    "RepositoryError",
    "deploy",
    "index",
    "load",
    "parse_placement",
    "placement_allows",
    "publish_served",
    "read",
    "undeploy",
    "unload",
]

COMPILED, READY, UNLOADED = "COMPILED", "READY", "UNLOADED"

# KEYS[1] model key. ARGV: artifact served ("" for a built-in), spec JSON, version.
# Returns 1 if published, 0 if the record says another artifact or UNLOADED.
_PUBLISH = """
local st = redis.call('HGET', KEYS[1], 'status')
if st == 'UNLOADED' then return 0 end
local art = redis.call('HGET', KEYS[1], 'artifact') or ''
if art ~= '' and art ~= ARGV[1] then return 0 end
if art == '' and ARGV[1] ~= '' then
  redis.call('HSET', KEYS[1], 'artifact', ARGV[1], 'version', ARGV[3])
end
redis.call('HSET', KEYS[1], 'spec', ARGV[2], 'status', 'READY')
return 1
"""


class RepositoryError(LookupError):
    """No such model or version (the message says which exist)."""


@dataclass(frozen=True)
class Deployment:
    """The served version of a model as the registry holds it (``read``)."""

    name: str
    status: str  # COMPILED | READY | UNLOADED | "" (a record without status)
    version: str
    artifact: str  # "" for a built-in model
    placement: dict[str, list[str]]  # {} = every executor
    reason: str
    versions: tuple[str, ...]  # the repository, oldest first ("" entries excluded)


def parse_placement(raw: str | None) -> dict[str, list[str]]:
    """A record's ``placement`` field -> {"devices": [...], "executors": [...]} ({} when unset or
    unreadable: every executor places the model, the default)."""
    if not raw:
        return {}
    try:
        doc = json.loads(raw)
    except json.JSONDecodeError:
        return {}
    if not isinstance(doc, dict):
        return {}
    return {k: [str(p) for p in v] for k, v in doc.items() if k in ("devices", "executors") and v}


def placement_allows(placement: Mapping[str, list[str]], device: str, executor_id: str) -> bool:
    """Whether an executor on ``device`` (e.g. "cpu", "cuda:0") with id ``executor_id`` loads a model
    of this placement: every list given must hold a shell pattern that matches ("cuda:*")."""
    devices, executors = placement.get("devices"), placement.get("executors")
    if devices and not any(fnmatch.fnmatchcase(device, p) for p in devices):
        return False
    return not executors or any(fnmatch.fnmatchcase(executor_id, p) for p in executors)


def _text(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw or "")


def _version_key(v: str) -> tuple[int, int, str]:
    return (0, int(v), "") if v.isdigit() else (1, 0, v)


async def _versions(redis: Any, name: str) -> dict[str, dict[str, Any]]:
    raw = await redis.hgetall(keys.model_versions_key(name))
    out = {}
    for k, v in raw.items():
        try:
            out[_text(k)] = json.loads(_text(v))
        except json.JSONDecodeError:
            continue
    return dict(sorted(out.items(), key=lambda kv: _version_key(kv[0])))


async def read(redis: Any, name: str) -> Deployment | None:
    """The model's record and repository, or None if the registry knows neither."""
    doc = {_text(k): _text(v) for k, v in (await redis.hgetall(keys.model_key(name))).items()}
    versions = await _versions(redis, name)
    if not doc and not versions:
        return None
    version = doc.get("version", "")
    if not version and doc.get("spec"):
        try:
            version = str(json.loads(doc["spec"]).get("version", ""))
        except (json.JSONDecodeError, AttributeError):
            version = ""
    return Deployment(
        name,
        doc.get("status", ""),
        version,
        doc.get("artifact", ""),
        parse_placement(doc.get("placement")),
        doc.get("reason", ""),
        tuple(versions),
    )


async def _event(redis: Any, event: str, name: str, **extra: Any) -> None:
    await redis.publish(keys.EVENTS, json.dumps({"event": event, "model": name, "ts": time.time(), **extra}))


def _served_mapping(version: str, entry: Mapping[str, Any]) -> dict[str, str]:
    return {
        "spec": json.dumps(dict(entry["spec"], version=version)),
        "status": COMPILED,
        "version": version,
        "artifact": str(entry["artifact"]),
        "artifact_dir": str(entry.get("artifact_dir", "")),
        "placement": json.dumps(entry.get("placement") or {}),
        "reason": "",
        "ts": f"{time.time():.3f}",
    }


async def deploy(
    redis: Any,
    name: str,
    artifact: str,
    spec: Mapping[str, Any],
    artifact_dir: str = "",
    version: str | None = None,
    placement: Mapping[str, list[str]] | None = None,
) -> str:
    """Add ``artifact`` to the model's repository as ``version`` (default: one above the highest
    numeric version) and make it the served one (COMPILED until an executor serves it). Returns
    the version."""
    known = await _versions(redis, name)
    if version is None:
        version = str(max((int(v) for v in known if v.isdigit()), default=0) + 1)
    if not version or any(c in version for c in "/ \t\n"):
        raise ValueError(f"version {version!r} must be non-empty, without '/' or whitespace")
    entry = {
        "artifact": artifact,
        "artifact_dir": artifact_dir,
        "spec": dict(spec, name=name, version=version),
        "placement": dict(placement or {}),
        "deployed_at": time.time(),
    }
    async with redis.pipeline(transaction=True) as pipe:
        pipe.hset(keys.model_versions_key(name), version, json.dumps(entry))
        pipe.delete(keys.model_key(name))  # no field of a former version (or tombstone) survives
        pipe.hset(keys.model_key(name), mapping=_served_mapping(version, entry))
        await pipe.execute()
    await _event(redis, "model_deployed", name, artifact=artifact, version=version)
    return version


async def _tombstone(redis: Any, name: str, reason: str, drop_repository: bool) -> None:
    async with redis.pipeline(transaction=True) as pipe:
        if drop_repository:
            pipe.delete(keys.model_key(name), keys.model_versions_key(name))
            pipe.hset(keys.model_key(name), mapping={"status": UNLOADED, "reason": reason})
        else:
            pipe.hset(keys.model_key(name), mapping={"status": UNLOADED, "reason": reason})
        pipe.hset(keys.model_key(name), "ts", f"{time.time():.3f}")
        await pipe.execute()
    await _event(redis, "model_unloaded", name, reason=reason)


async def undeploy(redis: Any, name: str, version: str | None = None) -> str:
    """Remove the model (or one version of it) from the registry; returns what happened, in words.
    Removing the served version serves the highest version left, if any; else the whole model goes:
    executors unload it, the scheduler answers what is queued for it, the gateway answers 404."""
    dep = await read(redis, name)
    if dep is None or (dep.status == UNLOADED and not dep.versions):
        raise RepositoryError(f"no model {name!r} is deployed")
    if version is None or (not dep.versions and version == dep.version):
        await _tombstone(redis, name, "undeployed", drop_repository=True)
        return f"undeployed {name}"
    if version not in dep.versions:
        raise RepositoryError(f"model {name!r} has no version {version!r}; versions: {list(dep.versions)}")
    left = [v for v in dep.versions if v != version]
    if version != dep.version:
        await redis.hdel(keys.model_versions_key(name), version)
        return f"removed version {version} of {name} (version {dep.version} still serves)"
    if not left:
        await _tombstone(redis, name, "undeployed", drop_repository=True)
        return f"undeployed {name} (version {version} was its last)"
    entries = await _versions(redis, name)
    newest = left[-1]
    async with redis.pipeline(transaction=True) as pipe:
        pipe.hdel(keys.model_versions_key(name), version)
        pipe.delete(keys.model_key(name))
        pipe.hset(keys.model_key(name), mapping=_served_mapping(newest, entries[newest]))
        await pipe.execute()
    await _event(redis, "model_deployed", name, artifact=entries[newest]["artifact"], version=newest)
    return f"removed version {version} of {name}; version {newest} serves now"


async def unload(redis: Any, name: str) -> str:
    """KServe repository unload: nothing serves the model any more, its repository stays (``load``)."""
    dep = await read(redis, name)
    if dep is None:
        raise RepositoryError(f"no model {name!r} in the repository")
    if dep.status != UNLOADED:
        await _tombstone(redis, name, "unloaded", drop_repository=False)
    return f"unloaded {name}"


async def load(redis: Any, name: str) -> str:
    """KServe repository load: serve the model's newest version again (executors load it). A model
    without a repository (a built-in) is released from its UNLOADED mark: the executors configured
    with it load it again."""
    dep = await read(redis, name)
    if dep is None:
        raise RepositoryError(f"no model {name!r} in the repository")
    if dep.versions:
        newest = dep.versions[-1]
        if dep.status != UNLOADED and dep.version == newest:
            return f"{name} version {newest} is already loaded ({dep.status})"
        entry = (await _versions(redis, name))[newest]
        async with redis.pipeline(transaction=True) as pipe:
            pipe.delete(keys.model_key(name))
            pipe.hset(keys.model_key(name), mapping=_served_mapping(newest, entry))
            await pipe.execute()
        await _event(redis, "model_deployed", name, artifact=entry["artifact"], version=newest)
        return f"loading {name} version {newest}"
    if dep.status == UNLOADED:
        await redis.delete(keys.model_key(name))
        await _event(redis, "model_loaded", name)
    return f"loading {name} (built-in: the executors configured with it serve it)"


async def publish_served(redis: Any, name: str, artifact: str, spec_json: str, version: str) -> bool:
    """An executor's advertisement of a warm model: READY with the spec it serves, unless the record
    now names another artifact or UNLOADED (checked in the same step). Returns whether it published."""
    done = await redis.eval(_PUBLISH, 1, keys.model_key(name), artifact, spec_json, version)
    return bool(done)


async def index(redis: Any) -> list[dict[str, str]]:
    """Every model and version the registry knows, with its state as KServe's repository index
    names them: READY (served), LOADING (deployed, no executor serves it yet), UNAVAILABLE (unloaded,
    or a version that is not the served one), each with a reason when not READY."""
    names: set[str] = set()
    for pattern, prefix in (
        (keys.model_key("*"), keys.model_key("")),
        (keys.model_versions_key("*"), keys.model_versions_key("")),
    ):
        async for key in redis.scan_iter(match=pattern, count=200):
            names.add(_text(key).removeprefix(prefix))
    out: list[dict[str, str]] = []
    for name in sorted(names):
        dep = await read(redis, name)
        if dep is None:
            continue
        state = {READY: "READY", COMPILED: "LOADING", UNLOADED: "UNAVAILABLE"}.get(dep.status, "UNAVAILABLE")
        served = {"name": name, "version": dep.version, "state": state}
        if dep.status == UNLOADED:
            served["reason"] = dep.reason or "unloaded"
        elif state == "LOADING":
            served["reason"] = "no executor serves it yet"
        if dep.status == UNLOADED and not dep.version and dep.versions:
            served["version"] = dep.versions[-1]
        out.append(served)
        for v in dep.versions:
            if v != served["version"]:
                out.append(
                    {"name": name, "version": v, "state": "UNAVAILABLE", "reason": "not the served version"}
                )
    return out
