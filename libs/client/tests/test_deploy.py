"""`anvil deploy` against a real compiler app (in-process) and a real Redis; `anvil models` lists it."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from anvil_core import keys


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
            def __init__(self, base_url: str, timeout: float, **kw: Any) -> None: ...
            def __enter__(self) -> Any:
                return app_client

            def __exit__(self, *exc: object) -> None: ...

        monkeypatch.setattr(httpx, "Client", Borrowed)
        sub = redis.Redis.from_url(redis_url).pubsub()
        sub.subscribe(keys.EVENTS)
        parser = argparse.ArgumentParser()
        deploy.add_deploy_commands(parser.add_subparsers())
        args = parser.parse_args(["deploy", str(model), "--name", "tiny", "--redis-url", redis_url])
        assert args.fn(args) == 0
    doc = redis.Redis.from_url(redis_url, decode_responses=True).hgetall(keys.model_key("tiny"))
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


def _onnx(path: Path, seed: int, embed: bool = False) -> Path:
    """Issue 22's MLP (x (b, 64) -> 256 -> relu -> 10, N(0, 0.1^2) weights), or with ``embed``
    token ids (b, t) through an embedding table first (whose fp16 rounding no budget undoes)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    w = {
        "w1": 0.1 * rng.standard_normal((64, 256)),
        "b1": 0.1 * rng.standard_normal(256),
        "w2": 0.1 * rng.standard_normal((256, 10)),
        "b2": 0.1 * rng.standard_normal(10),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h0"], name="fc1"),
        helper.make_node("Add", ["h0", "b1"], ["h1"], name="fc1_bias"),
        helper.make_node("Relu", ["h1"], ["h2"], name="relu"),
        helper.make_node("MatMul", ["h2", "w2"], ["h3"], name="fc2"),
        helper.make_node("Add", ["h3", "b2"], ["y"], name="fc2_bias"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 10])
    if embed:
        w["table"] = rng.standard_normal((100, 64))
        nodes.insert(0, helper.make_node("Gather", ["table", "ids"], ["x"], name="embed"))
        x = helper.make_tensor_value_info("ids", TensorProto.INT64, ["b", "t"])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "t", 10])
    inits = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in w.items()]
    graph = helper.make_graph(nodes, "usermlp", [x], [y], inits)
    path.write_bytes(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    )
    return path


@pytest.fixture()
def deploy_cli(redis_url: str, tmp_path: Path, monkeypatch: Any) -> Any:
    """``run(argv) -> exit code`` of `anvil deploy` against an in-process compiler app."""
    import httpx
    from fastapi.testclient import TestClient

    from anvil_client import deploy
    from anvil_compiler.app import create_app
    from anvil_compiler.settings import CompilerSettings

    settings = CompilerSettings(redis_url=redis_url, artifact_dir=str(tmp_path / "art"), service_id="c-acc")
    with TestClient(create_app(settings)) as app_client:

        class Borrowed:
            def __init__(self, base_url: str, timeout: float, **kw: Any) -> None: ...
            def __enter__(self) -> Any:
                return app_client

            def __exit__(self, *exc: object) -> None: ...

        monkeypatch.setattr(httpx, "Client", Borrowed)
        parser = argparse.ArgumentParser()
        deploy.add_deploy_commands(parser.add_subparsers())

        def run(argv: list[str]) -> int:
            args = parser.parse_args(["deploy", *argv, "--redis-url", redis_url])
            return int(args.fn(args))

        yield run


def test_deploy_prints_the_accuracy_report(deploy_cli: Any, tmp_path: Path, capsys: Any) -> None:
    model = _onnx(tmp_path / "usermlp.onnx", seed=0)
    assert deploy_cli([str(model), "--name", "usermlp4"]) == 0
    out = capsys.readouterr().out
    assert "accuracy vs the unquantized plan, on generated inputs of the declared shapes" in out
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("max rel error"))
    assert float(line.split()[3]) <= 0.05 and "(budget 0.05)" in line
    kept = next(ln for ln in out.splitlines() if "kept fp32, most sensitive first:" in ln)
    assert float(kept.split("all-INT4 error was ")[1].split(":")[0]) > 0.05  # what the issue saw
    assert "fc1 (" in kept and "fc2 (" in kept

    assert deploy_cli([str(model), "--name", "usermlp4r", "--max-rel-error", "none"]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("max rel error"))
    assert float(line.split()[3]) > 0.05 and "report only" in line and "2 linears INT4" in line
    assert "kept fp32" not in out


def test_unmeetable_budget_fails_the_deploy_and_keeps_the_previous_version(
    deploy_cli: Any, redis_url: str, tmp_path: Path, capsys: Any
) -> None:
    import redis

    assert deploy_cli([str(_onnx(tmp_path / "v1.onnx", seed=1, embed=True)), "--name", "emb"]) == 0
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    v1 = r.hget(keys.model_key("emb"), "artifact")
    capsys.readouterr()
    model = _onnx(tmp_path / "v2.onnx", seed=2, embed=True)
    assert deploy_cli([str(model), "--name", "emb", "--max-rel-error", "1e-7"]) == 1
    out = capsys.readouterr().out
    assert "compile failed at accuracy: error budget not met: max relative error" in out
    assert "> --max-rel-error 1e-07 with all 2 INT4 linears kept fp32" in out
    assert "fc1:" in out and "fc2:" in out  # the per-linear sensitivities
    assert r.hget(keys.model_key("emb"), "artifact") == v1


def test_max_rel_error_flag() -> None:
    from anvil_client import deploy
    from anvil_compiler.options import CompileOptions

    parser = argparse.ArgumentParser()
    deploy.add_deploy_commands(parser.add_subparsers())

    def opts(*extra: str) -> CompileOptions:
        return CompileOptions.from_dict(
            deploy._options(parser.parse_args(["deploy", "m", "--name", "m", *extra]))
        )

    assert opts().max_rel_error == CompileOptions().max_rel_error == 0.05
    assert opts("--max-rel-error", "0.2").max_rel_error == 0.2
    assert opts("--max-rel-error", "none").max_rel_error is None
    for bad in ("0", "-1", "x", "inf"):
        with pytest.raises(SystemExit):
            parser.parse_args(["deploy", "m", "--name", "m", "--max-rel-error", bad])


def test_deploy_uploads_calibration_data_for_the_report(deploy_cli: Any, tmp_path: Path, capsys: Any) -> None:
    import numpy as np

    model = _onnx(tmp_path / "usermlp.onnx", seed=0)
    calib = tmp_path / "inputs.npz"
    np.savez(calib, x=np.random.default_rng(3).random((40, 64)).astype(np.float32))
    argv = [str(model), "--name", "cal", "--calibration-data", str(calib), "--max-rel-error", "none"]
    assert deploy_cli(argv) == 0
    out = capsys.readouterr().out
    assert "on the calibration data uploaded with the model (40 rows):" in out
    np.savez(calib, y=np.zeros((4, 64), np.float32))
    assert deploy_cli([str(model), "--name", "cal2", "--calibration-data", str(calib)]) == 1
    assert (
        "compile failed at accuracy: calibration data: no array for graph input(s) ['x']"
        in capsys.readouterr().out
    )


def test_deploy_says_how_a_gpu_runs_the_plan() -> None:
    from anvil_client import deploy

    stats = {"gpu_precision": "fp16", "gpu_linear_backends": {"w4a16": 4, "cublas_f16": 2}}
    assert deploy.format_gpu(stats) == "on a GPU: fp16 activations; linears: 2 cublas_f16, 4 w4a16"
    stats["w4a16_module"] = "not built: nvcc not on PATH"
    assert deploy.format_gpu(stats).endswith("(W4A16 kernels not built: nvcc not on PATH)")
    assert deploy.format_gpu({"kernels": 3}) == ""
