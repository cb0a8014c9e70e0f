"""`anvil tenant` against a real Redis: names checked, keys stored hashed, keys revoked."""

from __future__ import annotations

import pytest
import redis

from anvil_client.cli import main
from anvil_core import keys


def test_tenant_keys_are_added_hashed_and_revoked(
    redis_server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    r = redis.Redis.from_url(redis_server, decode_responses=True)
    r.delete(keys.tenants_key())
    assert main(["tenant", "--redis-url", redis_server, "add", "acme"]) == 0
    k1 = capsys.readouterr().out.strip().splitlines()[-1]
    assert main(["tenant", "--redis-url", redis_server, "add", "acme"]) == 0
    k2 = capsys.readouterr().out.strip().splitlines()[-1]
    table = r.hgetall(keys.tenants_key())
    assert sorted(table.values()) == ["acme", "acme"] and k1 not in table and k2 not in str(table)
    assert main(["tenant", "--redis-url", redis_server, "revoke", "acme", "--key", k1]) == 0
    assert list(r.hgetall(keys.tenants_key()).values()) == ["acme"]  # k2 still works
    assert main(["tenant", "--redis-url", redis_server, "revoke", "acme", "--key", k1]) == 1  # already gone
    assert main(["tenant", "--redis-url", redis_server, "revoke", "acme"]) == 0
    assert r.hgetall(keys.tenants_key()) == {}


def test_keys_revoke_removes_one_key_of_any_tenant(
    redis_server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    r = redis.Redis.from_url(redis_server, decode_responses=True)
    r.delete(keys.tenants_key())
    made = {}
    for tenant in ("acme", "beta"):
        assert main(["tenant", "--redis-url", redis_server, "add", tenant]) == 0
        made[tenant] = capsys.readouterr().out.strip().splitlines()[-1]
    assert main(["keys", "--redis-url", redis_server, "revoke", made["beta"]]) == 0
    out = capsys.readouterr().out
    assert "tenant 'beta'" in out and made["beta"] not in out  # the key is never printed back
    assert list(r.hgetall(keys.tenants_key()).values()) == ["acme"]
    assert main(["keys", "--redis-url", redis_server, "revoke", made["beta"]]) == 1  # already gone
    assert main(["keys", "--redis-url", redis_server, "revoke", "anv_never-issued"]) == 1
    assert list(r.hgetall(keys.tenants_key()).values()) == ["acme"]
    r.delete(keys.tenants_key())


@pytest.mark.parametrize("name", ["*", "", "a b", "x" * 65, ".lead", "a:b"])
def test_names_that_would_alias_a_limit_key_are_refused(redis_server: str, name: str) -> None:
    assert main(["tenant", "--redis-url", redis_server, "add", name]) == 2
    qos_rc = main(["qos", "--redis-url", redis_server, "set", name or ".", "2", "5"])
    assert qos_rc == (0 if name == "*" else 2)  # "*" is the wildcard of limits, never a tenant
