"""CURVE keys of the internal ZeroMQ links (issue #18): which process holds which key.

The scheduler is the CURVE server of both its ports; gateways and executors are its clients. Each
role has one keypair. Keys are written as 64 hex digits (32 bytes): safe unquoted in a shell, an env
file or YAML, unlike Z85 (whose alphabet has `$` and `#`); in memory they are Z85, as libzmq and
pyzmq's ZAP want them. A secret key is a file holding the hex and nothing else (a compose secret
written from an environment variable is exactly that), named ``{role}.key_secret`` in the secrets
directory, mode 0600. Public keys are not secret: they travel as settings
(``ANVIL_CURVE_{ROLE}_PUBLIC``; for gateway and executor a comma-separated list, every key of which
is admitted).

| key                    | held by                                                    |
|------------------------|------------------------------------------------------------|
| scheduler secret       | the scheduler                                              |
| scheduler public       | gateways and executors: they talk only to the real server  |
| gateway secret         | gateways                                                   |
| gateway public(s)      | the scheduler: the clients admitted on its gateway port    |
| executor secret        | executors                                                  |
| executor public(s)     | the scheduler: the clients admitted on its executor port   |

A gateway key cannot register an executor and an executor key cannot submit requests: each port
admits its own role's keys only (its ZAP domain is the role).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import zmq
from zmq.utils import z85

__all__ = [
    "ROLES",
    "CurveClient",
    "CurveError",
    "CurveServer",
    "generate_role_keys",
    "key_hex",
    "parse_public_keys",
    "read_secret_key",
    "secret_key_path",
    "write_secret_file",
]

ROLES = ("scheduler", "gateway", "executor")
HINT = "`anvil up` makes the keys; for compose run `anvil secrets` (docs/security.md)"
_HEX_KEY_CHARS = 64  # a 32-byte Curve25519 key in hex


class CurveError(ValueError):
    """A CURVE key is missing or malformed; the message names the file or setting to fix."""


@dataclass(frozen=True)
class CurveServer:
    """Options of a CURVE server socket; `domain` is the ZAP domain whose keys it admits."""

    secret_key: bytes = field(repr=False)
    domain: str


@dataclass(frozen=True)
class CurveClient:
    """Options of a CURVE client socket: its own keypair and the server key it must meet."""

    secret_key: bytes = field(repr=False)
    server_key: bytes


def secret_key_path(secrets_dir: str | Path, role: str) -> Path:
    return Path(secrets_dir) / f"{role}.key_secret"


def _check_key(text: bytes, what: str) -> bytes:
    """Hex text of a key -> its Z85 form; CurveError names `what` when it is not 64 hex digits."""
    key = text.strip()
    if len(key) != _HEX_KEY_CHARS:
        raise CurveError(
            f"{what}: a CURVE key is {_HEX_KEY_CHARS} hex digits, got {len(key)} characters; {HINT}"
        )
    try:
        return z85.encode(bytes.fromhex(key.decode("ascii")))
    except (ValueError, UnicodeDecodeError):
        raise CurveError(f"{what}: not hex") from None


def key_hex(z85_key: bytes) -> str:
    """The written form (hex) of a key held as Z85."""
    return z85.decode(z85_key).hex()


def read_secret_key(secrets_dir: str | Path, role: str) -> bytes:
    """The secret key of `role` (Z85) from its file; CurveError says which file is missing or bad."""
    if not str(secrets_dir):
        raise CurveError(
            "ZeroMQ CURVE is on (ANVIL_ZMQ_CURVE) but ANVIL_SECRETS_DIR is unset: run under `anvil up`, "
            "give compose its secrets (`anvil secrets`), or set ANVIL_ZMQ_CURVE=0 (benchmarks only)"
        )
    path = secret_key_path(secrets_dir, role)
    try:
        text = path.read_bytes()
    except OSError as exc:
        raise CurveError(f"cannot read the {role} secret key {path}: {exc.strerror}; {HINT}") from None
    return _check_key(text, str(path))


def parse_public_keys(value: str, setting: str) -> frozenset[bytes]:
    """Comma-separated hex public keys of a setting, as Z85; empty means none (CurveError on a bad one)."""
    return frozenset(_check_key(k.encode(), setting) for k in value.split(",") if k.strip())


def write_secret_file(path: Path, text: str) -> None:
    """Write `text` to a new file created 0600 (never readable by others, not even for a moment)."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    tmp.replace(path)


def generate_role_keys(secrets_dir: Path) -> Mapping[str, str]:
    """A fresh keypair per role: secret keys written 0600 under `secrets_dir` (made 0700),
    returns the public keys as the environment that carries them ({ANVIL_CURVE_ROLE_PUBLIC: hex})."""
    secrets_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(secrets_dir, 0o700)
    env: dict[str, str] = {}
    for role in ROLES:
        public, secret = zmq.curve_keypair()
        write_secret_file(secret_key_path(secrets_dir, role), key_hex(secret))
        env[f"ANVIL_CURVE_{role.upper()}_PUBLIC"] = key_hex(public)
    return env
