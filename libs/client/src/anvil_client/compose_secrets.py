"""`anvil secrets`: the secrets compose.yaml asks for, as an env file (issue #18).

compose.yaml's top-level `secrets` come from environment variables (ANVIL_SECRET_*), which compose
copies into each container as /run/secrets/<target> with the uid and mode the service asks for;
the public CURVE keys travel as plain settings (ANVIL_CURVE_*_PUBLIC). This command makes a fresh
set and writes it (0600) to the env file compose reads (`.env` beside compose.yaml by default).
Values are single-quoted (ACL lines have spaces and `#`), except the multi-line ACL file, which is
double-quoted with its newlines written as `\n` (compose's env files expand that escape).
"""

from __future__ import annotations

import argparse
import os
import secrets
import tempfile
from pathlib import Path
from typing import Any

from anvil_core import redis_acl
from anvil_core.curve import ROLES, generate_role_keys, key_hex, read_secret_key, write_secret_file
from anvil_core.redis_acl import acl_file

__all__ = ["add_secrets_command", "compose_secrets_env", "env_file_text"]

PREFIXES = ("ANVIL_SECRET_", "ANVIL_CURVE_")  # the lines this command owns in an env file


def compose_secrets_env() -> dict[str, str]:
    """Fresh Redis passwords, one per service and the operator's (and the ACL file of their
    users), the compiler's API key and a CURVE keypair per role, as the variables compose.yaml
    reads."""
    users = {role: secrets.token_hex(32) for role in redis_acl.ROLES}
    env = {"ANVIL_SECRET_REDIS_PASSWORD": users[redis_acl.ADMIN], "ANVIL_SECRET_REDIS_ACL": acl_file(users)}
    for role in redis_acl.SERVICE_ROLES:
        env[f"ANVIL_SECRET_REDIS_{role.upper()}"] = users[role]
    env["ANVIL_SECRET_COMPILER_API_KEY"] = secrets.token_hex(32)
    with tempfile.TemporaryDirectory() as tmp:  # 0700; the key files in it are 0600
        env.update(generate_role_keys(Path(tmp) / "keys"))
        for role in ROLES:
            env[f"ANVIL_SECRET_CURVE_{role.upper()}"] = key_hex(read_secret_key(Path(tmp) / "keys", role))
    return env


def env_file_text(values: dict[str, str], keep: str = "") -> str:
    """`keep`'s lines that this command does not own, then `values` as KEY='value' lines."""
    kept = [line for line in keep.splitlines() if not line.startswith(PREFIXES)]
    lines = [
        *kept,
        "# anvil secrets: Redis users, compiler API key and CURVE keys for compose (keep it 0600)",
    ]
    for key, value in values.items():
        if "'" in value or '"' in value or "\\" in value or "$" in value:  # never for hex or ACL rules
            raise ValueError(f"{key}: a value with a quote, backslash or $ cannot be written here")
        multi = "\n" in value
        lines.append(f'{key}="{value.replace(chr(10), chr(92) + "n")}"' if multi else f"{key}='{value}'")
    return "\n".join(lines) + "\n"


def cmd_secrets(args: argparse.Namespace) -> int:
    path = Path(args.env_file)
    old = path.read_text() if path.exists() else ""
    if any(line.startswith("ANVIL_SECRET_") for line in old.splitlines()) and not args.rotate:
        print(f"anvil: {path} already holds secrets; --rotate replaces them (restart the stack after)")
        return 1
    write_secret_file(path, env_file_text(compose_secrets_env(), old))
    print(f"anvil: wrote fresh secrets to {path} (mode 0600); `docker compose up` reads them from there")
    return 0


def add_secrets_command(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "secrets", help="write fresh Redis users, a compiler API key and CURVE keys for docker compose"
    )
    p.add_argument("--env-file", default=os.environ.get("ANVIL_ENV_FILE", ".env"), help="default: .env")
    p.add_argument("--rotate", action="store_true", help="replace the secrets the file already holds")
    p.set_defaults(fn=cmd_secrets)
