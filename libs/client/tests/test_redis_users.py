"""The Redis users of `anvil up` (anvil_core.redis_acl) on a real server started as the launcher
starts it: who may write and who may read each of Anvil's keys, role by role."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from anvil_client.embedded_redis import start_redis, users_in, wait_redis
from anvil_client.launcher import free_ports
from anvil_core import keys, redis_acl
from anvil_core.curve import write_secret_file
from anvil_core.redis_conn import load_redis_auth, sync_redis

ADMIN = redis_acl.ADMIN
# key -> the roles that may write it (the admin may write every anvil key)
WRITERS = {
    keys.svc_key("gateway", "g1"): {"gateway"},
    keys.svc_key("scheduler", "s1"): {"scheduler"},
    keys.svc_key("executor", "e1"): {"executor"},
    keys.svc_key("compiler", "c1"): {"compiler"},
    keys.svc_key("qos", "q1"): {"qos"},
    keys.model_key("m"): set(),  # deployments: the operator's tools only
    keys.model_versions_key("m"): set(),
    keys.model_unloaded_key("m"): {"gateway"},  # the repository API's unload
    keys.served_key("e1"): {"executor"},  # what an executor serves
    keys.gateway_stats_key("g1"): {"gateway"},
    keys.shm_key("zc-1-1"): {"gateway"},
    keys.artifact_key("a1"): {"compiler"},
    keys.profile_key("m", "cpu"): {"scheduler"},
    keys.slo_key(): {"scheduler"},
    keys.qos_limits_key(): {"qos"},
    keys.qos_base_key(): set(),
    keys.tenants_key(): set(),
}
# key -> the roles that may read it
READERS = {
    keys.tenants_key(): {"gateway", "compiler"},
    keys.qos_limits_key(): {"gateway", "qos"},
    keys.qos_base_key(): {"qos"},
    keys.slo_key(): {"scheduler", "qos"},
    keys.model_key("m"): {"gateway", "executor"},
    keys.model_versions_key("m"): {"gateway"},
    keys.model_unloaded_key("m"): {"gateway", "scheduler", "executor"},
    keys.served_key("e1"): {"gateway", "executor"},
    keys.shm_key("zc-1-1"): {"gateway", "executor"},
    keys.svc_key("scheduler", "s1"): set(redis_acl.SERVICE_ROLES),
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    run = tmp_path_factory.mktemp("acl")
    secrets_dir = run / "secrets"
    secrets_dir.mkdir(mode=0o700)
    users = {role: secrets.token_hex(16) for role in redis_acl.ROLES}
    for role, password in users.items():
        write_secret_file(secrets_dir / redis_acl.password_file(role), password)
    assert users_in(secrets_dir) == users
    (port,) = free_ports(1)
    proc = start_redis(port, run, users=users)
    try:
        assert wait_redis(port, 10, users[ADMIN]), (run / "redis.log").read_text()
        yield f"redis://127.0.0.1:{port}/0", secrets_dir
    finally:
        proc.terminate()
        proc.wait(10)


def _client(server: tuple[str, Path], role: str) -> redis.Redis:
    url, secrets_dir = server
    return sync_redis(url, load_redis_auth(secrets_dir=secrets_dir, role=role), decode_responses=True)


def _allowed(call: object) -> bool:
    try:
        call()  # type: ignore[operator]
    except redis.exceptions.NoPermissionError:
        return False
    return True


def test_each_key_is_written_by_its_writers_only(server: tuple[str, Path]) -> None:
    got, want = {}, {}
    for role in redis_acl.ROLES:
        client = _client(server, role)
        for key, writers in WRITERS.items():
            got[(role, key)] = _allowed(lambda c=client, k=key: c.hset(k, "probe", "1"))
            want[(role, key)] = role == ADMIN or role in writers
        client.close()
    assert {k for k, v in got.items() if v != want[k]} == set()


def test_each_key_is_read_by_its_readers_only(server: tuple[str, Path]) -> None:
    got, want = {}, {}
    for role in redis_acl.ROLES:
        client = _client(server, role)
        for key, readers in READERS.items():
            got[(role, key)] = _allowed(lambda c=client, k=key: c.hgetall(k))
            want[(role, key)] = role == ADMIN or role in readers or role in WRITERS.get(key, set())
        client.close()
    assert {k for k, v in got.items() if v != want[k]} == set()


def test_no_role_administers_the_server_or_leaves_anvils_keys(server: tuple[str, Path]) -> None:
    for role in redis_acl.ROLES:
        client = _client(server, role)
        for call in (
            client.flushall,
            lambda c=client: c.config_set("dir", "/tmp"),
            lambda c=client: c.keys("*"),
        ):
            assert not _allowed(call), role
        assert not _allowed(lambda c=client: c.set("elsewhere", "1")), role
        assert _allowed(lambda c=client, r=role: c.publish(keys.EVENTS, r)), role  # everyone may announce
        client.close()


def test_a_wrong_password_or_no_password_gets_nothing(server: tuple[str, Path]) -> None:
    url, _ = server
    for username, password in (("gateway", "wrong"), (None, None), ("default", "wrong")):
        client = redis.Redis.from_url(url, username=username, password=password, socket_timeout=5)
        with pytest.raises((redis.AuthenticationError, redis.exceptions.ResponseError)):
            client.hgetall(keys.tenants_key())
        client.close()


def test_each_service_does_its_part_of_a_deployment_and_no_more(server: tuple[str, Path]) -> None:
    """The deployment functions (anvil_core.deployments) under each service's own user: the operator
    deploys, an executor advertises what it serves, the gateway unloads and loads, the scheduler
    reads the marks; an executor or a gateway that tries to rewrite the deployment is refused."""
    import asyncio
    import json

    from anvil_core import deployments as dep
    from anvil_core.redis_conn import async_redis

    url, secrets_dir = server
    spec = {"name": "d", "max_batch": 1, "inputs": [], "outputs": []}

    async def scenario() -> None:
        users = {
            role: async_redis(url, load_redis_auth(secrets_dir=secrets_dir, role=role))
            for role in redis_acl.ROLES
        }
        admin, gateway, executor, scheduler = (users[r] for r in (ADMIN, "gateway", "executor", "scheduler"))
        try:
            assert await dep.deploy(admin, "d", "art1", spec) == "1"
            served = json.dumps(dict(spec, version="1"))
            await dep.publish_served(executor, "e7", {"d": ("art1", "1", served)}, 10_000)
            assert (await dep.read(gateway, "d")).status == dep.READY
            assert await dep.unload(gateway, "d") == "unloaded d"
            assert "d" in await dep.unloaded(scheduler)
            assert (await dep.read(executor, "d", with_versions=False)).status == dep.UNLOADED
            assert await dep.load(gateway, "d") == "loading d version 1"
            assert (await dep.read(gateway, "d")).status == dep.READY
            for who, attempt in (
                ("executor", lambda: executor.hset(keys.model_key("d"), "artifact", "evil")),
                ("executor", lambda: dep.unload(executor, "d")),
                ("gateway", lambda: gateway.hset(keys.model_key("d"), "artifact", "evil")),
                ("gateway", lambda: dep.deploy(gateway, "d", "evil", spec)),
                ("gateway", lambda: dep.publish_served(gateway, "e7", {"d": ("evil", "1", served)}, 10_000)),
                ("scheduler", lambda: dep.unload(scheduler, "d")),
            ):
                with pytest.raises(redis.exceptions.NoPermissionError):
                    await attempt()
                assert (await dep.read(admin, "d")).artifact == "art1", who
            assert await dep.undeploy(admin, "d") == "undeployed d"
            await dep.withdraw_served(executor, "e7")
        finally:
            for client in users.values():
                await client.aclose()

    asyncio.run(scenario())
