"""Secrets of the stack (issue #18): what `anvil up` hands its children, and `anvil secrets`' env
file for compose. Nothing is started here."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import zmq

from anvil_client.compose_secrets import cmd_secrets, compose_secrets_env, env_file_text
from anvil_client.launcher import make_secrets, plan_procs, private_port_env
from anvil_client.stack_redis import compiler_key, redis_target
from anvil_core import redis_acl
from anvil_core.curve import parse_public_keys, read_secret_key
from anvil_core.redis_conn import RedisAuth, load_redis_auth
from anvil_core.settings import COMPILER_API_KEY_FILE

ROOT = Path(__file__).resolve().parents[3]
COMPOSE = ROOT / "compose.yaml"


def test_children_get_the_runs_secrets_dir_and_public_keys_only(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    env = {"PATH": "/usr/bin:/bin", "ANVIL_REDIS_URL": "redis://127.0.0.1:1/0"}
    users = make_secrets(run_dir, env, redis_users=True)
    assert set(users) == set(redis_acl.ROLES) and len(set(users.values())) == len(users)
    # the operator's tools read the default user's file; each service its own user's
    assert load_redis_auth(secrets_dir=run_dir / "secrets").password == users["admin"]
    for role in redis_acl.SERVICE_ROLES:
        assert load_redis_auth(secrets_dir=run_dir / "secrets", role=role) == RedisAuth(role, users[role])
    key = (run_dir / "secrets" / COMPILER_API_KEY_FILE).read_text()
    assert len(key) == 64 and (run_dir / "secrets" / COMPILER_API_KEY_FILE).stat().st_mode & 0o777 == 0o600
    procs = {p.name: p for p in plan_procs(COMPOSE, env, {"cpu"}, {}, run_dir, lambda _: None)}
    for name in ("gateway", "scheduler", "executor", "compiler", "qos"):
        child = procs[name].env
        assert child["ANVIL_SECRETS_DIR"] == str(run_dir / "secrets"), name
        for secret in (*users.values(), key):
            assert secret not in "".join(child.values()), f"{name}'s environment carries a secret"
    scheduler = procs["scheduler"].env
    (server,) = parse_public_keys(scheduler["ANVIL_CURVE_SCHEDULER_PUBLIC"], "")
    assert procs["gateway"].env["ANVIL_CURVE_SCHEDULER_PUBLIC"] == scheduler["ANVIL_CURVE_SCHEDULER_PUBLIC"]
    # the secret on disk matches the public key the others were given
    assert zmq.curve_public(read_secret_key(run_dir / "secrets", "scheduler")) == server
    assert scheduler["ANVIL_ZMQ_CURVE"] == "1"


def test_the_embedded_redis_gets_a_private_port_of_its_own() -> None:
    assert "ANVIL_REDIS_PORT" in private_port_env(COMPOSE)  # compose no longer publishes Redis


def test_anvil_secrets_writes_a_private_env_file_and_keeps_other_lines(tmp_path: Path) -> None:
    env_file = tmp_path / ".env"
    env_file.write_text("ANVIL_HTTP_PORT=9000\n")
    args = argparse.Namespace(env_file=str(env_file), rotate=False)
    assert cmd_secrets(args) == 0
    first = env_file.read_text()
    assert env_file.stat().st_mode & 0o777 == 0o600
    assert first.startswith("ANVIL_HTTP_PORT=9000\n")
    single = dict(re.findall(r"^(ANVIL_\w+)='([^']*)'$", first, re.M))
    double = dict(re.findall(r'^(ANVIL_\w+)="([^"]*)"$', first, re.M))
    assert set(single) | set(double) == set(compose_secrets_env())
    # the ACL file: one line (one user) per role, each password's hash and none in clear
    acl = double["ANVIL_SECRET_REDIS_ACL"].split("\\n")
    assert [line.split()[1] for line in acl if line] == [redis_acl.user_of(r) for r in redis_acl.ROLES]
    passwords = [single[f"ANVIL_SECRET_REDIS_{r.upper()}"] for r in redis_acl.SERVICE_ROLES]
    assert not any(password in double["ANVIL_SECRET_REDIS_ACL"] for password in passwords)
    assert cmd_secrets(args) == 1 and env_file.read_text() == first  # no silent rotation
    assert cmd_secrets(argparse.Namespace(env_file=str(env_file), rotate=True)) == 0
    rotated = env_file.read_text()
    assert rotated.count("ANVIL_SECRET_REDIS_PASSWORD") == 1 and rotated != first


def test_the_cli_sends_the_stacks_password_to_the_stacks_redis_only(tmp_path: Path) -> None:
    run = tmp_path / "run"
    env = {"ANVIL_RUN_ROOT": str(run)}
    password = make_secrets(run / "now", {}, redis_users=True)["admin"]
    run.joinpath("current.json").write_text(
        json.dumps({"redis_url": "redis://127.0.0.1:7777/0", "secrets_dir": str(run / "now" / "secrets")})
    )
    assert redis_target(None, env) == ("redis://127.0.0.1:7777/0", RedisAuth(None, password))
    assert redis_target("redis://elsewhere:6379/0", env)[1].password is None
    explicit = {**env, "ANVIL_REDIS_PASSWORD": "given"}
    assert redis_target(None, explicit)[1].password == "given"
    assert password not in repr(redis_target(None, env))  # no repr shows it


def test_anvil_deploy_sends_the_stacks_compiler_key_to_that_compiler_only(tmp_path: Path) -> None:
    run = tmp_path / "run"
    env = {"ANVIL_RUN_ROOT": str(run)}
    make_secrets(run / "now", {}, redis_users=False)
    key = (run / "now" / "secrets" / COMPILER_API_KEY_FILE).read_text()
    compiler = {"service": "compiler", "env": {"ANVIL_HTTP_PORT": "18010"}}
    run.joinpath("current.json").write_text(
        json.dumps({"secrets_dir": str(run / "now" / "secrets"), "services": [compiler]})
    )
    nowhere = tmp_path / "no.env"
    assert compiler_key("http://127.0.0.1:18010", env, nowhere) == key
    assert compiler_key("http://localhost:18010", env, nowhere) == key
    for elsewhere in ("http://127.0.0.1:8010", "http://compiler.example:18010"):
        assert compiler_key(elsewhere, env, nowhere) == ""  # never sent to another compiler
    given = {**env, "ANVIL_COMPILER_API_KEY": "given"}
    assert compiler_key("http://127.0.0.1:18010", given, nowhere) == "given"
    # compose: the key `anvil secrets` wrote to the env file
    dotenv = tmp_path / ".env"
    dotenv.write_text(env_file_text(compose_secrets_env()))
    assert len(compiler_key("http://127.0.0.1:8010", {}, dotenv)) == 64
    assert compiler_key("http://127.0.0.1:8010", {"ANVIL_API_KEY": "tenant"}, nowhere) == "tenant"
    # a container of the compose stack: the key file compose put in its secrets directory
    secrets_dir = tmp_path / "run-secrets"
    secrets_dir.mkdir()
    (secrets_dir / COMPILER_API_KEY_FILE).write_text("from-the-secret\n")
    in_container = {"ANVIL_SECRETS_DIR": str(secrets_dir), "ANVIL_API_KEY": "tenant"}
    assert compiler_key("http://compiler:8010", in_container, nowhere) == "from-the-secret"
    assert compiler_key("http://compiler:8010", {**in_container, **given}, nowhere) == "given"
    empty = {"ANVIL_SECRETS_DIR": str(tmp_path / "none"), "ANVIL_API_KEY": "tenant"}
    assert compiler_key("http://compiler:8010", empty, nowhere) == "tenant"  # no file: the next source
