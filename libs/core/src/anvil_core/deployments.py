"""Which model versions are deployed, where, and in what state: the one mechanism behind
`anvil deploy` / `anvil undeploy`, the KServe repository API (load, unload, index) and what
executors advertise.

Keys (``anvil_core.keys``), each written by one kind of writer only (the Redis users of
``anvil_core.redis_acl`` enforce it):

* ``anvil:model:{name}`` (hash), the deployed version, written by the operator's tools (`anvil
  deploy` / `undeploy`, the admin user) only: ``spec`` (the plan's ModelSpec JSON), ``status``
  (COMPILED), ``version``, ``artifact``, ``artifact_dir``, ``placement`` (JSON, see
  ``placement_allows``), ``ts``.
* ``anvil:versions:{name}`` (hash), the model's repository, same writers: version -> JSON {artifact,
  artifact_dir, spec, placement, deployed_at}. Only deployed artifacts have one; built-in models
  (loaded by executors from their settings) have neither key.
* ``anvil:unloaded:{name}`` (hash {reason, ts}): nothing may serve the model while it exists.
  Written by `anvil undeploy` and the gateway (the repository API's unload; load deletes it).
* ``anvil:served:{executor}`` (hash), what one executor serves, warm: model -> JSON {artifact,
  version, spec}. Rewritten whole by that executor at every beat with its registry TTL
  (``publish_served``), so it goes with the executor.

A model's state is derived by the readers (``read``, ``snapshot``), never written:

* ``UNLOADED``: ``anvil:unloaded:{name}`` exists. Executors unload it and stop advertising it, the
  scheduler answers what is queued for it, the gateway forgets it (404). ``undeploy`` also drops
  the record and the repository; ``unload`` keeps them, so ``load`` brings the model back.
* ``READY``: a live executor advertises the record's artifact (a built-in, or a record lost with a
  Redis restart: any artifact), warm; its advertised spec is the one the gateway serves.
* ``COMPILED``: a version is deployed and no executor serves its artifact yet: executors that place
  it load it, warm it up, and switch to it; until then the version they served before answers.

So an executor cannot change what is deployed (it writes only its own advertisement), and the
gateway cannot point a model at another artifact (it may only mark it unloaded or lift the mark).
Models keep serving across a Redis restart: the executors' next beats advertise them again.
"""

from __future__ import annotations

import fnmatch
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from anvil_core import keys

__all__ = [
    "COMPILED",
    "READY",
    "UNLOADED",
    "Deployment",
    "RepositoryError",
    "Served",
    "deploy",
    "index",
    "load",
    "parse_placement",
    "placement_allows",
    "publish_served",
    "read",
    "served",
    "snapshot",
    "undeploy",
    "unload",
    "unloaded",
    "withdraw_served",
]

COMPILED, READY, UNLOADED = "COMPILED", "READY", "UNLOADED"


class RepositoryError(LookupError):
    """No such model or version (the message says which exist)."""


@dataclass(frozen=True)
class Served:
    """One executor's advertisement of one model (``anvil:served:{executor}``)."""

    executor: str
    artifact: str  # "" for a built-in
    version: str
    spec: str  # the ModelSpec JSON it serves


@dataclass(frozen=True)
class Deployment:
    """A model as the registry holds it (``read``, ``snapshot``)."""

    name: str
    status: str  # COMPILED | READY | UNLOADED | "" (only a repository is left)
    version: str
    artifact: str  # "" for a built-in
    placement: dict[str, list[str]]  # {} = every executor
    reason: str
    versions: tuple[str, ...]  # the repository, oldest first ("" entries excluded)
    spec: str = ""  # READY: the spec an executor serves; else the record's (the plan's); "" none
    served_by: tuple[str, ...] = field(default=())  # executors advertising the served artifact


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


async def served(redis: Any) -> dict[str, list[Served]]:
    """Every live executor's advertisements, by model (executors in id order)."""
    out: dict[str, list[Served]] = {}
    prefix = keys.served_key("")
    found = [_text(k) async for k in redis.scan_iter(match=keys.served_key("*"), count=200)]
    for key in sorted(found):
        for name, raw in (await redis.hgetall(key)).items():
            try:
                doc = json.loads(_text(raw))
                entry = Served(
                    key.removeprefix(prefix), str(doc["artifact"]), str(doc["version"]), str(doc["spec"])
                )
            except (json.JSONDecodeError, KeyError, TypeError):
                continue
            out.setdefault(_text(name), []).append(entry)
    return out


async def unloaded(redis: Any) -> dict[str, str]:
    """Every model marked unloaded -> why ("unloaded", "undeployed")."""
    out: dict[str, str] = {}
    prefix = keys.model_unloaded_key("")
    async for key in redis.scan_iter(match=keys.model_unloaded_key("*"), count=200):
        out[_text(key).removeprefix(prefix)] = _text(await redis.hget(key, "reason")) or "unloaded"
    return out


async def _record(redis: Any, name: str) -> dict[str, str]:
    return {_text(k): _text(v) for k, v in (await redis.hgetall(keys.model_key(name))).items()}


def _derive(
    name: str,
    doc: Mapping[str, str],
    hold: str | None,
    advertised: list[Served],
    versions: tuple[str, ...],
) -> Deployment | None:
    """The model's state from its record, unload mark, advertisements and repository."""
    if not doc and hold is None and not advertised and not versions:
        return None
    version, artifact, spec = doc.get("version", ""), doc.get("artifact", ""), doc.get("spec", "")
    if not version and spec:
        try:
            version = str(json.loads(spec).get("version", ""))
        except (json.JSONDecodeError, AttributeError):
            version = ""
    serving = [s for s in advertised if not doc or not artifact or s.artifact == artifact]
    if hold is not None:
        status, reason = UNLOADED, hold
        if not version:  # a built-in's: what the executors served; else the newest in the repository
            version = advertised[0].version if advertised else (versions[-1] if versions else "")
    elif serving:
        status, reason, spec = READY, "", serving[0].spec
        if not doc:  # a built-in, or a record lost with Redis: what the executors serve
            artifact, version = serving[0].artifact, serving[0].version
    elif doc:
        status, reason = COMPILED, ""
    else:
        status, reason = "", ""
    return Deployment(
        name,
        status,
        version,
        artifact,
        parse_placement(doc.get("placement")),
        reason,
        versions,
        spec,
        tuple(s.executor for s in serving) if hold is None else (),
    )


async def read(redis: Any, name: str, with_versions: bool = True) -> Deployment | None:
    """The model's state, or None if the registry knows nothing of it (its repository left out
    unless `with_versions`: the executors' Redis user may not read it)."""
    doc = await _record(redis, name)
    mark = {_text(k): _text(v) for k, v in (await redis.hgetall(keys.model_unloaded_key(name))).items()}
    hold = (mark.get("reason") or "unloaded") if mark else None
    versions = tuple(await _versions(redis, name)) if with_versions else ()
    return _derive(name, doc, hold, (await served(redis)).get(name, []), versions)


async def snapshot(redis: Any, with_versions: bool = True) -> dict[str, Deployment]:
    """Every model the registry knows (a record, an unload mark, an executor's advertisement or,
    `with_versions`, a repository), by name."""
    records: dict[str, dict[str, str]] = {}
    async for key in redis.scan_iter(match=keys.model_key("*"), count=200):
        name = _text(key).removeprefix(keys.model_key(""))
        records[name] = await _record(redis, name)
    holds = await unloaded(redis)
    advertised = await served(redis)
    repos: dict[str, tuple[str, ...]] = {}
    if with_versions:
        async for key in redis.scan_iter(match=keys.model_versions_key("*"), count=200):
            name = _text(key).removeprefix(keys.model_versions_key(""))
            repos[name] = tuple(await _versions(redis, name))
    out: dict[str, Deployment] = {}
    for name in sorted({*records, *holds, *advertised, *repos}):
        found = _derive(
            name, records.get(name, {}), holds.get(name), advertised.get(name, []), repos.get(name, ())
        )
        if found is not None:
            out[name] = found
    return out


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
        pipe.delete(keys.model_key(name))  # no field of a former version survives
        pipe.hset(keys.model_key(name), mapping=_served_mapping(version, entry))
        pipe.delete(keys.model_unloaded_key(name))  # a deploy serves the model again
        await pipe.execute()
    await _event(redis, "model_deployed", name, artifact=artifact, version=version)
    return version


async def _mark_unloaded(redis: Any, name: str, reason: str, drop_repository: bool) -> None:
    async with redis.pipeline(transaction=True) as pipe:
        if drop_repository:
            pipe.delete(keys.model_key(name), keys.model_versions_key(name))
        pipe.hset(keys.model_unloaded_key(name), mapping={"reason": reason, "ts": f"{time.time():.3f}"})
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
        await _mark_unloaded(redis, name, "undeployed", drop_repository=True)
        return f"undeployed {name}"
    if version not in dep.versions:
        raise RepositoryError(f"model {name!r} has no version {version!r}; versions: {list(dep.versions)}")
    left = [v for v in dep.versions if v != version]
    if version != dep.version:
        await redis.hdel(keys.model_versions_key(name), version)
        return f"removed version {version} of {name} (version {dep.version} still serves)"
    if not left:
        await _mark_unloaded(redis, name, "undeployed", drop_repository=True)
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
    """KServe repository unload: nothing serves the model any more, its record and repository stay
    (``load``). Writes only the unload mark (the gateway's Redis user may do this, nothing more)."""
    dep = await read(redis, name)
    if dep is None:
        raise RepositoryError(f"no model {name!r} in the repository")
    if dep.status != UNLOADED:
        await _mark_unloaded(redis, name, "unloaded", drop_repository=False)
    return f"unloaded {name}"


async def load(redis: Any, name: str) -> str:
    """KServe repository load: lift the model's unload mark, so its deployed version is served again
    (executors that place it load it), or, for a built-in, the executors configured with it load it
    again. Deletes only the unload mark."""
    dep = await read(redis, name)
    if dep is None:
        raise RepositoryError(f"no model {name!r} in the repository")
    if dep.status != UNLOADED:
        return f"{name} version {dep.version} is already loaded ({dep.status})"
    await redis.delete(keys.model_unloaded_key(name))
    if dep.artifact:
        await _event(redis, "model_deployed", name, artifact=dep.artifact, version=dep.version)
        return f"loading {name} version {dep.version}"
    await _event(redis, "model_loaded", name)
    return f"loading {name} (built-in: the executors configured with it serve it)"


async def publish_served(
    redis: Any, executor_id: str, models: Mapping[str, tuple[str, str, str]], ttl_ms: int
) -> None:
    """An executor's advertisement of what it serves, warm: model -> (artifact, "" for a built-in;
    version; the spec JSON it serves). Replaces its former one whole, with `ttl_ms` (its registry
    entry's): an executor that stops beating stops being advertised."""
    key = keys.served_key(executor_id)
    mapping = {
        name: json.dumps({"artifact": artifact, "version": version, "spec": spec})
        for name, (artifact, version, spec) in models.items()
    }
    async with redis.pipeline(transaction=True) as pipe:
        pipe.delete(key)
        if mapping:
            pipe.hset(key, mapping=mapping)
            pipe.pexpire(key, ttl_ms)
        await pipe.execute()


async def withdraw_served(redis: Any, executor_id: str) -> None:
    """An executor that stops: it advertises nothing."""
    await redis.delete(keys.served_key(executor_id))


async def index(redis: Any) -> list[dict[str, str]]:
    """Every model and version the registry knows, with its state as KServe's repository index
    names them: READY (served), LOADING (deployed, no executor serves it yet), UNAVAILABLE (unloaded,
    or a version that is not the served one), each with a reason when not READY."""
    out: list[dict[str, str]] = []
    for name, dep in (await snapshot(redis)).items():
        state = {READY: "READY", COMPILED: "LOADING", UNLOADED: "UNAVAILABLE"}.get(dep.status, "UNAVAILABLE")
        served_version = {"name": name, "version": dep.version, "state": state}
        if dep.status == UNLOADED:
            served_version["reason"] = dep.reason or "unloaded"
        elif state == "LOADING":
            served_version["reason"] = "no executor serves it yet"
        elif state == "UNAVAILABLE":
            served_version["reason"] = "no version is served"
        if dep.status == UNLOADED and not dep.version and dep.versions:
            served_version["version"] = dep.versions[-1]
        out.append(served_version)
        for v in dep.versions:
            if v != served_version["version"]:
                out.append(
                    {"name": name, "version": v, "state": "UNAVAILABLE", "reason": "not the served version"}
                )
    return out
