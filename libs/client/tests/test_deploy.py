"""`anvil deploy` against a real compiler app (in-process) and a real Redis; `anvil models` lists it."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def test_deploy_registers_model_and_publishes_event(
    redis_url: str, tmp_path: Path, monkeypatch: Any, capsys: Any
) -> None:
    import httpx
    import numpy as np
    import redis
    from fastapi.testclient import TestClient
    from onnx import TensorProto, helper, numpy_helper

    from anvil_client import deploy
    from anvil_compiler.app import create_app
    from anvil_compiler.settings import CompilerSettings

    w = np.random.default_rng(0).standard_normal((32, 8)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="fc")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 8])],
        [numpy_helper.from_array(w, "w")],
    )
    model = tmp_path / "m.onnx"
    model.write_bytes(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    )

    settings = CompilerSettings(redis_url=redis_url, artifact_dir=str(tmp_path / "art"), service_id="c-dep")
    with TestClient(create_app(settings)) as app_client:

        class Borrowed:  # route deploy's httpx.Client to the in-process app, without closing it
            def __init__(self, base_url: str, timeout: float) -> None: ...
            def __enter__(self) -> Any:
                return app_client

            def __exit__(self, *exc: object) -> None: ...

        monkeypatch.setattr(httpx, "Client", Borrowed)
        sub = redis.Redis.from_url(redis_url).pubsub()
        sub.subscribe("anvil:events")
        parser = argparse.ArgumentParser()
        deploy.add_deploy_commands(parser.add_subparsers())
        args = parser.parse_args(["deploy", str(model), "--name", "tiny", "--redis-url", redis_url])
        assert args.fn(args) == 0
    doc = redis.Redis.from_url(redis_url, decode_responses=True).hgetall("anvil:model:tiny")
    assert doc["status"] == "COMPILED" and len(doc["artifact"]) == 32
    assert json.loads(doc["spec"])["name"] == "tiny"
    msgs = [m for m in iter(lambda: sub.get_message(timeout=1.0), None) if m["type"] == "message"]
    assert json.loads(msgs[0]["data"])["event"] == "model_deployed"
    args = parser.parse_args(["models", "--redis-url", redis_url])
    assert args.fn(args) == 0
    assert "tiny" in capsys.readouterr().out


def test_deploy_quantization_flags_reach_compile_options() -> None:
    from anvil_client import deploy
    from anvil_compiler.options import CompileOptions

    parser = argparse.ArgumentParser()
    deploy.add_deploy_commands(parser.add_subparsers())
    args = parser.parse_args(
        [
            "deploy",
            "m",
            "--name",
            "m",
            "--group",
            "32",
            "--gptq",
            "--act-order",
            "--clip-search",
            "--keep-fp32",
            "x.*",
        ]
    )
    opts = CompileOptions.from_dict(deploy._options(args))
    assert (opts.group_size, opts.gptq, opts.clip_search, opts.keep_fp32) == (32, True, True, ("x.*",))
    assert opts.calibration == "bert-uncased" and opts.act_order
    default = CompileOptions.from_dict(deploy._options(parser.parse_args(["deploy", "m", "--name", "m"])))
    assert not default.gptq and not default.clip_search and default.group_size == 128
