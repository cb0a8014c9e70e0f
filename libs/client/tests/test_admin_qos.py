"""`anvil qos show` prints the limits and, per qos, its mode and the baselines it learned."""

from __future__ import annotations

import json
from typing import Any

import redis

from anvil_client.cli import main
from anvil_core import keys


def test_qos_show_prints_learned_baselines(redis_url: str, capsys: Any) -> None:
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    baselines = {
        "runq_p99_us executor:e1": {
            "samples": 40,
            "ready": True,
            "median": 49.1,
            "mad": 6.9,
            "threshold": 1000.0,
        },
        "runq_mean_us executor:e1": {
            "samples": 3,
            "ready": False,
            "median": 4.6,
            "mad": 0.0,
            "threshold": 5000.0,
        },
    }
    r.hset(
        keys.svc_key("qos", "q1"), mapping={"mode": "ebpf", "reason": "", "baselines": json.dumps(baselines)}
    )
    r.hset(keys.svc_key("qos", "q2"), mapping={"mode": "procfs", "reason": "not root (`anvil doctor` ...)"})
    assert main(["qos", "--redis-url", redis_url, "show"]) == 0
    out = capsys.readouterr().out
    assert "anvil:svc:qos:q1: mode=ebpf" in out
    assert "runq_p99_us executor:e1" in out and "calm median 49.1 mad 6.9 -> threshold 1000.0" in out
    assert "[40 calm ticks, learned]" in out and "[3 calm ticks, learning (ceiling acts)]" in out
    assert "anvil:svc:qos:q2: mode=procfs (not root" in out and "no baselines learned yet" in out
